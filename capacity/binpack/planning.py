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
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from clusters.labels import (
    BINPACK_MARKER,
    BINPACK_OPT_OUT,
    DELETION_COST,
    KTHENA_GROUP_LABEL,
    KTHENA_NAME_LABEL,
    SERVING_GROUP_LABEL,
)
from clusters.snapshot import ClusterSnapshot, PodView, gc_paused
FORMULA = "cost = (node shared with other workloads ? 256 : 0) + pods on node (max 255), times 1024, + crc32(node) % 1024"
# What a cost orders, and what it does not: the ReplicaSet controller deletes Pending,
# unready and younger pods before it compares costs (shared/KUBERNETES.md).
COST_ORDER = ("Lower cost is deleted first among a workload's pods once phase and readiness are equal "
              "(a Pending or unready pod goes before any cost); Kthena removes the group with the lowest sum first.")
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


def _when(rank: int, of: int) -> str:
    """1 of 3 → "first", 3 of 3 → "last", 2 of 3 → "2nd"."""
    if rank == 1:
        return "first"
    if rank == of:
        return "last"
    return f"{rank}{'th' if 10 <= rank % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(rank % 10, 'th')}"


@dataclass(frozen=True)
class GroupRank:
    workload: str
    group: str
    cost: int                # the sum of its pods' planned costs, as Kthena sums them
    pods: int
    rank: int                # 0 = removed first on scale-down


@dataclass(frozen=True)
class CostBasis:
    """Why a pod gets its cost: the terms of the formula on its node, and where that node
    falls in its workload's deletion order (what the controller reading the cost does)."""

    node: str
    gpus_used: int           # GPUs the node's live pods requested
    gpus_total: int          # the node's allocatable GPUs
    own: int                 # pods of the pod's workload on the node
    others: int              # pods of other workloads on the node
    cost: int
    rank: int                # 1: its workload's pods on this node are deleted first
    of: int                  # nodes holding the workload's costed pods
    group: GroupRank | None = None   # a grouped pod is removed with its group, by the group's sum
    groups: int = 0                  # groups of its workload

    @property
    def order(self) -> str:
        if self.group is not None:
            g = self.group
            when = ("its workload's only group" if self.groups == 1 else
                    f"removed {_when(g.rank + 1, self.groups)} of its workload's {self.groups} groups")
            return f"its group {g.group} sums {g.cost} over {g.pods} pod{'' if g.pods == 1 else 's'}: {when}"
        if self.of == 1:
            return "its workload's only node"
        return f"deleted {_when(self.rank, self.of)} of its workload's {self.of} nodes"

    def explain(self) -> str:
        pods = self.own + self.others
        counted = f"{_CAP}, capped" if pods > _CAP else str(pods)
        who = (f"{self.own} of its workload, {self.others} of others: shared, +256 as its workload alone cannot "
               "free it" if self.others else "all of its workload, no other workload on it")
        return (f"node {self.node}: {self.gpus_used} of {self.gpus_total} GPUs in use, "
                f"{pods} pod{'' if pods == 1 else 's'} ({who}) "
                f"→ {self.order}; cost = ({256 if self.others else 0} + {counted}) × 1024 + "
                f"{node_tie(self.node)} (node tie-break) = {self.cost}")

    def as_dict(self) -> dict:
        return {"node": self.node, "gpus_used": self.gpus_used, "gpus_total": self.gpus_total, "own": self.own,
                "others": self.others, "cost": self.cost, "rank": self.rank, "of": self.of,
                "group": self.group.group if self.group else None,
                "group_rank": self.group.rank + 1 if self.group else None, "groups": self.groups or None}


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
    reason: str              # why this value (the basis explained), and what it replaces
    basis: CostBasis | None = None   # None when our cost is removed
    resource_version: str = ""       # the pod's version the plan judged ("" when unknown)

    def as_dict(self) -> dict:
        return {"namespace": self.namespace, "pod": self.name, "uid": self.uid, "node": self.node,
                "workload": self.workload, "group": self.group, "old": self.old, "new": self.new,
                "reason": self.reason, "basis": self.basis.as_dict() if self.basis else None}


@dataclass(frozen=True)
class Skipped:
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True)
class BinpackPlan:
    taken_at: datetime
    changes: tuple[CostChange, ...]
    unchanged: int
    skipped: tuple[Skipped, ...]
    groups: tuple[GroupRank, ...]
    over_budget: int = 0     # changes left for the next run because of `max_writes`
    formula: str = FORMULA
    # (namespace, pod) -> why it gets its cost, for every pod costed, changed or not
    bases: Mapping[tuple[str, str], CostBasis] = field(default_factory=dict, repr=False, compare=False)
    # Every pod of the snapshot (the snapshot's own tuple, not a copy): whether a pod asked
    # about was there at all.
    pods: tuple[PodView, ...] = field(default=(), repr=False, compare=False)

    def has_pod(self, namespace: str, name: str) -> bool:
        """Whether the cluster's reading the plan was made from holds this pod (any pod, on
        any node, live or not). A scan: asked of a few pods only (`--explain`)."""
        return any(p.name == name and p.namespace == namespace for p in self.pods)

    @property
    def costs(self) -> dict[tuple[str, str], int]:
        return {(c.namespace, c.name): c.new for c in self.changes if c.new is not None}

    def explain(self, namespace: str, name: str) -> str:
        """Why the pod gets its cost, whether or not this plan changes it."""
        basis = self.bases.get((namespace, name))
        if basis is not None:
            return basis.explain()
        skipped = next((s for s in self.skipped if (s.namespace, s.name) == (namespace, name)), None)
        if skipped is not None:
            return f"no cost of ours: {skipped.reason}"
        removed = next((c for c in self.changes if (c.namespace, c.name) == (namespace, name)), None)
        if removed is not None:
            return removed.reason
        if not self.has_pod(namespace, name):
            return (f"no such pod: {namespace}/{name} is not in the cluster's reading "
                    f"(taken at {self.taken_at:%Y-%m-%d %H:%M:%S %Z})")
        return "no cost of ours: not among the live pods with a controller on GPU nodes"

    def describe(self) -> list[str]:
        """One line per change with its reason (a new cost's reason names its node), then the totals."""
        lines = [f"{c.namespace}/{c.name}: {c.old or '-'} -> {c.new} ({c.reason})" if c.new is not None else
                 f"{c.namespace}/{c.name} on {c.node}: {c.old or '-'} -> (removed) ({c.reason})"
                 for c in self.changes]
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


def pod_opts_out(pod: PodView) -> bool:
    """`capacity.io/binpack: "false"` on the pod itself (an annotation, else a label)."""
    return str(pod.annotations.get(BINPACK_OPT_OUT, pod.labels.get(BINPACK_OPT_OUT, ""))).lower() == "false"


def workload_of(pod: PodView) -> str | None:
    """The set of pods one controller compares costs within (None: no controller reads its cost)."""
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
    # A plan allocates a few objects per pod (records, bases, reasons), enough to set off
    # the cyclic garbage collector's full passes, and each walks the whole snapshot (what
    # that costs at 50,000 pods: README, "Tests and benchmarks"). The plan holds no cycles.
    with gc_paused():
        return _plan(snapshot, options or BinpackOptions())


def _plan(snapshot: ClusterSnapshot, options: BinpackOptions) -> BinpackPlan:
    gpu_nodes = sorted(n.name for n in snapshot.nodes if n.gpus_allocatable > 0)

    # One pass over the pods in snapshot order reads what planning needs of each (its
    # workload, group, opt-out and the annotations it carries) into a small record per
    # node, in the order `pods_on` gives. At fleet size (50,000 pods) visiting the pods
    # node by node instead touched them in random memory order, several times each, and
    # planning grew twice as fast as the cluster.
    on_gpu = set(gpu_nodes)
    pods_by_node: dict[str, list[tuple]] = {name: [] for name in on_gpu}
    gpus_used: dict[str, int] = dict.fromkeys(on_gpu, 0)
    opted_out_owners = options.opted_out_owners
    for pod in snapshot.pods:
        node_name = pod.node_name
        if node_name not in on_gpu or not pod.live:
            continue
        gpus_used[node_name] += pod.gpus       # what `snapshot.gpus_requested` counts: every live pod
        controller = pod.controller
        if controller is not None and controller.kind in _SKIP_OWNER_KINDS:
            continue
        workload = workload_of(pod)
        if workload is None:
            pods_by_node[node_name].append((pod, None, None, False, None, None))
            continue
        annotations = pod.annotations
        out = pod_opts_out(pod) or (bool(opted_out_owners) and any(o.uid in opted_out_owners for o in pod.owners))
        pods_by_node[node_name].append((pod, workload, _group(pod, options), out,
                                        annotations.get(DELETION_COST), annotations.get(BINPACK_MARKER)))

    # Then the cost each workload's pods will carry on each node (ours, or a hand-set one
    # that stays) and each group's sum: the controller deletes from the cheapest node (or
    # group) first, and each pod's basis says where its own falls.
    per_node = []
    workload_costs: dict[str, dict[str, int]] = defaultdict(dict)
    group_sums: dict[tuple[str, str], list[int]] = defaultdict(list)
    for node_name in gpu_nodes:
        pods = pods_by_node[node_name]
        count = len(pods)
        per_workload: dict[str | None, int] = defaultdict(int)
        for record in pods:
            per_workload[record[1]] += 1
        tie = node_tie(node_name)
        ours = {w: ((256 if count - n else 0) + min(count, _CAP)) * 1024 + tie
                for w, n in per_workload.items() if w is not None}
        records = []
        for record in pods:
            _pod, workload, group, out, current, marker = record
            if workload is None:
                continue      # no controller reads its cost
            records.append(record)
            if out:
                continue
            hand = current if current is not None and marker != current else None
            value = ours[workload] if hand is None or options.override_manual else parse_cost(hand) or 0
            costs = workload_costs[workload]
            known = costs.get(node_name)
            costs[node_name] = value if known is None else min(known, value)
            if group:     # Kthena sums a hand-set cost with ours (an invalid value counts as 0)
                group_sums[(workload, group)].append(value)
        per_node.append((node_name, count, per_workload, ours, records))
    ordered = {w: sorted(costs.values()) for w, costs in workload_costs.items()}
    ranks = _rank_groups(group_sums)
    group_rank = {(g.workload, g.group): g for g in ranks}
    groups_of: dict[str, int] = defaultdict(int)
    for g in ranks:
        groups_of[g.workload] += 1

    # Then whether each pod's cost changes, and why it is what it is (one basis per
    # workload, node and group, shared by its pods there). Reasons are written out only
    # for the changes a run may make (`max_writes`).
    pending: list[tuple[PodView, str, str | None, str | None, int | None, CostBasis | None, str]] = []
    skipped: list[Skipped] = []
    unchanged = 0
    bases: dict[tuple[str, str], CostBasis] = {}
    for node_name, count, per_workload, ours, records in per_node:
        node = snapshot.node(node_name)
        used = gpus_used[node_name]
        shared: dict[tuple[str, str | None], CostBasis] = {}
        for pod, workload, group, out, current, marker in records:
            is_ours = marker is not None and marker == current
            manual = current is not None and not is_ours
            if out:
                if is_ours or (marker is not None and current is None):
                    pending.append((pod, workload, group, None, None, None, "workload opted out: removing our cost"))
                else:
                    skipped.append(Skipped(pod.namespace, pod.name, "workload opted out"))
                continue
            if manual and not options.override_manual:
                skipped.append(Skipped(pod.namespace, pod.name, f"cost {current!r} set by hand"))
                continue
            basis = shared.get((workload, group))
            if basis is None:
                own = per_workload[workload]
                basis = shared[(workload, group)] = CostBasis(
                    node=node_name, gpus_used=used, gpus_total=node.gpus_allocatable if node else 0, own=own,
                    others=count - own, cost=ours[workload],
                    rank=bisect_left(ordered[workload], workload_costs[workload][node_name]) + 1,
                    of=len(ordered[workload]), group=group_rank.get((workload, group)),
                    groups=groups_of[workload])
            bases[(pod.namespace, pod.name)] = basis
            cost = basis.cost
            if current == str(cost) and marker == current:
                unchanged += 1
                continue
            note = ""
            if manual:
                note = f"; overriding hand-set cost {current!r}"
            elif current is not None and parse_cost(current) is None:
                note = f"; replacing invalid cost {current!r}"
            pending.append((pod, workload, group, current, cost, basis, note))

    changes = tuple(
        CostChange(namespace=pod.namespace, name=pod.name, uid=pod.uid, node=pod.node_name or "", workload=workload,
                   group=group, old=old, new=new, basis=basis, resource_version=pod.resource_version,
                   reason=basis.explain() + note if basis is not None else note)
        for pod, workload, group, old, new, basis, note in pending[:options.max_writes])
    return BinpackPlan(taken_at=snapshot.taken_at, changes=changes, unchanged=unchanged, skipped=tuple(skipped),
                       groups=ranks, over_budget=max(0, len(pending) - options.max_writes),
                       bases=MappingProxyType(bases), pods=snapshot.pods)


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
