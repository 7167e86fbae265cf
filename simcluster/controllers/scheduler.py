"""The scheduler: binds Pending pods to nodes, filtering and scoring like kube-scheduler.

Filters, in the default plugin order (a node fails on the first that rejects it, and
the pod's message counts each node under that reason): NodeUnschedulable,
TaintToleration (the node-lifecycle taints of a not-Ready node included), NodeAffinity
(nodeSelector and required node affinity), NodeResourcesFit (cpu, memory, pods and
extended resources such as nvidia.com/gpu). Score: least-allocated ("spread") or
most-allocated (bin-packing) over cpu, memory and the extended resources the pod asks
for; ties go to the lexically first node, so placement is deterministic.

Pods that name `bin-packing-scheduler` (BIN_PACKING_SCHEDULER) are scored most-allocated
whatever the cluster's placement: the second profile a GPU platform runs beside the
default one, as the real tier's kube-scheduler does (realcluster/cluster.py).

Nodes are grouped by what the non-resource filters look at (labels, taints,
unschedulable, readiness), so those filters run once per group and pod shape rather than
once per node and pod.
"""
from __future__ import annotations

from collections import Counter

import orjson

from ..resources import NODES, PODS
from ..store import copy
from ._util import TERMINAL_PHASES, condition, is_deleting, parse_quantity, pod_requests, record_event, set_condition

SCHEDULER_NAME = "default-scheduler"
BIN_PACKING_SCHEDULER = "bin-packing-scheduler"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
SCORED = ("cpu", "memory")


def node_ready(node: dict) -> bool:
    """A node without any Ready condition counts as Ready: hand-written scenarios often
    leave node status out, and nothing else in the simulation would make it Ready."""
    cond = condition(node, "Ready")
    return cond is None or cond.get("status") == "True"


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """v1helper.TolerationsTolerateTaint."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        op = tol.get("operator") or "Equal"
        if not tol.get("key"):
            if op == "Exists":
                return True
            continue
        if tol["key"] != taint.get("key"):
            continue
        if op == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expr: dict, values_of) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    present, value = values_of(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        try:
            actual, bound = int(value), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False
        return actual > bound if op == "Gt" else actual < bound
    return False


def node_affinity_matches(pod_spec: dict, node: dict) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution (terms ORed,
    expressions and fields ANDed within a term)."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True

    def label_of(key):
        return key in labels, labels.get(key)

    def field_of(key):
        if key == "metadata.name":
            return True, node["metadata"]["name"]
        return False, None

    for term in terms:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue   # an empty term matches nothing
        if all(_expression_matches(e, label_of) for e in exprs) and \
                all(_expression_matches(f, field_of) for f in fields):
            return True
    return False


def _node_taints(node: dict) -> list[dict]:
    taints = [t for t in (node.get("spec") or {}).get("taints") or ()
              if t.get("effect") in ("NoSchedule", "NoExecute")]
    if not node_ready(node):
        taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
    return taints


def static_reason(pod_spec: dict, node: dict) -> str | None:
    """The first non-resource filter that rejects `node` for the pod, as kube-scheduler
    words it, or None when the node passes them all."""
    tolerations = pod_spec.get("tolerations") or []
    if (node.get("spec") or {}).get("unschedulable") and \
            not tolerates(tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return "node(s) were unschedulable"
    for taint in _node_taints(node):
        if not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    if not node_affinity_matches(pod_spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


class _NodeState:
    __slots__ = ("name", "node", "allocatable", "used", "pods")

    def __init__(self, node: dict, pods: list[dict]):
        self.node = node
        self.name = node["metadata"]["name"]
        allocatable = (node.get("status") or {}).get("allocatable") or \
            (node.get("status") or {}).get("capacity") or {}
        self.allocatable = {k: parse_quantity(v) for k, v in allocatable.items()}
        self.used: dict[str, float] = {}
        self.pods = 0
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            self.add(pod_requests(pod))

    def add(self, requests: dict[str, float]) -> None:
        self.pods += 1
        for name, amount in requests.items():
            self.used[name] = self.used.get(name, 0.0) + amount

    def insufficient(self, requests: dict[str, float]) -> list[str]:
        reasons = []
        if self.pods + 1 > self.allocatable.get("pods", 110):
            reasons.append("Too many pods")
        for name, amount in requests.items():
            if amount <= 0:
                continue
            if self.used.get(name, 0.0) + amount > self.allocatable.get(name, 0.0) + 1e-9:
                reasons.append(f"Insufficient {name}")
        return reasons

    def score(self, requests: dict[str, float], policy: str) -> float:
        resources = list(SCORED) + sorted(r for r in requests if r not in SCORED and requests[r] > 0
                                          and r not in ("pods", "ephemeral-storage"))
        total = 0.0
        for name in resources:
            capacity = self.allocatable.get(name, 0.0)
            if capacity <= 0:
                continue
            fraction = min(1.0, (self.used.get(name, 0.0) + requests.get(name, 0.0)) / capacity)
            total += fraction if policy == "most-allocated" else 1.0 - fraction
        return total / len(resources)


def _static_key(node: dict) -> bytes:
    spec = node.get("spec") or {}
    return orjson.dumps([node["metadata"].get("labels") or {}, spec.get("taints") or [],
                         bool(spec.get("unschedulable")), node_ready(node)], option=orjson.OPT_SORT_KEYS)


def _pod_shape(spec: dict) -> bytes:
    return orjson.dumps([spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
                        option=orjson.OPT_SORT_KEYS)


def pending(pod: dict) -> bool:
    spec = pod.get("spec") or {}
    return not spec.get("nodeName") and not is_deleting(pod) and \
        (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES and \
        (spec.get("schedulerName") or SCHEDULER_NAME) in (SCHEDULER_NAME, BIN_PACKING_SCHEDULER)


def _priority_order(pod: dict):
    meta = pod["metadata"]
    return (-int((pod.get("spec") or {}).get("priority") or 0), meta.get("creationTimestamp") or "",
            meta.get("namespace", ""), meta["name"])


class SchedulerController:
    name = "scheduler"

    def reconcile(self, sim) -> None:
        store = sim.store
        queue = sorted((p for p in store.all(PODS) if pending(p)), key=_priority_order)
        if not queue:
            return
        nodes = sorted(store.all(NODES), key=lambda n: n["metadata"]["name"])
        states = [_NodeState(n, store.pods_on_node(n["metadata"]["name"])) for n in nodes]
        groups: dict[bytes, list[_NodeState]] = {}
        for state in states:
            groups.setdefault(_static_key(state.node), []).append(state)
        static_cache: dict[tuple[bytes, bytes], str | None] = {}
        policy = sim.settings.placement
        if policy not in ("spread", "most-allocated"):
            raise ValueError(f"unknown placement policy {policy!r}: want 'spread' or 'most-allocated'")
        for pod in queue:
            packs = (pod.get("spec") or {}).get("schedulerName") == BIN_PACKING_SCHEDULER
            self._schedule(sim, pod, groups, static_cache, len(states), "most-allocated" if packs else policy)

    def _schedule(self, sim, pod, groups, static_cache, node_count: int, policy: str) -> None:
        spec = pod.get("spec") or {}
        shape = _pod_shape(spec)
        requests = pod_requests(pod)
        reasons: Counter[str] = Counter()
        best, best_score = None, None
        for key, members in groups.items():
            cache_key = (shape, key)
            if cache_key not in static_cache:
                static_cache[cache_key] = static_reason(spec, members[0].node)
            rejected = static_cache[cache_key]
            if rejected:
                reasons[rejected] += len(members)
                continue
            for state in members:
                missing = state.insufficient(requests)
                if missing:
                    reasons.update(missing)
                    continue
                score = state.score(requests, policy)
                if best is None or score > best_score or (score == best_score and state.name < best.name):
                    best, best_score = state, score
        if best is not None:
            best.add(requests)
            self._bind(sim, pod, best.name)
        else:
            self._unschedulable(sim, pod, node_count, reasons)

    @staticmethod
    def _bind(sim, pod: dict, node_name: str) -> None:
        new = copy(pod)
        new["spec"]["nodeName"] = node_name
        status = new.setdefault("status", {})
        status.setdefault("phase", "Pending")
        status["conditions"] = set_condition(status.get("conditions"), "PodScheduled", "True", sim.clock.now())
        bound = sim.store.put(PODS, new)
        meta = pod["metadata"]
        record_event(sim, PODS, bound, "Scheduled",
                     f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}",
                     component=SCHEDULER_NAME)

    @staticmethod
    def _unschedulable(sim, pod: dict, node_count: int, reasons: Counter) -> None:
        parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
        message = f"0/{node_count} nodes are available"
        message += (": " + ", ".join(parts) + ".") if parts else "."
        before = condition(pod, "PodScheduled")
        if before and before.get("status") == "False" and before.get("message") == message:
            return
        new = copy(pod)
        status = new.setdefault("status", {})
        status["phase"] = "Pending"
        status["conditions"] = set_condition(status.get("conditions"), "PodScheduled", "False", sim.clock.now(),
                                             reason="Unschedulable", message=message)
        stored = sim.store.put(PODS, new)
        record_event(sim, PODS, stored, "FailedScheduling", message, type="Warning", component=SCHEDULER_NAME)
