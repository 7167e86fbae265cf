"""Binpack deletion costs: which `controller.kubernetes.io/pod-deletion-cost` every
model pod on a GPU node should carry so that scale-down frees whole GPU nodes.

Pure: takes a `ClusterSnapshot` and returns a `BinpackPlan`; no ORM, no HTTP.

Who reads the cost. The ReplicaSet controller compares the costs of its own pods
(lower goes first, after phase and readiness; `shared/KUBERNETES.md`); Kthena compares
ServingGroups (and a Role's replicas) of one ModelServing by the SUM of their pods'
costs. So a cost only has to order the pods of one workload, and it may depend on the
workload.

The cost formula (documented in the plan's `FORMULA` and in the admin):

    cost(pod p of workload W on node n) = (shared(n, W) * 256 + pods(n)) * 1024 + tie(n)

- shared(n, W) is 1 when n also runs pods (not DaemonSet pods, not terminating) that
  do NOT belong to W, else 0. W alone can free a node only when it is not shared, so
  nodes W could free by itself are drained first.
- pods(n): the pods on n (same filter, W's included), capped at 255. Fewer pods = a
  less-used node, closer to empty: drained first. Among the nodes W alone could free,
  the one needing fewer deletions goes first, so a scale-down of W by any k frees as
  many nodes as possible (taking the smallest first maximises how many fit in k; the
  planning tests check it against exhaustive search).
- tie(n) in [0, 1023]: a stable hash of the node name. When nodes score the same, all
  workloads agree on which to drain first, so their deletions land on the same node
  instead of thinning several.
- The largest pod cost is (256 + 255) * 1024 + 1023 = 524,287: a valid int32, and a
  Kthena group of up to 4,000 pods still sums below 2^31.
- When several workloads shrink at once no fixed order is optimal for every
  combination (the "shared" penalty bets that the other workloads on a node stay); on
  the random small clusters of tests/capacity/test_binpack_proof.py this one reaches
  the exhaustive optimum in 14 of 16 cases (16 of 16 when one workload shrinks), and on
  the demo scenario of bench/binpack_plan.py it frees 12 whole nodes where Kthena's
  default order frees 1.

Groups. Pods sharing a value of the group label (configurable, `group_label`) form a
group, and Kthena's pods form one per ServingGroup (`modelserving.volcano.sh/group-name`).
Every pod keeps its own node's cost, so a group's cost is the sum over its pods, exactly
what Kthena computes: a group whose pods sit on emptier nodes sums lower and is removed
first, as a whole. The plan reports each group's sum and its rank within its workload
(a cost set by hand counts in its group's sum as it stands, as Kthena counts it).

Ownership of the annotation. We mark the pods we cost with `BINPACK_MARKER` holding the value
we wrote. A pod whose cost is set without the marker, or differs from it, was set by
someone else (an operator, by hand): it is left alone unless `override_manual`.
Pods of an opted-out workload (`capacity.io/binpack: "false"` on the pod or its
workload) get no cost, and lose ours if they carry it.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from clusters.labels import (
    BINPACK_MARKER,
    BINPACK_OPT_OUT,
    DELETION_COST,
    KTHENA_GROUP_LABEL,
    KTHENA_NAME_LABEL,
    SERVING_GROUP_LABEL,
)
from clusters.snapshot import ClusterSnapshot, PodView
FORMULA = "cost = (node shared with other workloads ? 256 : 0) + pods on node (max 255), times 1024, + crc32(node) % 1024"
_CAP = 255
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_SKIP_OWNER_KINDS = ("DaemonSet", "Node")


def parse_cost(text) -> int | None:
    """A valid deletion cost (base-10 int32, no `+`, no leading zeros), else None."""
    if not isinstance(text, str) or not text:
        return None
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit() or (digits[0] == "0" and len(digits) > 1):
        return None
    value = int(text)
    return value if _INT32[0] <= value <= _INT32[1] else None


def node_tie(name: str) -> int:
    """Stable across runs and processes (unlike `hash()`), 0..1023."""
    return zlib.crc32(name.encode()) % 1024


def pod_cost(*, others: int, own: int, node_name: str) -> int:
    """`others`: pods on the node not of the pod's workload; `own`: of its workload."""
    return ((256 if others else 0) + min(others + own, _CAP)) * 1024 + node_tie(node_name)


@dataclass(frozen=True)
class CostChange:
    namespace: str
    name: str
    uid: str
    node: str
    workload: str
    group: str | None
    old: str | None          # the annotation as it stands ("" when absent)
    new: int | None          # None: remove our annotation (opted out)
    reason: str

    def as_dict(self) -> dict:
        return {"namespace": self.namespace, "pod": self.name, "uid": self.uid, "node": self.node,
                "workload": self.workload, "group": self.group, "old": self.old, "new": self.new,
                "reason": self.reason}


@dataclass(frozen=True)
class Skipped:
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True)
class GroupRank:
    workload: str
    group: str
    cost: int                # the sum of its pods' planned costs, as Kthena sums them
    pods: int
    rank: int                # 0 = removed first on scale-down


@dataclass(frozen=True)
class BinpackPlan:
    taken_at: datetime
    changes: tuple[CostChange, ...]
    unchanged: int
    skipped: tuple[Skipped, ...]
    groups: tuple[GroupRank, ...]
    over_budget: int = 0     # changes left for the next run because of `max_writes`
    formula: str = FORMULA

    @property
    def costs(self) -> dict[tuple[str, str], int]:
        return {(c.namespace, c.name): c.new for c in self.changes if c.new is not None}

    def describe(self) -> list[str]:
        lines = [f"{c.namespace}/{c.name} on {c.node}: {c.old or '-'} -> "
                 f"{'(removed)' if c.new is None else c.new} ({c.reason})" for c in self.changes]
        lines.append(f"{len(self.changes)} to write, {self.unchanged} unchanged, {len(self.skipped)} skipped"
                     + (f", {self.over_budget} left for the next run (budget)" if self.over_budget else ""))
        return lines

    def as_dict(self) -> dict:
        return {"taken_at": self.taken_at.isoformat(), "formula": self.formula,
                "changes": [c.as_dict() for c in self.changes], "unchanged": self.unchanged,
                "skipped": [{"namespace": s.namespace, "pod": s.name, "reason": s.reason} for s in self.skipped],
                "groups": [g.__dict__ for g in self.groups], "over_budget": self.over_budget}


@dataclass(frozen=True)
class BinpackOptions:
    group_label: str = SERVING_GROUP_LABEL
    override_manual: bool = False
    max_writes: int = 10_000
    # Controller owners (uids) whose workload said `capacity.io/binpack: "false"`.
    opted_out_owners: frozenset[str] = field(default_factory=frozenset)


def _opted_out(pod: PodView, options: BinpackOptions) -> bool:
    if str(pod.annotations.get(BINPACK_OPT_OUT, pod.labels.get(BINPACK_OPT_OUT, ""))).lower() == "false":
        return True
    return any(o.uid in options.opted_out_owners for o in pod.owners)


def _workload(pod: PodView) -> str | None:
    """The set of pods one controller compares costs within."""
    if pod.labels.get(KTHENA_NAME_LABEL):
        return f"{pod.namespace}/ModelServing/{pod.labels[KTHENA_NAME_LABEL]}"
    owner = pod.controller
    if owner is None or owner.kind in _SKIP_OWNER_KINDS:
        return None
    return f"{pod.namespace}/{owner.kind}/{owner.name}"


def _group(pod: PodView, options: BinpackOptions) -> str | None:
    if pod.labels.get(KTHENA_GROUP_LABEL):
        return pod.labels[KTHENA_GROUP_LABEL]
    return pod.labels.get(options.group_label) or None


def binpack_plan(snapshot: ClusterSnapshot, *, options: BinpackOptions | None = None) -> BinpackPlan:
    options = options or BinpackOptions()
    gpu_nodes = {n.name for n in snapshot.nodes if n.gpus_allocatable > 0}
    changes: list[CostChange] = []
    skipped: list[Skipped] = []
    unchanged = 0
    group_sums: dict[tuple[str, str], list[int]] = defaultdict(list)

    for node_name in sorted(gpu_nodes):
        pods = [p for p in snapshot.pods_on(node_name)
                if p.live and not (p.controller and p.controller.kind in _SKIP_OWNER_KINDS)]
        workloads = [_workload(p) for p in pods]
        per_workload: dict[str | None, int] = defaultdict(int)
        for w in workloads:
            per_workload[w] += 1
        for pod, workload in zip(pods, workloads):
            if workload is None:
                continue      # no controller reads its cost
            current = pod.annotations.get(DELETION_COST)
            marker = pod.annotations.get(BINPACK_MARKER)
            ours = marker is not None and marker == current
            manual = current is not None and not ours
            if _opted_out(pod, options):
                if ours or (marker is not None and current is None):
                    changes.append(_change(pod, workload, None, None, "workload opted out: removing our cost",
                                           options))
                else:
                    skipped.append(Skipped(pod.namespace, pod.name, "workload opted out"))
                continue
            if manual and not options.override_manual:
                skipped.append(Skipped(pod.namespace, pod.name, f"cost {current!r} set by hand"))
                group = _group(pod, options)
                if group:     # Kthena sums it with ours (an invalid value counts as 0)
                    group_sums[(workload, group)].append(parse_cost(current) or 0)
                continue
            own = per_workload[workload]
            cost = pod_cost(others=len(pods) - own, own=own, node_name=node_name)
            group = _group(pod, options)
            if group:
                group_sums[(workload, group)].append(cost)
            if current == str(cost) and marker == str(cost):
                unchanged += 1
                continue
            reason = f"{len(pods) - own} other pod(s) and {own} of its workload on {node_name}"
            if manual:
                reason += f"; overriding hand-set cost {current!r}"
            elif current is not None and parse_cost(current) is None:
                reason += f"; replacing invalid cost {current!r}"
            changes.append(_change(pod, workload, str(current) if current is not None else None, cost, reason,
                                   options))

    over_budget = max(0, len(changes) - options.max_writes)
    ranks = _rank_groups(group_sums)
    return BinpackPlan(taken_at=snapshot.taken_at, changes=tuple(changes[:options.max_writes]),
                       unchanged=unchanged, skipped=tuple(skipped), groups=ranks, over_budget=over_budget)


def _change(pod: PodView, workload: str, old, new, reason: str, options: BinpackOptions) -> CostChange:
    return CostChange(namespace=pod.namespace, name=pod.name, uid=pod.uid, node=pod.node_name or "",
                      workload=workload, group=_group(pod, options), old=old, new=new, reason=reason)


def _rank_groups(group_sums: dict[tuple[str, str], list[int]]) -> tuple[GroupRank, ...]:
    by_workload: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for (workload, group), costs in group_sums.items():
        by_workload[workload].append((sum(costs), group, len(costs)))
    ranks = []
    for workload in sorted(by_workload):
        # Kthena: lower sum first, then the higher index first (we order names descending).
        ordered = sorted(by_workload[workload], key=lambda t: (t[0], _neg_index(t[1])))
        ranks.extend(GroupRank(workload, group, total, n, rank) for rank, (total, group, n) in enumerate(ordered))
    return tuple(ranks)


def _neg_index(group: str) -> tuple[int, str]:
    tail = group.rpartition("-")[2]
    return (-int(tail), group) if tail.isdigit() else (0, group)
