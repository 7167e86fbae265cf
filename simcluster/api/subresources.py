"""The `scale`, `eviction` and `binding` subresources."""
from __future__ import annotations

from werkzeug.wrappers import Request, Response

from .. import errors
from ..clock import rfc3339
from ..fieldmanager import record_scale
from ..controllers._util import pod_ready, set_condition
from ..controllers.disruption import pdb_selector
from ..resources import PDBS, PODS, ResourceType
from ..sim import Simulation
from ..store import copy
from .http import dry_run, json_response, read_object
from .routing import Route

_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


# ---- scale (autoscaling/v1 Scale) ----------------------------------------------------
def selector_string(selector: dict | None) -> str:
    """metav1.LabelSelectorAsSelector(...).String(): requirements sorted by key."""
    selector = selector or {}
    parts = [(k, f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), sorted(expr.get("values") or [])
        text = {"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                "Exists": key, "DoesNotExist": f"!{key}"}.get(op, "")
        parts.append((key, text))
    return ",".join(text for _, text in sorted(parts))


def scale_of(rtype: ResourceType, obj: dict) -> dict:
    meta = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in meta},
        "spec": {"replicas": spec.get("replicas", 1)},
        "status": {"replicas": status.get("replicas", 0), "selector": selector_string(spec.get("selector"))},
    }


def scale_update(sim: Simulation, route: Route, scale: dict, *, dry_run: bool, manager: str | None = None) -> dict:
    if scale.get("kind") not in (None, "Scale"):
        raise errors.bad_request(f"the kind in the data ({scale.get('kind')}) does not match the expected kind (Scale)")
    replicas = (scale.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid("Scale", route.name, [("spec.replicas",
                             f"Invalid value: {replicas}: must be greater than or equal to 0")], "autoscaling")
    with sim.store.lock:
        current = sim.store.require(route.rtype, route.namespace, route.name)
        given_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if given_rv and given_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(route.rtype.plural, route.name, route.rtype.group)
        new = copy(current)
        new.setdefault("spec", {})["replicas"] = replicas
        if manager is not None:
            record_scale(route.rtype, current, new, manager=manager, now=sim.clock.now())
        stored = sim.store.update(route.rtype, new, preserve_status=True, dry_run=dry_run)
    return scale_of(route.rtype, stored)


# ---- eviction (policy/v1 Eviction) -----------------------------------------------------
# pkg/registry/core/pod/storage/eviction.go (Kubernetes 1.32): the eviction handler's
# decisions, in its order. It reads the PDB's status as the disruption controller last
# wrote it; it never computes a budget from the pods itself.
MAX_DISRUPTED_POD_SIZE = 2000   # MaxDisruptedPodSize: unconfirmed evictions a PDB may hold
ALWAYS_ALLOW = "AlwaysAllow"    # spec.unhealthyPodEvictionPolicy (GA in 1.31); default IfHealthyBudget


def _can_ignore_pdb(pod: dict) -> bool:
    """canIgnorePDB: terminal, Pending and terminating pods are deleted without asking
    any budget (a Pending pod disrupts nothing that is serving)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def _too_many_requests(cause: str, retry_after: int = 0) -> errors.ApiError:
    details: dict = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    headers = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return errors.ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           details=details, headers=headers)


def _forbidden(pdb: dict, why: str) -> errors.ApiError:
    name = pdb["metadata"]["name"]
    return errors.ApiError(403, "Forbidden", f'poddisruptionbudgets.policy "{name}" is forbidden: {why}',
                           details={"name": name, "group": "policy", "kind": "poddisruptionbudgets"})


def evict(sim: Simulation, route: Route, request: Request) -> Response:
    body = read_object(request, "Eviction body")
    if body.get("kind") not in (None, "Eviction"):
        raise errors.bad_request(f"the kind in the data ({body.get('kind')}) does not match the expected kind (Eviction)")
    name = (body.get("metadata") or {}).get("name")
    if name and name != route.name:
        raise errors.bad_request(f"name in URL does not match name in Eviction object ({route.name} != {name})")
    options = body.get("deleteOptions") or {}
    dry = dry_run(request) or options.get("dryRun") == ["All"]
    store = sim.store
    with store.lock:
        pod = store.require(PODS, route.namespace, route.name)
        if not _can_ignore_pdb(pod):
            _check_budgets(sim, pod, dry)
        if not dry:
            _delete_evicted(sim, pod, options)
    return json_response(_SUCCESS, 201)


def _check_budgets(sim: Simulation, pod: dict, dry: bool) -> None:
    """Raise unless the pod's budget lets it go; spend one disruption when it must."""
    labels = pod["metadata"].get("labels") or {}
    pdbs = [pdb for pdb in sim.store.all(PDBS, pod["metadata"]["namespace"])
            if pdb_selector((pdb.get("spec") or {}).get("selector"))(labels)]
    if len(pdbs) > 1:
        raise errors.internal("This pod has more than one PodDisruptionBudget, which the eviction "
                              "subresource does not support.")
    if not pdbs:
        return
    pdb = pdbs[0]
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    if not pod_ready(pod):
        # A Running pod that is not Ready counts for no healthy pod: letting it go takes
        # nothing from the budget, so no disruption is spent on it.
        if spec.get("unhealthyPodEvictionPolicy") == ALWAYS_ALLOW:
            return
        desired, healthy = status.get("desiredHealthy", 0), status.get("currentHealthy", 0)
        if healthy >= desired > 0:   # IfHealthyBudget: only while the guarded app is whole
            return
    _check_and_decrement(sim, pod, pdb, dry)


def _check_and_decrement(sim: Simulation, pod: dict, pdb: dict, dry: bool) -> None:
    name, status = pdb["metadata"]["name"], pdb.get("status") or {}
    # A budget the disruption controller has not yet computed for its current spec
    # (no status at all counts as generation 0) says "come back later".
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise _too_many_requests(f"The disruption budget {name} is still being processed by the server.", 10)
    allowed = status.get("disruptionsAllowed", 0)
    if allowed < 0:
        raise _forbidden(pdb, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_POD_SIZE:
        raise _forbidden(pdb, "DisruptedPods map too big - too many evictions not confirmed by PDB controller")
    if allowed == 0:
        raise _too_many_requests(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy "
                                 f"pods and has {status.get('currentHealthy', 0)} currently")
    if dry:
        return
    # Count the disruption now, so a second eviction before the controller's next pass
    # cannot spend the same allowance; the controller drops the entry once the pod is gone.
    now = sim.clock.now()
    new = copy(pdb)
    new["status"]["disruptionsAllowed"] = allowed - 1
    if allowed - 1 == 0:
        conditions = set_condition(new["status"].get("conditions"), "DisruptionAllowed", "False", now,
                                   reason="InsufficientPods")
        for cond in conditions:   # metav1.Condition's message is required: served as ""
            cond.setdefault("message", "")
        new["status"]["conditions"] = conditions
    new["status"].setdefault("disruptedPods", {})[pod["metadata"]["name"]] = rfc3339(now)
    sim.store.update(PDBS, new, subresource="status", check_rv=False)


def _delete_evicted(sim: Simulation, pod: dict, options: dict) -> None:
    """addConditionAndDeletePod: the caller's preconditions are checked against the pod
    as it is, the pod is marked DisruptionTarget (PodDisruptionConditions, GA in 1.31),
    then deleted."""
    meta, preconditions = pod["metadata"], options.get("preconditions") or {}
    if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
        raise errors.conflict("Pod", meta["name"], "", f"the UID in the precondition ({preconditions['uid']}) does "
                              f"not match the UID in record ({meta['uid']}). The object might have been deleted "
                              "and then recreated")
    if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != meta["resourceVersion"]:
        raise errors.conflict("Pod", meta["name"], "", f"the ResourceVersion in the precondition "
                              f"({preconditions['resourceVersion']}) does not match the ResourceVersion in record "
                              f"({meta['resourceVersion']}). The object might have been modified")
    new = copy(pod)
    status = new.setdefault("status", {})
    status["conditions"] = set_condition(status.get("conditions"), "DisruptionTarget", "True", sim.clock.now(),
                                         reason="EvictionByEvictionAPI", message="Eviction API: evicting")
    sim.store.put(PODS, new)
    sim.store.delete(PODS, meta.get("namespace"), meta["name"], grace_seconds=options.get("gracePeriodSeconds"))


# ---- binding (core/v1 Binding) ---------------------------------------------------------
def bind(sim: Simulation, route: Route, request: Request) -> Response:
    body = read_object(request, "Binding body")
    target = body.get("target") or {}
    node = target.get("name")
    if not node or target.get("kind", "Node") != "Node":
        raise errors.invalid("Binding", route.name, [("target", "Required value: a Node name is required")])
    store = sim.store
    with store.lock:
        pod = store.require(PODS, route.namespace, route.name)
        if pod.get("spec", {}).get("nodeName"):
            raise errors.conflict("pods/binding", route.name, "",
                                  f"pod {route.name} is already assigned to node \"{pod['spec']['nodeName']}\"")
        if dry_run(request):
            return json_response(_SUCCESS, 201)
        new = copy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        conditions = [c for c in new.setdefault("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True",
                           "lastTransitionTime": rfc3339(sim.clock.now())})
        new["status"]["conditions"] = conditions
        store.put(PODS, new)
    return json_response(_SUCCESS, 201)
