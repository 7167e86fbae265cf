"""Consolidation campaigns, decided over one snapshot (no ORM, no HTTP, no clock): which
nodes of a pool to free together, in what order, and where every pod they hold will land.

A campaign differs from the GPU map's advice (capacity/gpumap/advice.py) in one rule: all
its nodes are cordoned before the first pod moves, so no replacement can land on a node the
campaign is freeing, and every pod moves at most once. The plan therefore places each
candidate's pods only on nodes outside the campaign, and a node that the plan already uses
as room for an earlier candidate's pods is left out (freeing it too would move those pods a
second time).

Where a replacement lands is the cluster scheduler's choice (`Scoring`, as the advice
simulates it). Under MostAllocated an empty node scores lowest and takes a pod only when
nothing else fits, so the plan keeps pods off empty nodes by placing them elsewhere. Under
LeastAllocated (kube-scheduler's default) an empty node scores highest: the campaign
cordons the pool's empty nodes too for its duration (`kept_empty`) and returns them to
service at the end, or its pods would fill those nodes and free nothing.

The nodes are chosen greedily, one after the other, and then checked as the campaign will
run: every chosen node cordoned from the start, the nodes emptied in the campaign's order,
and each node's pods placed by the scheduler in any order and with score ties broken any
way (it creates and queues the replacements in an order the plan cannot know, and
kube-scheduler picks at random among equal scores). A node whose pods may find no room in
one of those ways is left out (`MAY_NOT_FIT`) and the choice made again without it: the
plan promises only nodes it can free whatever the scheduler's order.

Candidates are tried fewest GPUs first (smaller nodes free the most nodes out of the same
room), as the advice tries them. `lower_bound` is the fewest nodes the pool's GPU requests
could fit on at all (largest nodes first, requests as one sum): no plan frees more than
`pool nodes − lower_bound`, and the distance between the two says how much a cleverer order
could still win.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from bisect import insort
from dataclasses import asdict, dataclass, field

from clusters.labels import DO_NOT_DISRUPT, GPU_PRODUCT_LABEL, ISVC_LABEL, KNATIVE_SERVICE_LABEL
from clusters.snapshot import ClusterSnapshot, NodeView

from capacity.defrag.planning import Role, pod_classify
from capacity.gpumap.advice import Freeing, Move, Room, Scoring, defrag_advice, scoring_check

# Why a node of the pool is not in the campaign (`LeftOut.reason`).
EMPTY = "empty"              # already free
CLOSED = "closed"            # cordoned or not Ready: not the campaign's to cordon or return
HELD = "held"                # a defrag job holds it
DO_NOT_DISRUPT_NODE = "do-not-disrupt"
BLOCKED = "blocked"          # a pod that cannot move (pod_classify's blockers)
ON_HOLD = "on-hold"          # a pod of a workload the product exempts or snoozes
RECEIVES = "receives"        # the plan puts earlier candidates' pods on it
NO_ROOM = "no-room"          # its pods fit nowhere outside the campaign
GOAL_MET = "goal-met"        # the campaign frees the nodes asked for without it
MAY_NOT_FIT = "may-not-fit"  # its pods fit only in some of the orders the scheduler may place them in

# Order of the reasons in a report: what an operator can act on first.
_REASON_ORDER = {r: i for i, r in enumerate((NO_ROOM, MAY_NOT_FIT, RECEIVES, ON_HOLD, BLOCKED, DO_NOT_DISRUPT_NODE, HELD, CLOSED,
                                              GOAL_MET, EMPTY))}


class CampaignInputError(ValueError):
    """A pool selector or goal that cannot be planned; says which and why."""


def pool_selector_parse(text: str) -> dict[str, str]:
    """`KEY=VALUE[,KEY=VALUE…]` (a node label selector of equalities) as a dict."""
    selector: dict[str, str] = {}
    for part in (text or "").split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CampaignInputError(f"--pool takes KEY=VALUE node labels (e.g. {GPU_PRODUCT_LABEL}=NVIDIA-H100-80GB-HBM3"
                                     f" or karpenter.sh/nodepool=h100), not {part.strip() or text!r}")
        if key.strip() in selector and selector[key.strip()] != value.strip():
            raise CampaignInputError(f"--pool names label {key.strip()!r} twice with different values")
        selector[key.strip()] = value.strip()
    return selector


def pool_selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def selects(selector: Mapping[str, str], node: NodeView) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class CampaignMove:
    """One pod of a campaign node and the node the scheduler is expected to place its
    replacement on (never a campaign node)."""

    pod: str       # namespace/name
    gpus: int
    source: str    # the campaign node it leaves
    to: str


@dataclass(frozen=True)
class CampaignNode:
    node: str
    position: int                   # 1.. in the campaign's order
    gpus: int                       # the node's allocatable GPUs: what freeing it gives back
    gpus_moved: int
    moves: tuple[CampaignMove, ...]
    why: str

    @property
    def pods_moved(self) -> int:
        return len(self.moves)


@dataclass(frozen=True)
class LeftOut:
    node: str
    reason: str    # one of the reasons above
    why: str


@dataclass(frozen=True)
class CampaignPlan:
    selector: Mapping[str, str]
    goal: int | None                # nodes to free; None: as many as can be
    scoring: str
    nodes: tuple[CampaignNode, ...]
    left_out: tuple[LeftOut, ...]
    kept_empty: tuple[str, ...]     # empty nodes cordoned for the campaign's duration
    pool_nodes: int
    pool_gpus: int
    gpus_requested: int
    lower_bound: int                # the fewest nodes the pool's GPU requests could fit on
    candidates: int = 0             # nodes whose pods could move at all (before room was looked at)
    empty_nodes: int = 0            # nodes of the pool that request no GPU now (already free)
    messages: tuple[str, ...] = field(default=())

    # ---- what the plan frees --------------------------------------------------------------

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.node for n in self.nodes)

    @property
    def pool_node_names(self) -> frozenset[str] | None:
        """Every node of the pool the plan looked at (those it frees, and those it leaves out
        with why), or None when the plan does not name them all."""
        names = frozenset(self.node_names) | {o.node for o in self.left_out} | set(self.kept_empty)
        return names if len(names) == self.pool_nodes else None

    @property
    def freed(self) -> int:
        return len(self.nodes)

    @property
    def gpus_freed(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def moves(self) -> tuple[CampaignMove, ...]:
        return tuple(m for n in self.nodes for m in n.moves)

    @property
    def pods_moved(self) -> int:
        return len(self.moves)

    @property
    def pods_moved_twice(self) -> int:
        """Pods whose replacement the plan puts on a node it frees later: they would move again."""
        return sum(1 for m in self.moves if m.to in set(self.node_names))

    @property
    def replacements_on_campaign_nodes(self) -> int:
        campaign = set(self.node_names) | set(self.kept_empty)
        return sum(1 for m in self.moves if m.to in campaign)

    @property
    def most_freeable(self) -> int:
        """Nodes the pool could free at best: its nodes that hold requests now, less the fewest
        those requests fit on (a node already empty is not freed again)."""
        return max(self.pool_nodes - self.empty_nodes - self.lower_bound, 0)

    @property
    def goal_met(self) -> bool:
        return self.goal is None or self.freed >= self.goal

    @property
    def summary(self) -> str:
        pool = pool_selector_text(self.selector)
        if not self.nodes:
            head = f"No node of pool {pool} can be freed"
        else:
            head = (f"{_plural(self.freed, 'node', 'nodes')} of pool {pool} can be freed "
                    f"({_plural(self.gpus_freed, 'GPU', 'GPUs')}); "
                    f"{'1 pod moves once' if self.pods_moved == 1 else f'{self.pods_moved} pods move once each'}, "
                    "none onto a node of the campaign")
        if self.goal is not None and self.freed < self.goal:
            head += f"; {self.goal} asked for"
        empty = f", {self.empty_nodes} already empty" if self.empty_nodes else ""
        return (f"{head}. Lower bound: the pool's {self.gpus_requested} requested GPUs fit on "
                f"{_plural(self.lower_bound, 'node', 'nodes')} of its {self.pool_nodes}{empty}, so at most "
                f"{self.most_freeable} could be freed by any plan.")

    def report_lines(self) -> list[str]:
        lines = [self.summary]
        if self.kept_empty:
            lines.append(f"Kept empty while it runs (cordoned, returned to service at the end, under the scheduler's "
                         f"{self.scoring} scoring an empty node would take the moved pods): {', '.join(self.kept_empty)}")
        for n in self.nodes:
            lines.append(f"  {n.position}. {n.node}: frees {_plural(n.gpus, 'GPU', 'GPUs')}; {n.why}")
        if self.left_out:
            lines.append("Left out:")
            lines.extend(f"  {o.node}: {o.why}" for o in self.left_out)
        lines.extend(self.messages)
        return lines

    # ---- stored with the campaign ----------------------------------------------------------

    def to_dict(self) -> dict:
        data = asdict(self)
        data["selector"] = dict(self.selector)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "CampaignPlan":
        nodes = tuple(CampaignNode(**{**n, "moves": tuple(CampaignMove(**m) for m in n["moves"])})
                      for n in data["nodes"])
        return cls(**{**data, "selector": dict(data["selector"]), "nodes": nodes,
                      "left_out": tuple(LeftOut(**o) for o in data["left_out"]),
                      "kept_empty": tuple(data["kept_empty"]), "messages": tuple(data.get("messages", ()))})


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def lower_bound_nodes(sizes: Collection[int], requested: int) -> int:
    """The fewest nodes whose GPUs add up to `requested`, largest first (a lower bound:
    it ignores that a pod cannot be split across nodes)."""
    total, count = 0, 0
    for size in sorted(sizes, reverse=True):
        if total >= requested:
            break
        total += size
        count += 1
    return count


def _holder(pod, holds: Mapping[tuple[str, str], str]) -> str | None:
    for label in (ISVC_LABEL, KNATIVE_SERVICE_LABEL):
        name = pod.labels.get(label)
        if name and (pod.namespace, name) in holds:
            return f"{pod.namespace}/{name} is on hold ({holds[(pod.namespace, name)]})"
    return None


def campaign_plan(snapshot: ClusterSnapshot, *, selector: Mapping[str, str], goal: int | None = None,
                  scoring: str = Scoring.LEAST_ALLOCATED, held_nodes: Collection[str] = (),
                  holds: Mapping[tuple[str, str], str] | None = None) -> CampaignPlan:
    """The campaign that frees `goal` nodes of the pool `selector` selects (None: as many as
    can be), each pod placed where the scheduler's `scoring` would put it with every
    campaign node (and, under LeastAllocated, every empty node of the GPU product) cordoned.

    `held_nodes`: nodes live defrag jobs hold. `holds`: (namespace, workload) → reason, the
    models and pynodes the product exempts or snoozes: a node holding one of their pods stays.
    """
    scoring = scoring_check(scoring)
    if goal is not None and goal < 1:
        raise CampaignInputError(f"the number of nodes to free must be 1 or more, not {goal}")
    if not selector:
        raise CampaignInputError("a campaign needs a pool: at least one KEY=VALUE node label")
    holds = holds or {}
    spread = scoring == Scoring.LEAST_ALLOCATED
    gpu_nodes = sorted((n for n in snapshot.nodes if n.gpus_allocatable > 0), key=lambda n: n.name)
    pool = [n for n in gpu_nodes if selects(selector, n)]
    if not pool:
        raise CampaignInputError(f"no GPU node has the labels {pool_selector_text(selector)}")
    used = {n.name: snapshot.gpus_requested(n.name) for n in gpu_nodes}
    size = {n.name: n.gpus_allocatable for n in gpu_nodes}
    products = {n.labels.get(GPU_PRODUCT_LABEL, "") for n in pool}
    # Room: the GPU product's nodes outside the pool count too (a replacement may land on
    # any node whose GPUs it asks for).
    same_product = [n for n in gpu_nodes if n.labels.get(GPU_PRODUCT_LABEL, "") in products]
    open_nodes = [n for n in same_product if n.ready and not n.unschedulable and n.name not in held_nodes]
    left_out: list[LeftOut] = []
    own: dict[str, list[tuple[str, int]]] = {}
    pool_names = {n.name for n in pool}
    for node in pool:
        name = node.name
        if node.name in held_nodes:
            left_out.append(LeftOut(name, HELD, "a defrag job holds it"))
            continue
        if node.unschedulable or not node.ready:
            left_out.append(LeftOut(name, CLOSED, "cordoned" if node.unschedulable else "not Ready"))
            continue
        if used[name] == 0:
            left_out.append(LeftOut(name, EMPTY, "already free"))
            continue
        if node.annotations.get(DO_NOT_DISRUPT) == "true":
            left_out.append(LeftOut(name, DO_NOT_DISRUPT_NODE, f'the node says {DO_NOT_DISRUPT}: "true"'))
            continue
        pods = [p for p in snapshot.pods_on(name) if p.live]
        blockers = [f"{p.namespace}/{p.name} ({why})" for p in pods for role, why in [pod_classify(p)]
                    if role == Role.BLOCKER]
        if blockers:
            left_out.append(LeftOut(name, BLOCKED, f"{_plural(len(blockers), 'pod', 'pods')} cannot move: "
                                                   f"{', '.join(blockers[:3])}"
                                                   + (f" and {len(blockers) - 3} more" if len(blockers) > 3 else "")))
            continue
        on_hold = sorted({h for p in pods if (h := _holder(p, holds))})
        if on_hold:
            left_out.append(LeftOut(name, ON_HOLD, "; ".join(on_hold)))
            continue
        own[name] = [(f"{p.namespace}/{p.name}", p.gpus) for p in pods if p.gpus > 0]

    order = sorted(own, key=lambda n: (sum(g for _, g in own[n]), len(own[n]), n))
    empties = [n.name for n in open_nodes if used[n.name] == 0]
    kept_empty = tuple(sorted(e for e in empties if e in pool_names)) if spread else ()
    # Under LeastAllocated an empty node outside the pool would still take the moved pods.
    unguarded = sorted(e for e in empties if e not in pool_names) if spread else []
    partly_used = [n.name for n in open_nodes if 0 < used[n.name] < n.gpus_allocatable]
    # The greedy choice places a node's pods with the nodes chosen after it still open, and
    # one order of pods and ties; the campaign runs with all of them cordoned from the start,
    # and the scheduler takes the pods in an order it alone knows. A node whose pods may not
    # fit once the nodes before it are emptied is dropped, and the choice made again without it.
    may_not_fit: dict[str, str] = {}
    while True:
        chosen, chosen_left_out = _choose(order, own, goal=goal, scoring=scoring, size=size,
                                          partly_used=partly_used, used=used, excluded=may_not_fit)
        failed = _may_not_fit(chosen, own, scoring=scoring, size=size, used=used,
                              room=[n for n in partly_used if n not in set(chosen)])
        if not failed:
            break
        may_not_fit.update(failed)
    left_out += chosen_left_out
    left_out += [LeftOut(name, MAY_NOT_FIT, why) for name, why in may_not_fit.items()]
    placed = _placements(chosen, own, scoring=scoring, size=size, used=used,
                         room=[n for n in partly_used if n not in set(chosen)])
    nodes = []
    for position, name in enumerate(chosen, start=1):
        moves = sorted(placed[name], key=lambda m: m.pod)
        before = (f"with the {_plural(position - 1, 'node', 'nodes')} before it cordoned, " if position > 1 else "")
        nodes.append(CampaignNode(node=name, position=position, gpus=size[name], gpus_moved=sum(m.gpus for m in moves),
                                  moves=tuple(CampaignMove(pod=m.pod, gpus=m.gpus, source=name, to=m.to)
                                              for m in moves),
                                  why=f"{before}its {_plural(len(moves), 'pod', 'pods')} "
                                      f"({_plural(sum(m.gpus for m in moves), 'GPU', 'GPUs')}) "
                                      f"{'fits' if len(moves) == 1 else 'fit'} on {_where(moves)}"))
    messages: list[str] = []
    if unguarded and nodes:
        messages.append(f"Under the scheduler's {scoring} scoring, empty node(s) outside the pool "
                        f"({', '.join(unguarded[:5])}{' …' if len(unguarded) > 5 else ''}) may take moved pods "
                        "instead of the planned nodes; the campaign does not cordon nodes outside its pool.")
    pool_gpus = sum(size[n.name] for n in pool)
    requested = sum(used[n.name] for n in pool)
    left_out.sort(key=lambda o: (_REASON_ORDER[o.reason], o.node))
    return CampaignPlan(selector=dict(selector), goal=goal, scoring=scoring, nodes=tuple(nodes),
                        left_out=tuple(left_out), kept_empty=kept_empty if nodes else (), pool_nodes=len(pool),
                        pool_gpus=pool_gpus, gpus_requested=requested,
                        lower_bound=lower_bound_nodes([size[n.name] for n in pool], requested),
                        candidates=len(order), empty_nodes=sum(1 for n in pool if used[n.name] == 0),
                        messages=tuple(messages))


def _choose(order: Sequence[str], own: Mapping[str, list[tuple[str, int]]], *, goal: int | None, scoring: str,
            size: Mapping[str, int], partly_used: Sequence[str], used: Mapping[str, int],
            excluded: Collection[str]) -> tuple[list[str], list[LeftOut]]:
    """The candidates the campaign takes, greedily in `order` (`excluded` ones not tried): a
    node is taken when its pods, and those the plan put on it for earlier nodes, fit on
    nodes outside the campaign. Returns them and the ones left out with why."""
    rank = {name: -i for i, name in enumerate(order)}
    room = Room([(size[n] - used[n], rank.get(n, Room.NOT_A_CANDIDATE), n) for n in partly_used],
                scoring=scoring, size=size)
    chosen: list[str] = []
    left_out: list[LeftOut] = []
    placed: dict[str, list[Move]] = {}      # campaign node → where its pods go
    onto: dict[str, list[tuple[str, Move]]] = {}   # node → (campaign node, move) of the pods placed on it
    for name in order:
        if name in excluded:
            continue
        if goal is not None and len(chosen) >= goal:
            left_out.append(LeftOut(name, GOAL_MET, f"the {goal} node(s) asked for are freed without it"))
            continue
        # With this node cordoned from the start too, the pods the plan put on it go elsewhere:
        # its own pods and those are placed together; the campaign takes it only if all fit.
        displaced = onto.get(name, [])
        entry = room.take(name)
        moves = room.place(own[name] + [(m.pod, m.gpus) for _, m in displaced])
        if moves is None:
            spare = room.spare
            room.put(entry)
            gpus = sum(g for _, g in own[name])
            why = f"its pods need {_plural(gpus, 'GPU', 'GPUs')}"
            if displaced:
                sources = sorted({src for src, _ in displaced})
                why += (f", and the {_plural(sum(m.gpus for _, m in displaced), 'GPU', 'GPUs')} of "
                        f"{', '.join(sources)} that may land on it would need room elsewhere")
            left_out.append(LeftOut(name, RECEIVES if displaced else NO_ROOM,
                                    f"{why}; they do not fit outside the campaign ({spare})"))
            continue
        source_of = {m.pod: src for src, m in displaced}
        for src in {src for src, _ in displaced}:
            placed[src] = [m for m in placed[src] if m.to != name]
        onto.pop(name, None)
        placed[name] = []
        for move in moves:
            src = source_of.get(move.pod, name)
            placed[src].append(move)
            onto.setdefault(move.to, []).append((src, move))
        chosen.append(name)
    return chosen, left_out


# The scheduler's possible states while a campaign runs are followed as counts of nodes per
# (GPUs allocatable, GPUs free): nodes alike in both are alike to the scheduler's scoring.
# Past this many states after one node the check gives up on that node (it is not promised).
MAX_STATES = 4096


def _scheduler_picks(state: Mapping[tuple[int, int], int], gpus: int, scoring: str) -> list[tuple[int, int]]:
    """The (size, free) kinds of node the scheduler may put a pod of `gpus` on: the best score
    of simcluster's and kube-scheduler's NodeResourcesFit on GPUs, every kind that ties for it
    (kube-scheduler picks at random among equal scores)."""
    fits = [kind for kind, count in state.items() if count and kind[1] >= gpus]
    if not fits:
        return []
    # Free share once the pod is placed, compared without division: LeastAllocated wants the
    # most, MostAllocated the least.
    sign = 1 if scoring == Scoring.LEAST_ALLOCATED else -1
    best = max(fits, key=lambda k: sign * (k[1] - gpus) / k[0])
    return [k for k in fits if (k[1] - gpus) * best[0] == (best[1] - gpus) * k[0]]


def _after_any_order(states: set[tuple], gpus: Sequence[int], scoring: str) -> set[tuple] | str:
    """Every state the scheduler may leave once it has placed pods of `gpus` (in any order,
    ties either way) from any of `states`; or why not: a pod may fit nowhere, or the states
    are too many to follow."""
    frontier = {(state, tuple(sorted(gpus))) for state in states}
    done: set[tuple] = set()
    while frontier:
        following = set()
        for state, left in frontier:
            if not left:
                done.add(state)
                continue
            counts = dict(state)
            for at, g in enumerate(left):
                if at and left[at - 1] == g:
                    continue
                picks = _scheduler_picks(counts, g, scoring)
                if not picks:
                    return "fits-nowhere"
                rest = left[:at] + left[at + 1:]
                for kind in picks:
                    after = dict(counts)
                    after[kind] -= 1
                    after[(kind[0], kind[1] - g)] = after.get((kind[0], kind[1] - g), 0) + 1
                    following.add((tuple(sorted((k, c) for k, c in after.items() if c)), rest))
        if len(following) > MAX_STATES:
            return "too-many"
        frontier = following
    return done


def _may_not_fit(chosen: Sequence[str], own: Mapping[str, list[tuple[str, int]]], *, scoring: str,
                 size: Mapping[str, int], used: Mapping[str, int], room: Sequence[str]) -> dict[str, str]:
    """The chosen nodes whose pods may find no room when the campaign runs: every chosen node
    cordoned from the start, the nodes emptied in the campaign's order, each node's pods placed
    by the scheduler in any order and any tie. Node → why."""
    counts: dict[tuple[int, int], int] = {}
    for name in room:
        kind = (size[name], size[name] - used[name])
        counts[kind] = counts.get(kind, 0) + 1
    states = {tuple(sorted(counts.items()))}
    failed: dict[str, str] = {}
    emptied = 0
    for name in chosen:
        after = _after_any_order(states, [g for _, g in own[name]], scoring)
        if isinstance(after, str):
            gpus = sum(g for _, g in own[name])
            before = (f"with the campaign's nodes cordoned and the {_plural(emptied, 'node', 'nodes')} before it "
                      "emptied first, " if emptied else "with the campaign's nodes cordoned, ")
            failed[name] = f"{before}its pods ({_plural(gpus, 'GPU', 'GPUs')}) " + (
                f"may find no room outside the campaign: in some order the scheduler may place them in, or some "
                f"way it may break a {scoring} score tie, one of them fits on no node; not promised"
                if after == "fits-nowhere" else
                f"could go to more than {MAX_STATES} different arrangements of the nodes' free GPUs, too many to "
                "check that each leaves them room; not promised")
            continue    # left cordoned and unemptied here; the choice is made again without it
        emptied += 1
        states = after
    return failed


def _placements(chosen: Sequence[str], own: Mapping[str, list[tuple[str, int]]], *, scoring: str,
                size: Mapping[str, int], used: Mapping[str, int], room: Sequence[str]) -> dict[str, list[Move]]:
    """Where each chosen node's pods land as the campaign runs: every chosen node cordoned from
    the start, the nodes emptied in order, a node's pods largest first, each on the node the
    scheduler scores best, ties to the lexically first (as simcluster's scheduler breaks them).
    The chosen nodes passed `_may_not_fit`: in this order too every pod finds a node."""
    counts: dict[tuple[int, int], int] = {}
    names: dict[tuple[int, int], list[str]] = {}
    for name in sorted(room):
        kind = (size[name], size[name] - used[name])
        counts[kind] = counts.get(kind, 0) + 1
        names.setdefault(kind, []).append(name)
    placed: dict[str, list[Move]] = {}
    for source in chosen:
        placed[source] = []
        for pod, gpus in sorted(own[source], key=lambda r: (-r[1], r[0])):
            kind = min(_scheduler_picks(counts, gpus, scoring), key=lambda k: names[k][0])
            node = names[kind].pop(0)
            counts[kind] -= 1
            after = (kind[0], kind[1] - gpus)
            counts[after] = counts.get(after, 0) + 1
            insort(names.setdefault(after, []), node)
            placed[source].append(Move(pod=pod, gpus=gpus, to=node))
    return placed


def _where(moves: Collection[Move]) -> str:
    per_node: dict[str, int] = {}
    for move in moves:
        per_node[move.to] = per_node.get(move.to, 0) + move.gpus
    return ", ".join(f"{node} ({_plural(gpus, 'GPU', 'GPUs')})" for node, gpus in per_node.items())


def one_at_a_time(snapshot: ClusterSnapshot, *, selector: Mapping[str, str],
                  scoring: str = Scoring.LEAST_ALLOCATED) -> dict[str, int]:
    """What defragging the GPU map's candidates one at a time, in its rank order, does to the
    pool when each node's replacements land where the scheduler puts them with only that node
    cordoned: nodes freed, pod moves, pods moved more than once and replacements landing on a
    later candidate. The baseline a campaign is measured against (bench/campaign.py)."""
    advice = defrag_advice(snapshot, scoring=scoring)
    pool_names = {n.name for n in snapshot.nodes if selects(selector, n)}
    steps = [s for s in advice.steps if s.outcome == Freeing.TOGETHER and s.node in pool_names]
    candidates = {s.node for s in steps}
    moved: dict[str, int] = {}
    onto_candidates = 0
    for step in steps:
        for move in step.moves:
            moved[move.pod] = moved.get(move.pod, 0) + 1
            onto_candidates += move.to in candidates
    return {"freed": len(steps), "pods_moved": sum(s.pods_moved for s in steps),
            "pods_moved_twice": sum(1 for n in moved.values() if n > 1),
            "replacements_on_candidates": onto_candidates}
