"""The disruption controller, after pkg/controller/disruption: each PodDisruptionBudget's
status (expected, healthy and desired pods, disruptions allowed) from the pods it
selects. The eviction subresource reads that status to say yes or 429.

How many pods are expected follows upstream's getExpectedPodCount: an integer
`minAvailable` expects the pods the budget selects; `maxUnavailable` and a percentage
`minAvailable` expect the sum of the scales of the pods' controllers (a Deployment's
replicas for its ReplicaSets' pods, else the ReplicaSet's or StatefulSet's own), each
controller counted once. A selected pod with no controller adds nothing there, so an
orphan still Ready is healthy beyond what is expected. A pod whose controller cannot be
found, or has no scale (a DaemonSet), fails the sync as upstream's does: the budget
then allows no disruption, with condition reason SyncFailed naming why.
"""
from __future__ import annotations

from datetime import timedelta

from ..clock import parse_time
from ..resources import DAEMONSETS, DEPLOYMENTS, PDBS, PODS, REPLICASETS, STATEFULSETS
from ..selectors import selector_from_match_labels
from ._util import by_namespace, controller_ref, int_or_percent, is_deleting, pod_ready, set_condition, write_status

# Eviction records a pod in status.disruptedPods; the controller forgets an entry
# the pod never acted on after this long (DeletionTimeout in disruption.go).
DELETION_TIMEOUT = timedelta(minutes=2)


def pdb_selector(selector: dict | None):
    """policy/v1: an empty selector selects every pod of the namespace, a null one none."""
    if selector is None:
        return lambda labels: False
    return selector_from_match_labels(selector)


class ExpectedCountError(Exception):
    """The expected pods could not be counted (upstream's sync error)."""


def _owner(store, kind_resource, namespace: str, ref: dict) -> dict | None:
    found = store.get(kind_resource, namespace, ref.get("name", ""))
    if found is None or found["metadata"].get("uid") != ref.get("uid"):
        return None
    return found


def _controller_scale(store, namespace: str, ref: dict) -> tuple[str, int] | None:
    """(uid, scale) of a pod's controller as upstream's finders find it, or None."""
    group = ref.get("apiVersion", "").split("/")[0] if "/" in ref.get("apiVersion", "") else ""
    kind = ref.get("kind")
    if kind == "ReplicaSet" and group in ("apps", "extensions"):
        rs = _owner(store, REPLICASETS, namespace, ref)
        if rs is None:
            return None
        rs_owner = controller_ref(rs)
        if rs_owner is not None and rs_owner.get("kind") == "Deployment":
            deployment = _owner(store, DEPLOYMENTS, namespace, rs_owner)
            if deployment is None:
                return None
            return deployment["metadata"]["uid"], int((deployment.get("spec") or {}).get("replicas", 1))
        return rs["metadata"]["uid"], int((rs.get("spec") or {}).get("replicas", 1))
    if kind == "StatefulSet" and group == "apps":
        sts = _owner(store, STATEFULSETS, namespace, ref)
        return None if sts is None else (sts["metadata"]["uid"], int((sts.get("spec") or {}).get("replicas", 1)))
    if kind == "DaemonSet" and group == "apps":
        # getScaleController: the scale GET answers NotFound, and daemonsets serve no scale.
        raise ExpectedCountError(f"{DAEMONSETS.plural}.apps does not implement the scale subresource")
    return None


def expected_scale(store, namespace: str, pods: list[dict]) -> tuple[int, list[str]]:
    """getExpectedScale: the sum of the scales of the selected pods' controllers, each
    once, and the names of the pods with no controller."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        ref = controller_ref(pod)
        if ref is None:
            unmanaged.append(pod["metadata"]["name"])
            continue
        if ref.get("uid") in scales:
            continue
        found = _controller_scale(store, namespace, ref)
        if found is None:
            raise ExpectedCountError(f"found no controllers for pod {pod['metadata']['name']!r}")
        scales[found[0]] = found[1]
    return sum(scales.values()), unmanaged


def budget(pdb: dict, pods: list[dict], store=None) -> tuple[int, int, int, int]:
    """(expected, currentHealthy, desiredHealthy, disruptionsAllowed) of `pdb` over the
    namespace's `pods`. Percentages round up, as upstream does; a pod being deleted or not
    Ready is not healthy; nothing is allowed while no pod is expected. Raises
    ExpectedCountError where upstream's sync fails."""
    spec = pdb.get("spec") or {}
    match = pdb_selector(spec.get("selector"))
    selected = [p for p in pods if match(p["metadata"].get("labels") or {})]
    disrupted = set(((pdb.get("status") or {}).get("disruptedPods") or {}).keys())
    healthy = sum(1 for p in selected if pod_ready(p) and not is_deleting(p)
                  and p["metadata"]["name"] not in disrupted)
    namespace = pdb["metadata"].get("namespace", "")
    min_available = spec.get("minAvailable")
    if spec.get("maxUnavailable") is not None:
        expected, _ = expected_scale(store, namespace, selected) if store is not None else (len(selected), [])
        desired = max(0, expected - int_or_percent(spec["maxUnavailable"], expected, round_up=True, default=0))
    elif isinstance(min_available, str):
        expected, _ = expected_scale(store, namespace, selected) if store is not None else (len(selected), [])
        desired = int_or_percent(min_available, expected, round_up=True, default=0)
    elif min_available is not None:
        expected = len(selected)
        desired = int_or_percent(min_available, expected, round_up=True, default=0)
    else:
        expected = desired = 0   # neither field: upstream counts nothing, so allows nothing
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    return expected, healthy, desired, allowed


class DisruptionController:
    name = "disruption"

    def reconcile(self, sim) -> None:
        store = sim.store
        pdbs = store.all(PDBS)
        if not pdbs:
            return
        now = sim.clock.now()
        pods_by_ns = by_namespace(store.all(PODS))
        for pdb in pdbs:
            pods = pods_by_ns.get(pdb["metadata"]["namespace"], [])
            old = pdb.get("status") or {}
            existing = {p["metadata"]["name"] for p in pods if not is_deleting(p)}
            disrupted = {}
            for name, stamp in (old.get("disruptedPods") or {}).items():
                since = parse_time(stamp)
                if name in existing and since is not None and since + DELETION_TIMEOUT > now:
                    disrupted[name] = stamp
                    sim.wake_at(since + DELETION_TIMEOUT)
            view = dict(pdb, status={**old, "disruptedPods": disrupted})
            try:
                expected, healthy, desired, allowed = budget(view, pods, store)
            except ExpectedCountError as exc:
                # failSafe: the old status stays, with no disruption allowed and why.
                conditions = set_condition(old.get("conditions"), "DisruptionAllowed", "False", now,
                                           reason="SyncFailed", message=str(exc))
                for cond in conditions:
                    if cond.get("type") == "DisruptionAllowed":
                        cond["message"] = str(exc)
                        cond["observedGeneration"] = old.get("observedGeneration", 0)
                write_status(store, PDBS, pdb, {**old, "disruptionsAllowed": 0, "conditions": conditions})
                continue
            conditions = set_condition(
                old.get("conditions"), "DisruptionAllowed", "True" if allowed > 0 else "False", now,
                reason="SufficientPods" if allowed > 0 else "InsufficientPods")
            for cond in conditions:
                if cond.get("type") == "DisruptionAllowed":
                    # metav1.Condition: `message` is required (no omitempty), so the API server
                    # serves "" (UpdateDisruptionAllowedCondition sets none); clients that validate
                    # the schema (kubernetes-client V1Condition) reject a condition without it.
                    cond["message"] = ""
                    cond["observedGeneration"] = pdb["metadata"].get("generation", 1)
            status = {
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "expectedPods": expected, "currentHealthy": healthy, "desiredHealthy": desired,
                "disruptionsAllowed": allowed,
                "conditions": conditions,
            }
            if disrupted:
                status["disruptedPods"] = disrupted
            write_status(store, PDBS, pdb, status)
