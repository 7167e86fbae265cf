"""Which nodes to empty, and in what order: the cluster scheduler's placements simulated over
one snapshot, node after node (no ORM, no HTTP, no clock). Only the GPU map and the dashboard
ask it (capacity/gpumap/planning.py); the rules a defrag job applies to one node, which the
simulation follows, are capacity/defrag/planning.py's."""
from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from clusters.labels import GPU_PRODUCT_LABEL, NODE_POOL_LABELS
from clusters.snapshot import ClusterSnapshot, NodeView

from capacity.defrag.planning import Role, pod_classify


# ---- where to defrag: what emptying nodes frees, one after the other ---------------------
#
# A job on one node orphans its model pods; their ReplicaSets make replacements, which
# need room on other nodes of the same GPU product. So whether a node can be freed depends
# on the room left by the nodes freed before it: two half-full nodes can each be emptied
# into the other, but not both. The advice simulates the candidates in order over one
# snapshot, reserving the room each one's pods take, and says how many can be freed
# together and why the others cannot.
#
# Where a replacement lands is the cluster scheduler's choice, not ours, so the simulation
# places each pod where that scheduler would. kube-scheduler's NodeResourcesFit plugin
# scores the nodes that fit with one strategy (KubeSchedulerConfiguration
# `pluginConfig[NodeResourcesFit].args.scoringStrategy.type`):
#   - LeastAllocated, the default when nothing is configured (SetDefaults_NodeResourcesFitArgs
#     in kubernetes pkg/scheduler/apis/config/v1/defaults.go): the node with the most room
#     left wins, so a pod spreads onto the emptiest node that fits. An empty node beats any
#     partly used node of its size: emptying a node then fills another one and frees nothing.
#   - MostAllocated, or RequestedToCapacityRatio shaped to favour full nodes: the
#     bin-packing strategies of the "Resource Bin Packing" page (kubernetes.io/docs/concepts/
#     configuration/resource-bin-packing/); the fullest node that fits wins.
# The default scores cpu and memory (weight 1 each), not GPUs; on GPU nodes a model pod's
# cpu and memory follow its GPUs, so GPU allocation is what the simulation scores. Among
# equal scores kube-scheduler picks one at random: the simulation then assumes the empty
# node (the replacement *may* land there, and the advice must not promise a free node).
#
# Under MostAllocated, room is the free GPUs of Ready, schedulable, non-empty nodes that no
# defrag job holds, and pods go largest first onto the fullest node that fits (best fit).
# An empty node is never room: a whole free node is what defrag makes, and filling one to
# free another only moves the fragment. Under LeastAllocated the empty nodes are room too,
# since the scheduler will use them: a candidate any of whose pods would go to an empty
# node frees no net node, and the advice says so and what the operator can do about it.

class Scoring:
    """The cluster scheduler's NodeResourcesFit scoring strategy, as kube-scheduler names it."""
    LEAST_ALLOCATED = "LeastAllocated"   # kube-scheduler's default: spread
    MOST_ALLOCATED = "MostAllocated"     # bin-packing
    ALL = (LEAST_ALLOCATED, MOST_ALLOCATED)


def scoring_check(value: str) -> str:
    """The scoring strategy, or ValueError naming the setting and the values it takes."""
    if value not in Scoring.ALL:
        raise ValueError(f"CAPACITY_SCHEDULER_SCORING must be one of {', '.join(Scoring.ALL)} (the cluster "
                         f"scheduler's NodeResourcesFit scoringStrategy type), not {value!r}")
    return value


class Freeing:
    """What emptying a candidate node does, given the ones freed before it."""
    TOGETHER = "together"        # freed, with every node before it freed too
    CONTENDED = "contended"      # could be freed alone, but needs room the nodes before it use
    FILLS_EMPTY = "fills-empty"  # the scheduler would put its pods on an empty node: nothing freed
    NEEDS_EMPTY = "needs-empty"  # its pods fit only if an empty node takes them
    NO_ROOM = "no-room"          # its pods fit nowhere, not even on empty nodes


_FREEING_ORDER = {Freeing.TOGETHER: 0, Freeing.CONTENDED: 1, Freeing.FILLS_EMPTY: 2, Freeing.NEEDS_EMPTY: 3,
                  Freeing.NO_ROOM: 4}


def node_pool(node: NodeView) -> str:
    return next((node.labels[k] for k in NODE_POOL_LABELS if node.labels.get(k)),
                node.labels.get(GPU_PRODUCT_LABEL, "default"))


@dataclass(frozen=True)
class Move:
    """One pod's GPUs, placed on a node by the simulation (`pod` is ns/name; a replacement
    made for a pod moved from an earlier node is named after the pod it replaces)."""
    pod: str
    gpus: int
    to: str


@dataclass(frozen=True)
class FreeingStep:
    node: str
    pool: str
    gpu_product: str
    gpus_moved: int          # GPUs of the pods that would move (the node's own, and replacements it received)
    pods_moved: int
    outcome: str             # a `Freeing` value
    why: str
    moves: tuple[Move, ...] = ()   # where its pods go (TOGETHER only)
    position: int | None = None    # 1.. within the nodes freed together (TOGETHER only)

    @property
    def frees_whole_node(self) -> bool:
        return self.outcome == Freeing.TOGETHER

    @property
    def outcome_label(self) -> str:
        if self.outcome == Freeing.TOGETHER:
            return f"frees a whole node (#{self.position} together)"
        return {Freeing.CONTENDED: "instead of an earlier one, not as well",
                Freeing.FILLS_EMPTY: "frees nothing: its pods would fill an empty node",
                Freeing.NEEDS_EMPTY: "only by using an empty node",
                Freeing.NO_ROOM: "no room for its pods"}[self.outcome]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class DefragAdvice:
    steps: tuple[FreeingStep, ...]   # freed together first (in order), then the rest
    scoring: str = Scoring.LEAST_ALLOCATED   # the scheduler scoring the simulation assumed

    def count(self, outcome: str) -> int:
        return sum(1 for s in self.steps if s.outcome == outcome)

    def only(self, keep: Collection[str]) -> "DefragAdvice":
        """The same steps, limited to the named nodes (a pool's): the simulation stays the
        cluster's, since replacements may land in any pool of the GPU product."""
        return DefragAdvice(steps=tuple(s for s in self.steps if s.node in keep), scoring=self.scoring)

    @property
    def summary(self) -> str:
        if not self.steps:
            return "No node to empty: every GPU node is empty, cordoned, held by a defrag job or blocked."
        together, contended = self.count(Freeing.TOGETHER), self.count(Freeing.CONTENDED)
        fills_empty = self.count(Freeing.FILLS_EMPTY)
        needs_empty, no_room = self.count(Freeing.NEEDS_EMPTY), self.count(Freeing.NO_ROOM)
        if together == 0:
            parts = ["No node can be emptied into the free GPUs of other non-empty nodes"]
        elif together == 1:
            parts = ["1 node can be freed"]
        else:
            parts = [f"{together} nodes can be freed together"]
        if contended:
            first = "the first one uses" if together == 1 else "the first ones use"
            parts.append(f"the next {contended} each need the room {first}" if contended > 1
                         else f"1 more needs the room {first}")
        if fills_empty:
            parts.append(f"{fills_empty} would only move {'its' if fills_empty == 1 else 'their'} pods onto an "
                         f"empty node under the scheduler's {self.scoring} scoring (no whole node freed)")
        if needs_empty:
            parts.append(f"{needs_empty} cannot be freed without using an empty node")
        if no_room:
            parts.append(f"{no_room} cannot be freed at all (no room for "
                         f"{'its' if no_room == 1 else 'their'} pods, even on empty nodes)")
        return "; ".join(parts) + "."


class Room:
    """Free GPUs per node, kept sorted as (free GPUs, rank, node), and where the scheduler
    would place a pod in it. Among nodes with the same free GPUs the lowest rank is filled
    first: (under LeastAllocated, empty nodes: see above), nodes that are no candidate, then
    candidates tried last, so the pods of one freed node do not land on the next one to be
    freed (moving them twice). Under LeastAllocated the score depends on the node's size, so
    the room is kept sorted per size (a GPU product has few); under MostAllocated as one list
    (best fit on free GPUs, as before sizes mattered). Changed in place: a fleet of 5,000
    nodes is not copied per node."""

    NOT_A_CANDIDATE = -(10 ** 9)
    EMPTY = NOT_A_CANDIDATE - 1

    def __init__(self, entries: Iterable[tuple[int, int, str]], *, scoring: str, size: Mapping[str, int]):
        self.scoring, self.size = scoring, size
        self.entry = {e[2]: e for e in entries}    # every node in the room, full ones too
        self.groups: dict[int | None, list[tuple[int, int, str]]] = {}
        for e in sorted(e for e in self.entry.values() if e[0] > 0):
            self.groups.setdefault(self._group(e[2]), []).append(e)

    def _group(self, node: str) -> int | None:
        return self.size[node] if self.scoring == Scoring.LEAST_ALLOCATED else None

    def take(self, node: str) -> tuple[int, int, str] | None:
        """Take the node out (it is being freed, or it is the one whose pods look for room)."""
        entry = self.entry.pop(node, None)
        if entry is not None and entry[0] > 0:
            items = self.groups[self._group(node)]
            del items[bisect_left(items, entry)]
        return entry

    def put(self, entry: tuple[int, int, str] | None) -> None:
        if entry is not None:
            self.entry[entry[2]] = entry
            if entry[0] > 0:
                insort(self.groups.setdefault(self._group(entry[2]), []), entry)

    def _pick(self, gpus: int) -> tuple[int, int, str] | None:
        if self.scoring == Scoring.MOST_ALLOCATED:
            items = self.groups.get(None, [])
            at = bisect_left(items, (gpus, -float("inf"), ""))
            return items[at] if at < len(items) else None
        # LeastAllocated: per size, the node with the most free GPUs (lowest rank among
        # equals); across sizes the highest share left free once the pod is placed.
        best, best_key = None, None
        for size, items in self.groups.items():
            if not items or items[-1][0] < gpus:
                continue
            entry = items[bisect_left(items, (items[-1][0], -float("inf"), ""))]
            left = entry[0] - gpus
            if best is None or left * best_key[1] > best_key[0] * size or \
                    (left * best_key[1] == best_key[0] * size and entry[1:] < best[1:]):
                best, best_key = entry, (left, size)
        return best

    def place(self, requests: Sequence[tuple[str, int]]) -> list[Move] | None:
        """Largest pod first, each where the scheduler would put it: the moves (their room
        taken), or None (the room as it was)."""
        moves: list[Move] = []
        for pod, gpus in sorted(requests, key=lambda r: (-r[1], r[0])):
            entry = self._pick(gpus)
            if entry is None:
                self.give_back(moves)
                return None
            self.take(entry[2])
            free, rank, node = entry
            self.put((free - gpus, rank, node))
            moves.append(Move(pod=pod, gpus=gpus, to=node))
        return moves

    def give_back(self, moves: Sequence[Move]) -> None:
        for move in reversed(moves):
            free, rank, node = self.take(move.to)
            self.put((free + move.gpus, rank, node))

    @property
    def spare(self) -> str:
        frees = [e[0] for items in self.groups.values() for e in items]
        return f"other non-empty nodes have {sum(frees)} free GPU(s), at most {max(frees, default=0)} on one"


def _where(moves: Iterable[Move]) -> str:
    per_node: dict[str, int] = {}
    for move in moves:
        per_node[move.to] = per_node.get(move.to, 0) + move.gpus
    return ", ".join(f"{node} ({_plural(gpus, 'GPU', 'GPUs')})" for node, gpus in per_node.items())


def _gpus(requests: Iterable[tuple[str, int]]) -> int:
    return sum(gpus for _, gpus in requests)


def _gpu_count(requests: Iterable[tuple[str, int]]) -> str:
    return _plural(_gpus(requests), "GPU", "GPUs")


def _names(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _fills_empty_why(*, moves: Sequence[Move], empty_names: Collection[str], scoring: str, empties: Sequence[str],
                     instead: Sequence[Move] | None, before: str = "") -> str:
    """What the operator reads when the scheduler would fill an empty node, and what to do."""
    onto = [m for m in moves if m.to in empty_names]
    nodes = {m.to for m in onto}
    why = (f"{before}its {'pod' if len(onto) == 1 else 'pods'} would go to empty "
           f"{'node' if len(nodes) == 1 else 'nodes'} {_where(onto)} under the scheduler's {scoring} scoring "
           "(kube-scheduler's default spreads onto the emptiest node): no whole node freed. To free it, set the "
           "scheduler's NodeResourcesFit scoringStrategy to MostAllocated (and CAPACITY_SCHEDULER_SCORING="
           f"MostAllocated here), or cordon the {'empty node' if len(empties) == 1 else f'{len(empties)} empty nodes'} "
           f"{_names(empties)} while the job runs and return {'it' if len(empties) == 1 else 'them'} to service "
           "after")
    if instead:
        why += f"; then its pods would go to {_where(instead)}"
    return why


def defrag_advice(snapshot: ClusterSnapshot, *, held_nodes: Collection[str] = (),
                  scoring: str = Scoring.LEAST_ALLOCATED) -> DefragAdvice:
    """Which nodes emptying frees, simulated in order over one snapshot, each replacement
    placed where the cluster scheduler's `scoring` (a `Scoring` value) would put it.

    A candidate has GPU pods, is schedulable, is held by no defrag job and has no blocker
    (`pod_classify`, the rule the job itself applies). Candidates whose pods fit alone are
    tried fewest GPUs first (smaller first frees the most nodes out of the same room): each
    one freed takes the room its pods (and any replacements it received) are placed in, and
    stops being room itself (the job cordons it).
    """
    scoring = scoring_check(scoring)
    spread = scoring == Scoring.LEAST_ALLOCATED
    gpu_nodes = sorted((n for n in snapshot.nodes if n.gpus_allocatable > 0), key=lambda n: n.name)
    used = {n.name: snapshot.gpus_requested(n.name) for n in gpu_nodes}
    size = {n.name: n.gpus_allocatable for n in gpu_nodes}
    by_product: dict[str, list[NodeView]] = {}
    for node in gpu_nodes:
        by_product.setdefault(node.labels.get(GPU_PRODUCT_LABEL, ""), []).append(node)
    steps: list[FreeingStep] = []
    for product, nodes in sorted(by_product.items()):
        pool = {n.name: node_pool(n) for n in nodes}
        open_nodes = [n for n in nodes if not n.unschedulable and n.name not in held_nodes]
        own: dict[str, list[tuple[str, int]]] = {}
        for node in open_nodes:
            pods = [p for p in snapshot.pods_on(node.name) if p.live]
            if used[node.name] > 0 and not any(pod_classify(p)[0] == Role.BLOCKER for p in pods):
                own[node.name] = [(f"{p.namespace}/{p.name}", p.gpus) for p in pods if p.gpus > 0]
        order = sorted(own, key=lambda n: (_gpus(own[n]), len(own[n]), n))
        rank = {name: -i for i, name in enumerate(order)}
        partly_used = [(n.gpus_allocatable - used[n.name], rank.get(n.name, Room.NOT_A_CANDIDATE), n.name)
                       for n in open_nodes if n.ready and 0 < used[n.name] < n.gpus_allocatable]
        empty_rank = Room.EMPTY if spread else Room.NOT_A_CANDIDATE
        empties = [(n.gpus_allocatable, empty_rank, n.name) for n in open_nodes if n.ready and used[n.name] == 0]
        empty_names = [name for _, _, name in empties]

        def step(name: str, outcome: str, why: str, requests, **extra) -> FreeingStep:
            return FreeingStep(node=name, pool=pool[name], gpu_product=product, gpus_moved=_gpus(requests),
                               pods_moved=len(requests), outcome=outcome, why=why, **extra)

        # Each candidate on its own: where its pods would go with every other node as it is
        # now; when they fit nowhere but on an empty node, that it needs one; and under
        # LeastAllocated, when the scheduler would prefer an empty node, that it frees nothing.
        alone: dict[str, list[Move] | None] = {}
        room = Room(partly_used, scoring=scoring, size=size)
        with_empty = Room(partly_used + empties, scoring=scoring, size=size)
        for name in order:
            mine, also_mine = room.take(name), with_empty.take(name)
            alone[name] = room.place(own[name])
            if alone[name] is not None:
                room.give_back(alone[name])
                if spread and empties:
                    chosen = with_empty.place(own[name])
                    with_empty.give_back(chosen or ())
                    if chosen and any(m.to in empty_names for m in chosen):
                        steps.append(step(name, Freeing.FILLS_EMPTY, _fills_empty_why(
                            moves=chosen, empty_names=empty_names, scoring=scoring, empties=empty_names,
                            instead=alone[name]), own[name]))
                        alone[name] = None
            else:
                spare = room.spare
                filled = with_empty.place(own[name])
                if filled is not None:
                    with_empty.give_back(filled)
                    steps.append(step(name, Freeing.NEEDS_EMPTY, "cannot be freed without using an empty node: "
                                      f"its pods need {_gpu_count(own[name])} ({spare}); they would go to "
                                      f"{_where(m for m in filled if m.to in empty_names)}", own[name]))
                else:
                    steps.append(step(name, Freeing.NO_ROOM, f"its pods need {_gpu_count(own[name])} and fit "
                                      f"nowhere, not even on an empty node ({spare})", own[name]))
            with_empty.put(also_mine)
            room.put(mine)

        # Then together, in order: a node freed takes the room its pods (and any
        # replacements it received) go to, and stops being room itself (the job cordons it).
        # Under LeastAllocated the scheduler sees the empty nodes too: once the nodes before
        # it took the partly used room, a later node's pods may go to an empty one instead.
        room = with_empty if spread else room
        position: dict[str, int] = {}                            # node freed -> its place in the order
        received: dict[str, list[tuple[str, int, str]]] = {}   # node -> (pod, GPUs, node it came from)
        for name in (n for n in order if alone[n] is not None):
            extra = received.get(name, [])
            requests = own[name] + [(pod, gpus) for pod, gpus, _ in extra]
            also = (f", {sum(g for _, g, _ in extra)} of them replacements from "
                    f"{', '.join(sorted({src for _, _, src in extra}))}" if extra else "")
            mine = room.take(name)
            moves = room.place(requests)
            before = (f"with the {_plural(len(position), 'node', 'nodes')} before it freed too, "
                      if position else "")
            if moves is not None and not any(m.to in empty_names for m in moves):
                position[name] = len(position) + 1
                for move in moves:
                    received.setdefault(move.to, []).append((move.pod, move.gpus, name))
                fit = "fits" if len(requests) == 1 else "fit"
                steps.append(step(name, Freeing.TOGETHER, f"{before}its {_plural(len(requests), 'pod', 'pods')} "
                                  f"({_gpu_count(requests)}{also}) {fit} on {_where(moves)}",
                                  requests, moves=tuple(moves), position=position[name]))
                continue
            if moves is not None:
                room.give_back(moves)
                room.put(mine)
                steps.append(step(name, Freeing.CONTENDED, _fills_empty_why(
                    moves=moves, empty_names=empty_names, scoring=scoring, empties=empty_names, instead=None,
                    before=f"on its own its pods ({_gpu_count(own[name])}) would fit on {_where(alone[name])}, "
                           f"but {before}"), own[name]))
                continue
            room.put(mine)
            targets = {m.to for m in alone[name]}
            # The nodes freed before it that are its room, or whose pods took its room.
            users = sorted({t for t in targets if t in position} | {src for t in targets
                                                                     for _, _, src in received.get(t, ())},
                           key=position.__getitem__)
            why = f"on its own its pods ({_gpu_count(own[name])}) would fit on {_where(alone[name])}, but "
            if users:
                why += (f"{', '.join(users)} (freed before it) {'uses' if len(users) == 1 else 'use'} that room: "
                        "it can be freed instead, not as well")
                if extra:
                    why += f"; it would also hold replacements from {', '.join(sorted({s for _, _, s in extra}))}"
            else:
                why += (f"with the nodes before it freed it also holds their replacements "
                        f"({_gpu_count(requests)}{also}) and no room is left for them all")
            steps.append(step(name, Freeing.CONTENDED, why, own[name]))
    steps.sort(key=lambda s: (_FREEING_ORDER[s.outcome], s.gpu_product, s.position or 0, s.gpus_moved,
                              s.pods_moved, s.node))
    return DefragAdvice(steps=tuple(steps), scoring=scoring)
