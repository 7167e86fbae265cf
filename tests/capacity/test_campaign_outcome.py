"""What a campaign did, read from the cluster before and after it, against its plan."""
from __future__ import annotations

from datetime import UTC, datetime

from defrag_builders import make_model_pod, make_node
from capacity.campaigns.outcome import campaign_outcome
from capacity.campaigns.planning import campaign_plan
from capacity.gpumap.advice import Scoring
from clusters.snapshot import ClusterSnapshot, NodeView, PodView

NOW = datetime(2026, 1, 1, tzinfo=UTC)
H100 = {"karpenter.sh/nodepool": "h100"}


def snap(nodes, pods) -> ClusterSnapshot:
    return ClusterSnapshot.build(taken_at=NOW, nodes=[NodeView.from_object(n) for n in nodes],
                                 pods=[PodView.from_object(p) for p in pods])


NODES = [make_node(n) for n in "abc"]
BEFORE = [make_model_pod("a-0", revision="ma-00001", node="a", gpus=2),
          make_model_pod("b-0", revision="mb-00001", node="b", gpus=4),
          make_model_pod("c-0", revision="mc-00001", node="c", gpus=4)]


def test_replacements_where_the_plan_put_them_agree_and_the_same_nodes_are_freed():
    before = snap(NODES, BEFORE)
    plan = campaign_plan(before, selector=H100, scoring=Scoring.MOST_ALLOCATED)
    assert plan.node_names == ("a",)
    target = plan.moves[0].to
    after = snap(NODES, BEFORE + [make_model_pod("a-1", revision="ma-00001", node=target, gpus=2)])
    outcome = campaign_outcome(plan, before=before, after=after, node_states={"a": ("safe", "")},
                               seconds_to_all_safe=42.0)
    assert outcome.same_nodes_as_planned and outcome.freed == ("a",)
    assert (outcome.pods_moved, outcome.replacements_on_campaign_nodes) == (1, 0)
    assert (outcome.placements_agreeing, outcome.placements_planned) == (1, 1)
    assert outcome.report_lines()[:4] == [
        "Freed 1 of the 1 planned node(s) — the nodes the plan named.",
        "Pods moved: 1; replacements on campaign nodes: 0.",
        "Replacements placed as planned: 1 of 1.",
        "Time to all safe: 42 s."]


def test_a_replacement_elsewhere_a_pending_one_and_a_dropped_node_are_reported():
    before = snap(NODES, BEFORE)
    plan = campaign_plan(before, selector=H100, scoring=Scoring.MOST_ALLOCATED)
    pending = make_model_pod("a-2", revision="ma-00001", node=None, gpus=2)
    after = snap(NODES, BEFORE + [make_model_pod("a-1", revision="ma-00001", node="a", gpus=2), pending])
    outcome = campaign_outcome(plan, before=before, after=after, node_states={"a": ("dropped", "no room")},
                               seconds_to_all_safe=None)
    assert outcome.freed == () and not outcome.same_nodes_as_planned
    assert outcome.dropped == {"a": "no room"} and outcome.pods_moved == 0
    assert "Dropped a: no room" in outcome.report_lines()

    safe = campaign_outcome(plan, before=before, after=after, node_states={"a": ("safe", "")},
                            seconds_to_all_safe=10.0)
    assert safe.replacements_on_campaign_nodes == 1
    assert [p for p, _ in safe.pending] == ["org-a/a-2"]
    assert safe.placements_agreeing == 0 and len(safe.disagreements) == 1
    assert any(line.startswith("Stuck: org-a/a-2 is Pending") for line in safe.report_lines())
