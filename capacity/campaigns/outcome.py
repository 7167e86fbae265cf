"""What a campaign did, read from the cluster before and after it (no ORM, no HTTP, no clock):
nodes freed, pods moved, where their replacements landed, and where that differs from the
plan. A rehearsal reports it before anyone touches the real cluster; the same comparison
tells whether the rehearsal predicted the real run."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from clusters.labels import REVISION_LABEL
from clusters.snapshot import ClusterSnapshot

from capacity.campaigns.planning import CampaignPlan


@dataclass(frozen=True)
class Placement:
    """The plan's and the scheduler's nodes for one revision's moved pods."""

    revision: str               # namespace/revision
    planned: tuple[str, ...]    # nodes the plan put its moved pods on
    landed: tuple[str, ...]     # nodes its replacements run on (or "" while Pending)

    @property
    def agreeing(self) -> int:
        return sum((Counter(self.planned) & Counter(self.landed)).values())


@dataclass(frozen=True)
class CampaignOutcome:
    planned: tuple[str, ...]               # the plan's nodes, in order
    freed: tuple[str, ...]                 # nodes the campaign reported safe (or drained)
    dropped: Mapping[str, str]             # node → why the campaign dropped it
    pods_moved: int                        # model pods of the freed nodes that were replaced
    replacements: tuple[tuple[str, str], ...]   # (namespace/pod, node; "" while Pending)
    replacements_on_campaign_nodes: int
    pending: tuple[tuple[str, str], ...]   # (namespace/pod, the scheduler's reason)
    placements: tuple[Placement, ...]
    seconds_to_all_safe: float | None      # from the start to the last node safe; None if not all were
    notes: tuple[str, ...] = field(default=())

    @property
    def same_nodes_as_planned(self) -> bool:
        return set(self.freed) == set(self.planned)

    @property
    def placements_agreeing(self) -> int:
        return sum(p.agreeing for p in self.placements)

    @property
    def placements_planned(self) -> int:
        return sum(len(p.planned) for p in self.placements)

    @property
    def disagreements(self) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.agreeing < len(p.planned))

    def report_lines(self) -> list[str]:
        lines = [f"Freed {len(self.freed)} of the {len(self.planned)} planned node(s)"
                 + (" — the nodes the plan named." if self.same_nodes_as_planned else
                    f": {', '.join(self.freed) or 'none'} (planned {', '.join(self.planned)})."),
                 f"Pods moved: {self.pods_moved}; replacements on campaign nodes: "
                 f"{self.replacements_on_campaign_nodes}.",
                 f"Replacements placed as planned: {self.placements_agreeing} of {self.placements_planned}."]
        if self.seconds_to_all_safe is not None:
            lines.append(f"Time to all safe: {_duration(self.seconds_to_all_safe)}.")
        for node, why in sorted(self.dropped.items()):
            lines.append(f"Dropped {node}: {why}")
        for pod, why in self.pending:
            lines.append(f"Stuck: {pod} is Pending ({why or 'no reason given'})")
        for p in self.disagreements:
            lines.append(f"  {p.revision}: planned on {', '.join(p.planned)}, landed on "
                         f"{', '.join(n or 'nowhere yet' for n in p.landed) or 'nowhere yet'}")
        lines.extend(self.notes)
        return lines

    def to_dict(self) -> dict:
        data = asdict(self)
        data["dropped"] = dict(self.dropped)
        data.update(same_nodes_as_planned=self.same_nodes_as_planned,
                    placements_agreeing=self.placements_agreeing, placements_planned=self.placements_planned)
        return data


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def campaign_outcome(plan: CampaignPlan, *, before: ClusterSnapshot, after: ClusterSnapshot,
                     node_states: Mapping[str, tuple[str, str]], seconds_to_all_safe: float | None) -> CampaignOutcome:
    """The outcome of `plan`'s campaign. `node_states`: node → (state, dropped reason), the
    campaign's own record ("safe", "drained", "dropped", …); `before` was read when the
    campaign started, `after` when it ended."""
    freed = tuple(n for n in plan.node_names if node_states.get(n, ("", ""))[0] in ("safe", "drained"))
    dropped = {n: why for n, (state, why) in node_states.items() if state == "dropped"}
    campaign_nodes = set(plan.node_names) | set(plan.kept_empty)
    before_uids = {p.uid for p in before.pods}
    revision_of = {f"{p.namespace}/{p.name}": f"{p.namespace}/{p.labels.get(REVISION_LABEL, '')}"
                   for p in before.pods if p.labels.get(REVISION_LABEL)}
    planned: dict[str, list[str]] = {}
    for move in plan.moves:
        if move.source in freed and move.pod in revision_of:
            planned.setdefault(revision_of[move.pod], []).append(move.to)
    moved_revisions = set(planned)
    landed: dict[str, list[str]] = {}
    replacements, pending = [], []
    for pod in sorted(after.pods, key=lambda p: (p.namespace, p.name)):
        revision = f"{pod.namespace}/{pod.labels.get(REVISION_LABEL, '')}"
        if pod.uid in before_uids or revision not in moved_revisions or pod.gpus <= 0 or not pod.live:
            continue
        node = pod.node_name or ""
        replacements.append((f"{pod.namespace}/{pod.name}", node))
        landed.setdefault(revision, []).append(node)
        if not node:
            pending.append((f"{pod.namespace}/{pod.name}", pod.unschedulable_message or ""))
    placements = tuple(Placement(revision=r, planned=tuple(sorted(planned[r])), landed=tuple(sorted(landed.get(r, ()))))
                       for r in sorted(planned))
    return CampaignOutcome(
        planned=plan.node_names, freed=freed, dropped=dropped,
        pods_moved=sum(len(v) for v in planned.values()), replacements=tuple(replacements),
        replacements_on_campaign_nodes=sum(1 for _, node in replacements if node in campaign_nodes),
        pending=tuple(pending), placements=placements,
        seconds_to_all_safe=seconds_to_all_safe if len(freed) == len(plan.node_names) else None)
