"""The disruption controller, after pkg/controller/disruption: each PodDisruptionBudget's
status (expected, healthy and desired pods, disruptions allowed) from the pods it
selects. The eviction subresource reads that status to say yes or 429.
"""
from __future__ import annotations

from datetime import timedelta

from ..clock import parse_time
from ..resources import PDBS, PODS
from ..selectors import selector_from_match_labels
from ._util import by_namespace, int_or_percent, is_deleting, pod_ready, set_condition, write_status

# Eviction records a pod in status.disruptedPods; the controller forgets an entry
# the pod never acted on after this long (DeletionTimeout in disruption.go).
DELETION_TIMEOUT = timedelta(minutes=2)


def pdb_selector(selector: dict | None):
    """policy/v1: an empty selector selects every pod of the namespace, a null one none."""
    if selector is None:
        return lambda labels: False
    return selector_from_match_labels(selector)


def budget(pdb: dict, pods: list[dict]) -> tuple[int, int, int, int]:
    """(expected, currentHealthy, desiredHealthy, disruptionsAllowed) of `pdb` over the
    namespace's `pods`. Percentages round up, as getExpectedScale does; a pod being
    deleted or not Ready is not healthy."""
    spec = pdb.get("spec") or {}
    match = pdb_selector(spec.get("selector"))
    selected = [p for p in pods if match(p["metadata"].get("labels") or {})]
    disrupted = set(((pdb.get("status") or {}).get("disruptedPods") or {}).keys())
    expected = len(selected)
    healthy = sum(1 for p in selected if pod_ready(p) and not is_deleting(p)
                  and p["metadata"]["name"] not in disrupted)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - int_or_percent(spec["maxUnavailable"], expected, round_up=True, default=0))
    else:
        desired = int_or_percent(spec.get("minAvailable", 0), expected, round_up=True, default=0)
    return expected, healthy, desired, max(0, healthy - desired)


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
            expected, healthy, desired, allowed = budget(view, pods)
            conditions = set_condition(
                old.get("conditions"), "DisruptionAllowed", "True" if allowed > 0 else "False", now,
                reason="SufficientPods" if allowed > 0 else "InsufficientPods")
            for cond in conditions:
                if cond.get("type") == "DisruptionAllowed":
                    # metav1.Condition: `message` is required (no omitempty), so the API server
                    # serves "" (UpdateDisruptionAllowedCondition sets none); clients that validate
                    # the schema (kubernetes-client V1Condition) reject a condition without it.
                    cond.setdefault("message", "")
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
