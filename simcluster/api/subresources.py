"""The `scale`, `eviction` and `binding` subresources."""
from __future__ import annotations

from werkzeug.wrappers import Request, Response

from .. import errors
from ..clock import rfc3339
from ..controllers.disruption import budget, pdb_selector
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


def scale_update(sim: Simulation, route: Route, scale: dict, *, dry_run: bool) -> dict:
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
        stored = sim.store.update(route.rtype, new, preserve_status=True, dry_run=dry_run)
    return scale_of(route.rtype, stored)


# ---- eviction (policy/v1 Eviction) -----------------------------------------------------
def pdb_allowance(sim: Simulation, pdb: dict) -> tuple[int, int, int]:
    """(disruptionsAllowed, desiredHealthy, currentHealthy) from the PDB's status when
    its controller has written one, computed from the pods otherwise."""
    status = pdb.get("status") or {}
    if "disruptionsAllowed" in status:
        return status["disruptionsAllowed"], status.get("desiredHealthy", 0), status.get("currentHealthy", 0)
    _, healthy, desired, allowed = budget(pdb, sim.store.all(PODS, pdb["metadata"]["namespace"]))
    return allowed, desired, healthy


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
        phase = (pod.get("status") or {}).get("phase")
        # As registry/core/pod/storage/eviction.go: terminal, pending and terminating
        # pods are deleted without asking any budget.
        if phase not in ("Succeeded", "Failed", "Pending") and not pod["metadata"].get("deletionTimestamp"):
            _check_budgets(sim, pod, dry)
        if not dry:
            store.delete(PODS, route.namespace, route.name, grace_seconds=options.get("gracePeriodSeconds"),
                         preconditions=options.get("preconditions"))
    return json_response(_SUCCESS, 201)


def _check_budgets(sim: Simulation, pod: dict, dry: bool) -> None:
    labels = pod["metadata"].get("labels") or {}
    pdbs = [pdb for pdb in sim.store.all(PDBS, pod["metadata"]["namespace"])
            if pdb_selector((pdb.get("spec") or {}).get("selector"))(labels)]
    if len(pdbs) > 1:
        raise errors.internal("This pod has more than one PodDisruptionBudget, which the eviction "
                              "subresource does not support.")
    if not pdbs:
        return
    pdb = pdbs[0]
    allowed, desired, healthy = pdb_allowance(sim, pdb)
    if allowed < 1:
        raise errors.ApiError(429, "TooManyRequests",
                              "Cannot evict pod as it would violate the pod's disruption budget.",
                              details={"causes": [{"reason": "DisruptionBudget",
                                                   "message": f"The disruption budget {pdb['metadata']['name']} "
                                                              f"needs {desired} healthy pods and has {healthy} currently"}]})
    if dry or "disruptionsAllowed" not in (pdb.get("status") or {}):
        return
    # Count the disruption now, as the eviction handler does, so a second eviction
    # before the PDB controller's next pass cannot spend the same allowance.
    new = copy(pdb)
    new["status"]["disruptionsAllowed"] = allowed - 1
    new["status"].setdefault("disruptedPods", {})[pod["metadata"]["name"]] = rfc3339(sim.clock.now())
    sim.store.update(PDBS, new, subresource="status", check_rv=False)


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
