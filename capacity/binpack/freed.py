"""Which GPU nodes binpack may claim to have freed: the nodes a run marked to be emptied
first, and what a later reading of the cluster shows of them.

Pure: a plan and its snapshot (or a later snapshot and what was recorded) in, values out;
no ORM, no HTTP, no clock.

The rule (the savings page's MECHANISM_BASIS says the same, shorter):

- Marked. A run that writes marks a GPU node to be emptied first when every live pod on
  it asking for GPUs carries a cost of ours after the run (unchanged, or written by it),
  and at least one of them is its workload's first to go: its node ranks first among
  its workload's nodes (its group first among its workload's groups, for a grouped
  workload), and the workload runs on more than one node (or group). A scale-down of that
  workload then deletes its pods there before any other, which is what binpack is for.
  A dry run, a run whose process stopped mid-write, and a node holding a pod binpack does
  not cost (opted out, set by hand, no controller) mark nothing.
- Freed. A marked node is freed by binpack from the first reading, within
  `MARK_HORIZON` of its latest mark, that shows it with no live pod asking for GPUs, or
  not in the cluster at all (removed by the cluster autoscaler, say), as long as every
  workload that held it when marked still runs pods (elsewhere): a scale-down chose
  which of their pods to delete, and the costs chose this node. A node emptied because
  all of a workload's pods went (its org went dormant, the pruner scaled its owner to
  zero, the owner deleted or rolled it out) would have emptied in any order: not counted.
- Until. It stays freed while readings show it so, and ends at the last reading that
  did when one shows it holding a GPU pod again, or shows a workload that held it gone
  to zero pods (from then on its freedom belongs to whatever took that workload to zero).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from clusters.labels import BINPACK_MARKER, DELETION_COST, GPU_PRODUCT_LABEL
from clusters.snapshot import ClusterSnapshot, PodView

from capacity.binpack.planning import BinpackPlan, CostBasis, workload_of

# How long after its latest mark a node first seen free is still binpack's, in seconds
# (3,600: one hour; the beat marks every 300 s and checks every 120 s, so a node emptied
# through its costs is seen free well within it). A node a stopped schedule marked long
# ago is ranked by what the cluster was then, not by what emptied it now.
MARK_HORIZON = timedelta(hours=1)


@dataclass(frozen=True)
class NodeMarked:
    """A GPU node a run marked to be emptied first, as the run saw it."""

    node: str
    gpus: int                      # allocatable GPUs
    gpu_model: str                 # its label nvidia.com/gpu.product ("" when unlabelled)
    workloads: tuple[str, ...]     # the workloads of its GPU pods, as `workload_of` names them
    why: str                       # which workload's first node it is

    def as_dict(self) -> dict:
        return {"node": self.node, "gpus": self.gpus, "gpu_model": self.gpu_model,
                "workloads": list(self.workloads), "why": self.why}


def _asks_gpus(pod: PodView) -> bool:
    return bool(pod.node_name) and pod.live and pod.asks_nvidia


def _first_to_go(basis: CostBasis) -> bool:
    if basis.group is not None:
        return basis.group.rank == 0 and basis.groups > 1
    return basis.rank == 1 and basis.of > 1


def nodes_to_empty_first(plan: BinpackPlan, snapshot: ClusterSnapshot, *,
                         written: Collection[tuple[str, str]]) -> tuple[NodeMarked, ...]:
    """The nodes `plan` marks to be emptied first, given which of its changes were
    `written` ((namespace, pod)): a pod carries its cost after the run when the snapshot
    showed it carrying it already (ours, unchanged) or its change was written."""
    marked = []
    for node in snapshot.nodes:
        if node.gpus_allocatable <= 0:
            continue
        pods = [p for p in snapshot.pods_on(node.name) if _asks_gpus(p)]
        if not pods:
            continue
        firsts, workloads = [], set()
        for pod in pods:
            basis = plan.bases.get((pod.namespace, pod.name))
            if basis is None or not _carries(pod, basis, written):
                break
            workloads.add(workload_of(pod) or "")
            if _first_to_go(basis):
                firsts.append(workload_of(pod) or "")
        else:
            if firsts:
                first = sorted(set(firsts))
                marked.append(NodeMarked(node=node.name, gpus=node.gpus_allocatable,
                                         gpu_model=node.labels.get(GPU_PRODUCT_LABEL, ""),
                                         workloads=tuple(sorted(workloads)),
                                         why="first node to empty of " + ", ".join(first)))
    return tuple(marked)


def _carries(pod: PodView, basis: CostBasis, written: Collection[tuple[str, str]]) -> bool:
    if (pod.namespace, pod.name) in written:
        return True
    current = pod.annotations.get(DELETION_COST)
    return current == str(basis.cost) and pod.annotations.get(BINPACK_MARKER) == current


@dataclass(frozen=True)
class Mark:
    """A node's latest mark by a run that wrote, with no freed record from that run yet."""

    run_id: int
    marked_at: datetime
    node: str
    gpus: int
    gpu_model: str
    workloads: tuple[str, ...]


@dataclass(frozen=True)
class OpenFree:
    """A freed record not ended yet."""

    id: int
    node: str
    workloads: tuple[str, ...]
    last_seen_free_at: datetime
    removed: bool


@dataclass(frozen=True)
class FreedStart:
    mark: Mark
    removed: bool                  # not in the cluster (else present, with no GPU pod)


@dataclass(frozen=True)
class FreedSeen:
    id: int
    removed: bool                  # first seen gone from the cluster in this reading


@dataclass(frozen=True)
class FreedEnd:
    id: int
    at: datetime                   # the last reading that showed it free
    reason: str


@dataclass(frozen=True)
class FreedCheck:
    """What one reading of the cluster says of the marked nodes: records to start, to
    extend (seen free again) and to end."""

    taken_at: datetime
    start: tuple[FreedStart, ...]
    seen: tuple[FreedSeen, ...]
    end: tuple[FreedEnd, ...]
    waiting: int                   # marks not free yet (or emptied by a workload gone to zero)

    @property
    def changes(self) -> int:
        return len(self.start) + len(self.end)


def freed_check(snapshot: ClusterSnapshot, *, marks: Iterable[Mark], open_: Iterable[OpenFree]) -> FreedCheck:
    """Judge `marks` (each node's latest, within MARK_HORIZON of the reading) and the open
    records against one reading of the cluster."""
    at = snapshot.taken_at
    busy: dict[str, int] = defaultdict(int)
    running: set[str] = set()
    for pod in snapshot.pods:
        if _asks_gpus(pod):
            busy[pod.node_name] += 1
        if pod.live:
            workload = workload_of(pod)
            if workload:
                running.add(workload)

    def gone(workloads: tuple[str, ...]) -> list[str]:
        return [w for w in workloads if w and w not in running]

    start, seen, end = [], [], []
    open_nodes = set()
    for record in open_:
        open_nodes.add(record.node)
        absent = snapshot.node(record.node) is None
        if busy.get(record.node):
            end.append(FreedEnd(record.id, record.last_seen_free_at,
                                f"held GPU pods again (seen {at:%Y-%m-%d %H:%M:%S %Z})"))
        elif left := gone(record.workloads):
            end.append(FreedEnd(record.id, record.last_seen_free_at,
                                f"{', '.join(left)} had no pods left (seen {at:%Y-%m-%d %H:%M:%S %Z}): from then on "
                                "the node is free because that workload went to zero, not because of binpack"))
        else:
            seen.append(FreedSeen(record.id, removed=absent and not record.removed))
    waiting = 0
    for mark in marks:
        if mark.node in open_nodes or at - mark.marked_at > MARK_HORIZON or mark.marked_at > at:
            continue
        if busy.get(mark.node) or gone(mark.workloads):
            waiting += 1
            continue
        start.append(FreedStart(mark, removed=snapshot.node(mark.node) is None))
    return FreedCheck(taken_at=at, start=tuple(start), seen=tuple(seen), end=tuple(end), waiting=waiting)
