"""What the dashboard and the GPU map show of the campaign proposals: a line per pool, and
the marks the map draws beside the campaign's nodes (their position, where their pods go,
the empty nodes kept empty). Every number comes from the proposal row and its plan, so the
two pages and the row agree."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from orgs.planning import duration_words

from capacity.campaigns.models import CampaignPolicy, CampaignProposal
from capacity.campaigns.planning import CampaignPlan, pool_selector_text
from capacity.campaigns.pools import consolidate_command

# Characters of a node's mark drawn beside its map row, its position and moves (12 px bold
# monospace, ~7.2 px each: ~320 px, what a 1366 px screen has between an 8-GPU map and its
# legend); a longer text ends in "…", and the whole of it is the mark's title.
MARK_CHARS = 44


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class ProposalLine:
    """One pool's proposal as the pages say it."""

    row: CampaignProposal
    plan: CampaignPlan
    command: str
    age: str             # "3 min", "under a minute"
    rehearsed: str = "no"   # "yes — freed 2 of 2 (5 min)", "yes — freed 1 of 2: see rehearsal #4"
    acting: str = "acts on its own: off"   # the pool's policy: its window and budget, or off

    @property
    def pool(self) -> str:
        return self.row.pool

    @property
    def selector_text(self) -> str:
        return pool_selector_text(self.row.selector)

    @property
    def text(self) -> str:
        row = self.row
        return (f"{_plural(row.freed, 'node', 'nodes')} of pool {row.pool} can be freed together as one campaign "
                f"({_plural(row.gpus_freed, 'GPU', 'GPUs')}); "
                f"{'1 pod moves once' if row.pods_moved == 1 else f'{row.pods_moved} pods move once each'}; at most {self.plan.most_freeable} could be freed by any plan (the pool's requests fit "
                f"on {_plural(row.lower_bound, 'node', 'nodes')} of its {self.plan.pool_nodes}"
                f"{f', {self.plan.empty_nodes} already empty' if self.plan.empty_nodes else ''}); "
                f"rehearsed: {self.rehearsed}")


def rehearsed_words(row: CampaignProposal, *, now: datetime) -> str:
    """Whether a rehearsal on a dump of the cluster ran this proposal's plan, and what it freed."""
    rehearsal = row.rehearsal if row.rehearsed else None
    if rehearsal is None:
        return "no"
    if rehearsal.freed_all:
        when = rehearsal.finished_at or rehearsal.started_at
        return f"yes — freed {rehearsal.freed} of {rehearsal.planned} ({duration_words(now - when)} ago)"
    return f"yes — freed {rehearsal.freed or 0} of {rehearsal.planned}: see rehearsal #{rehearsal.pk}"


def acting_words(policy: CampaignPolicy | None, *, plan: CampaignPlan, now: datetime) -> str:
    """"acts on its own: <schedule> for <duration> (UTC), at most <nodes> per campaign — next
    window opens at …", or "acts on its own: off" (no policy for the pool: off)."""
    if policy is None:
        return "acts on its own: off"
    return policy.terms.words(pool_nodes=plan.pool_nodes, now=now)


def proposal_lines(rows: list[CampaignProposal], *, cluster: str, now: datetime,
                   policies: Mapping[str, CampaignPolicy] | None = None) -> list[ProposalLine]:
    """The proposals that free a node, by pool: a pool with nothing to free has no line.
    `policies`: the cluster's pool policies by selector text."""
    lines = []
    for row in rows:
        if row.freed <= 0:
            continue
        plan = row.campaign
        lines.append(ProposalLine(
            row=row, plan=plan, command=consolidate_command(cluster=cluster, selector=row.selector),
            age=duration_words(now - row.computed_at), rehearsed=rehearsed_words(row, now=now),
            acting=acting_words((policies or {}).get(pool_selector_text(row.selector)), plan=plan, now=now)))
    return lines


@dataclass(frozen=True)
class NodeMark:
    """What the map draws beside a campaign node or a node the campaign keeps empty."""

    label: str           # "#2" (with its pool on a map of several pools) or "kept empty"
    text: str            # the label and "→ gpu-h100-05 (1 GPU), …", cut to MARK_CHARS
    title: str           # the whole text
    kept_empty: bool = False


def _cut(text: str) -> str:
    """`text` in MARK_CHARS at most, cut between destinations ("#5 → n1 (2 GPUs), +1 more"),
    never inside a name or a count; the whole text is the mark's title."""
    if len(text) <= MARK_CHARS:
        return text
    parts = text.split(", ")
    for kept in range(len(parts) - 1, 0, -1):
        cut = f"{', '.join(parts[:kept])}, +{len(parts) - kept} more"
        if len(cut) <= MARK_CHARS:
            return cut
    return text[:MARK_CHARS - 1] + "…"   # one destination longer than the mark: a node name past 30 characters


def _moves_text(plan: CampaignPlan, node: str) -> str:
    per_node: dict[str, int] = {}
    for move in next(n for n in plan.nodes if n.node == node).moves:
        per_node[move.to] = per_node.get(move.to, 0) + move.gpus
    return "→ " + ", ".join(f"{to} ({_plural(gpus, 'GPU', 'GPUs')})" for to, gpus in per_node.items())


def moves_by_node(plan: CampaignPlan) -> list[dict]:
    """The campaign's nodes in order, each with its moves in words (the map's campaign table)."""
    return [{"node": n, "moves": _moves_text(plan, n.node)} for n in plan.nodes]


def node_marks(lines: list[ProposalLine], *, several_pools: bool) -> dict[str, NodeMark]:
    """Node name → its mark, for the campaign nodes and kept-empty nodes of `lines`."""
    marks: dict[str, NodeMark] = {}
    for line in lines:
        prefix = f"{line.pool} " if several_pools else ""   # positions are per pool
        for node in line.plan.nodes:
            moves = _moves_text(line.plan, node.node)
            label = f"{prefix}#{node.position}"
            marks[node.node] = NodeMark(label=label, text=_cut(f"{label} {moves}"),
                                        title=f"campaign {prefix}#{node.position}: frees "
                                              f"{_plural(node.gpus, 'GPU', 'GPUs')}; its pods {moves}")
        for name in line.plan.kept_empty:
            marks[name] = NodeMark(label=f"{prefix}kept empty", text=_cut(f"{prefix}kept empty"),
                                   title=f"kept empty by the {line.pool} campaign: cordoned while it runs, so the "
                                         "scheduler puts no moved pod on it, and returned to service at the end",
                                   kept_empty=True)
    return marks
