"""What the dashboard and the GPU map show of the campaign proposals: a line per pool, and
the marks the map draws beside the campaign's nodes (their position, where their pods go,
the empty nodes kept empty). Every number comes from the proposal row and its plan, so the
two pages and the row agree."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orgs.planning import duration_words

from capacity.campaigns.models import CampaignProposal
from capacity.campaigns.planning import CampaignPlan, pool_selector_text
from capacity.campaigns.pools import consolidate_command

# Characters of a node's moves drawn beside its map row (12 px monospace, ~7.2 px each:
# ~290 px, what a 1366 px screen has beside the map); the whole text is the mark's title.
MOVES_CHARS = 40


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class ProposalLine:
    """One pool's proposal as the pages say it."""

    row: CampaignProposal
    plan: CampaignPlan
    command: str
    age: str             # "3 min", "under a minute"

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
                f"({_plural(row.gpus_freed, 'GPU', 'GPUs')}); {_plural(row.pods_moved, 'pod moves', 'pods move')} "
                f"once each; at most {self.plan.most_freeable} could be freed by any plan (the pool's requests fit "
                f"on {_plural(row.lower_bound, 'node', 'nodes')} of its {self.plan.pool_nodes}"
                f"{f', {self.plan.empty_nodes} already empty' if self.plan.empty_nodes else ''}); "
                f"rehearsed: {'yes' if row.rehearsed else 'no'}")


def proposal_lines(rows: list[CampaignProposal], *, cluster: str, now: datetime) -> list[ProposalLine]:
    """The proposals that free a node, by pool: a pool with nothing to free has no line."""
    return [ProposalLine(row=row, plan=row.campaign, command=consolidate_command(cluster=cluster, selector=row.selector),
                         age=duration_words(now - row.computed_at))
            for row in rows if row.freed > 0]


@dataclass(frozen=True)
class NodeMark:
    """What the map draws beside a campaign node or a node the campaign keeps empty."""

    label: str           # "#2" (with its pool on a map of several pools) or "kept empty"
    moves: str           # "→ gpu-h100-05 (1 GPU), …": cut to MOVES_CHARS
    title: str           # the whole text
    kept_empty: bool = False


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
        prefix = f"{line.pool} " if several_pools else ""
        for node in line.plan.nodes:
            moves = _moves_text(line.plan, node.node)
            shown = moves if len(moves) <= MOVES_CHARS else moves[:MOVES_CHARS - 1] + "…"
            marks[node.node] = NodeMark(label=f"{prefix}#{node.position}", moves=shown,
                                        title=f"campaign {prefix}#{node.position}: frees "
                                              f"{_plural(node.gpus, 'GPU', 'GPUs')}; its pods {moves}")
        for name in line.plan.kept_empty:
            marks[name] = NodeMark(label=f"{prefix}kept empty", moves="",
                                   title=f"kept empty by the {line.pool} campaign: cordoned while it runs, so the "
                                         "scheduler puts no moved pod on it, and returned to service at the end",
                                   kept_empty=True)
    return marks
