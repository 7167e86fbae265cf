"""A consolidation campaign's plan: which nodes of a pool it frees, in what order, and where
each pod lands, with every campaign node cordoned before the first pod moves."""
from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import pytest

from defrag_builders import make_model_pod, make_node, make_pod
from capacity.campaigns.planning import (
    BLOCKED,
    CLOSED,
    DO_NOT_DISRUPT_NODE,
    EMPTY,
    GOAL_MET,
    HELD,
    MAY_NOT_FIT,
    NO_ROOM,
    ON_HOLD,
    RECEIVES,
    CampaignInputError,
    CampaignPlan,
    campaign_plan,
    lower_bound_nodes,
    one_at_a_time,
    pool_selector_parse,
)
from capacity.gpumap.advice import Scoring
from clusters.snapshot import ClusterSnapshot, NodeView, PodView

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MOST, LEAST = Scoring.MOST_ALLOCATED, Scoring.LEAST_ALLOCATED
H100 = {"karpenter.sh/nodepool": "h100"}


def snapshot(layout: dict[str, list[int]], *, nodes: list[dict] = (), pods: list[dict] = ()) -> ClusterSnapshot:
    """`layout`: node → the GPUs of its model pods (8-GPU H100 nodes of pool h100)."""
    all_nodes = [make_node(name) for name in layout] + list(nodes)
    all_pods = [make_model_pod(f"{name}-{i}", revision=f"m{name}{i}-00001", node=name, gpus=g)
                for name, gpus in layout.items() for i, g in enumerate(gpus)] + list(pods)
    return ClusterSnapshot.build(taken_at=NOW, nodes=[NodeView.from_object(n) for n in all_nodes],
                                 pods=[PodView.from_object(p) for p in all_pods])


def targets(plan: CampaignPlan) -> set[str]:
    return {m.to for m in plan.moves}


def unplaced(layout: dict[str, list[int]], plan: CampaignPlan) -> str | None:
    """The first node of the plan a pod of which may find no room as the campaign runs, or
    None: every campaign node cordoned from the start, the nodes emptied in the plan's order,
    each node's pods placed by the scheduler (the best `plan.scoring` score on GPUs, every
    tie either way) in every order. Each reachable cluster state is followed."""
    sign = 1 if plan.scoring == LEAST else -1
    states = [{n: 8 - sum(g) for n, g in layout.items() if n not in plan.node_names and 0 < sum(g) < 8}]
    for node in plan.node_names:
        following = []
        for state in states:
            for order in set(itertools.permutations(layout[node])):
                branches = [state]
                for gpus in order:
                    grown = []
                    for free in branches:
                        fits = [n for n in free if free[n] >= gpus]
                        if not fits:
                            return node
                        best = max(sign * (free[n] - gpus) for n in fits)
                        grown += [{**free, n: free[n] - gpus} for n in fits if sign * (free[n] - gpus) == best]
                    branches = grown
                following += branches
        states = list({tuple(sorted(s.items())): s for s in following}.values())
    return None


@pytest.mark.parametrize("scoring", [MOST, LEAST])
def test_six_half_full_nodes_free_three_and_no_pod_lands_on_a_campaign_node(scoring):
    plan = campaign_plan(snapshot({n: [2, 2] for n in "abcdef"}), selector=H100, scoring=scoring)
    assert plan.freed == 3 and plan.gpus_freed == 24
    assert plan.pods_moved == 6 and plan.pods_moved_twice == 0 and plan.replacements_on_campaign_nodes == 0
    assert not targets(plan) & set(plan.node_names)
    # Every pod of the campaign's nodes moves, once.
    assert sorted(m.pod for m in plan.moves) == sorted(f"org-a/{n}-{i}" for n in plan.node_names for i in (0, 1))
    assert (plan.lower_bound, plan.most_freeable) == (3, 3)
    assert [o.reason for o in plan.left_out] == [RECEIVES] * 3
    assert plan.summary.startswith("3 nodes of pool karpenter.sh/nodepool=h100 can be freed (24 GPUs); 6 pods move "
                                   "once each, none onto a node of the campaign.")


def test_a_pod_the_plan_put_on_a_later_node_goes_elsewhere_once_that_node_joins():
    # Under LeastAllocated a's pod would go to b (the most room). With b in the campaign too
    # (cordoned from the start), the scheduler puts it on c or d instead: a and b are both freed.
    plan = campaign_plan(snapshot({"a": [1], "b": [2], "c": [5], "d": [5]}), selector=H100, scoring=LEAST)
    assert plan.node_names == ("a", "b")
    assert targets(plan) <= {"c", "d"}
    assert plan.pods_moved == 2 and plan.pods_moved_twice == 0
    left = {o.node: o for o in plan.left_out}
    assert left["c"].reason == RECEIVES and "of a that may land on it would need room elsewhere" in left["c"].why


def test_the_campaign_against_one_node_at_a_time_on_the_same_cluster():
    snap = snapshot({"a": [1], "b": [2], "c": [5], "d": [5]})
    campaign = campaign_plan(snap, selector=H100, scoring=LEAST)
    alone = one_at_a_time(snap, selector=H100, scoring=LEAST)
    assert campaign.pods_moved_twice == 0
    assert alone["freed"] >= 1
    assert campaign.freed >= alone["freed"] or alone["pods_moved_twice"] > 0


def test_goal_stops_at_k_nodes_and_says_why_the_rest_stay():
    plan = campaign_plan(snapshot({n: [2, 2] for n in "abcdef"}), selector=H100, goal=1, scoring=MOST)
    assert plan.freed == 1 and plan.goal_met
    assert {o.reason for o in plan.left_out} == {GOAL_MET}
    short = campaign_plan(snapshot({"a": [4], "b": [4]}), selector=H100, goal=2, scoring=MOST)
    assert short.freed == 1 and not short.goal_met
    assert "; 2 asked for." in short.summary


def test_nodes_that_cannot_move_are_left_out_each_with_its_reason():
    extra_nodes = [make_node("dnd"), make_node("held"), make_node("closed", unschedulable=True),
                   make_node("empty"), make_node("nb"), make_node("hold")]
    extra_nodes[0]["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    extra_pods = [
        make_model_pod("dnd-0", revision="mdnd-00001", node="dnd", gpus=1),
        make_model_pod("held-0", revision="mheld-00001", node="held", gpus=1),
        make_model_pod("closed-0", revision="mclosed-00001", node="closed", gpus=1),
        make_pod("nb-0", node="nb", gpus=1, owner=("StatefulSet", "notebook")),
        make_model_pod("hold-0", revision="llama-00001", node="hold", gpus=1),
    ]
    plan = campaign_plan(snapshot({"a": [6]}, nodes=extra_nodes, pods=extra_pods), selector=H100, scoring=MOST,
                         held_nodes={"held"}, holds={("org-a", "llama"): "snoozed until Monday"})
    left = {o.node: o for o in plan.left_out}
    assert {n: o.reason for n, o in left.items() if n != "a"} == {
        "dnd": DO_NOT_DISRUPT_NODE, "held": HELD, "closed": CLOSED, "empty": EMPTY, "nb": BLOCKED, "hold": ON_HOLD}
    assert "org-a/llama is on hold (snoozed until Monday)" in left["hold"].why
    assert "org-a/nb-0 (StatefulSet pod" in left["nb"].why
    # Nodes left out still take moved pods, except those that take none (cordoned, held
    # by a job) and, under MostAllocated, the empty one while others fit.
    assert plan.node_names == ("a",) and targets(plan) <= {"dnd", "nb", "hold"}


def test_a_node_whose_pods_fit_nowhere_outside_the_campaign_is_left_out():
    plan = campaign_plan(snapshot({"a": [6], "b": [6]}), selector=H100, scoring=MOST)
    assert plan.freed == 0
    assert {o.node: o.reason for o in plan.left_out} == {"a": NO_ROOM, "b": NO_ROOM}
    assert "its pods need 6 GPUs; they do not fit outside the campaign (other non-empty nodes have 2 free GPU(s)" \
        in plan.left_out[0].why
    assert plan.summary.startswith("No node of pool karpenter.sh/nodepool=h100 can be freed.")


def test_under_least_allocated_the_pools_empty_nodes_are_kept_empty_while_it_runs():
    snap = snapshot({"a": [2], "b": [4]}, nodes=[make_node("z")])
    plan = campaign_plan(snap, selector=H100, scoring=LEAST)
    assert plan.node_names == ("a",) and plan.kept_empty == ("z",)
    assert targets(plan) == {"b"}
    assert any("Kept empty while it runs" in line and "z" in line for line in plan.report_lines())
    packing = campaign_plan(snap, selector=H100, scoring=MOST)
    assert packing.kept_empty == () and targets(packing) == {"b"}


def test_room_outside_the_pool_of_the_same_gpu_product_counts():
    other_pool = make_node("o", pool="h100-reserved")
    snap = snapshot({"a": [3]}, nodes=[other_pool], pods=[make_model_pod("o-0", revision="mo-00001", node="o", gpus=4)])
    plan = campaign_plan(snap, selector=H100, scoring=MOST)
    assert plan.node_names == ("a",) and targets(plan) == {"o"}
    assert plan.pool_nodes == 1


def test_the_plan_survives_being_stored():
    plan = campaign_plan(snapshot({n: [2, 2] for n in "abcd"}, nodes=[make_node("z")]), selector=H100, scoring=LEAST)
    assert CampaignPlan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize("text, error", [
    ("", "--pool takes KEY=VALUE node labels"),
    ("h100", "not 'h100'"),
    ("a=1,a=2", "names label 'a' twice"),
    ("a=", "not 'a='"),
])
def test_a_bad_pool_selector_is_refused_naming_what_is_wrong(text, error):
    with pytest.raises(CampaignInputError, match=error):
        pool_selector_parse(text)


def test_a_pool_or_goal_that_points_at_nothing_is_refused():
    assert pool_selector_parse("karpenter.sh/nodepool=h100, zone=a") == {"karpenter.sh/nodepool": "h100", "zone": "a"}
    with pytest.raises(CampaignInputError, match="no GPU node has the labels karpenter.sh/nodepool=nosuch"):
        campaign_plan(snapshot({"a": [1]}), selector={"karpenter.sh/nodepool": "nosuch"})
    with pytest.raises(CampaignInputError, match="must be 1 or more, not 0"):
        campaign_plan(snapshot({"a": [1]}), selector=H100, goal=0)


@pytest.mark.parametrize("sizes, requested, expected", [
    ([8, 8, 8], 0, 0), ([8, 8, 8], 1, 1), ([8, 8, 8], 16, 2), ([8, 8, 8], 17, 3), ([4, 16, 8], 20, 2)])
def test_lower_bound_is_the_fewest_nodes_the_requests_fit_on(sizes, requested, expected):
    assert lower_bound_nodes(sizes, requested) == expected


def test_a_campaign_nodes_mark_on_the_map_is_cut_between_destinations_never_inside_one():
    """The GPU map's mark beside a campaign node whose pods go to three nodes: what does not
    fit says how many destinations more ("+1 more"), never "gpu-h100-03 (1 G…"; the title
    keeps every destination."""
    from types import SimpleNamespace

    from capacity.campaigns.display import MARK_CHARS, ProposalLine, node_marks
    from capacity.campaigns.planning import CampaignMove, CampaignNode, CampaignPlan

    moves = tuple(CampaignMove(pod=f"org-a/m{i}", gpus=gpus, source="gpu-h100-00", to=to)
                  for i, (to, gpus) in enumerate([("gpu-h100-01", 2), ("gpu-h100-03", 1), ("gpu-h100-05", 1)]))
    plan = CampaignPlan(selector={"pool": "h100"}, goal=None, scoring="LeastAllocated",
                        nodes=(CampaignNode(node="gpu-h100-00", position=5, gpus=8, gpus_moved=4, moves=moves,
                                            why=""),),
                        left_out=(), kept_empty=(), pool_nodes=8, pool_gpus=64, gpus_requested=19, lower_bound=3)
    line = ProposalLine(row=SimpleNamespace(pool="h100"), plan=plan, command="", age="1 min")
    mark = node_marks([line], several_pools=False)["gpu-h100-00"]
    assert len(mark.text) <= MARK_CHARS
    assert mark.text == "#5 → gpu-h100-01 (2 GPUs), +2 more", mark.text
    assert mark.title.endswith("→ gpu-h100-01 (2 GPUs), gpu-h100-03 (1 GPU), gpu-h100-05 (1 GPU)")


def test_a_node_is_promised_only_if_its_pods_fit_with_every_campaign_node_cordoned_from_the_start():
    # Taken one by one, d's pod would go to c (the most room), and c's pods then to a and b.
    # But with c cordoned from the start too, d's pod goes to a, and c's 3-GPU pod has no room
    # left: only d is promised, and its pod goes to c.
    layout = {"a": [3, 2], "b": [4, 2, 1], "c": [3], "d": [1]}
    plan = campaign_plan(snapshot(layout), selector=H100, scoring=LEAST)
    assert plan.node_names == ("d",)
    assert [m.to for m in plan.moves] == ["c"]
    left = {o.node: o for o in plan.left_out}
    assert left["c"].reason == MAY_NOT_FIT
    assert "the 1 node before it emptied first" in left["c"].why and "not promised" in left["c"].why
    assert unplaced(layout, plan) is None


def test_a_node_whose_pods_fit_only_if_the_scheduler_takes_the_largest_first_is_not_promised():
    # a's pods fit (4 GPUs on b, 1 on c) only if the 4-GPU replacement is placed first; the
    # scheduler takes them in its own order, and the 1-GPU one first goes to b and leaves 3.
    layout = {"a": [1, 4], "b": [4], "c": [4, 3]}
    plan = campaign_plan(snapshot(layout), selector=H100, scoring=LEAST)
    assert plan.node_names == ()
    assert {o.node: o.reason for o in plan.left_out}["a"] == MAY_NOT_FIT
    assert plan.summary.startswith("No node of pool karpenter.sh/nodepool=h100 can be freed")


@pytest.mark.parametrize("scoring", [LEAST, MOST])
def test_every_node_a_plan_frees_finds_room_in_whatever_order_the_scheduler_places_its_pods(scoring):
    rng = random.Random(7)
    planned = 0
    for _ in range(300):
        layout = {}
        for name in "abcdef"[:rng.randint(3, 6)]:
            pods = [rng.choice((1, 1, 2, 2, 3, 4)) for _ in range(rng.randint(1, 3))]
            while sum(pods) > 7:
                pods.pop()
            layout[name] = pods
        plan = campaign_plan(snapshot(layout), selector=H100, scoring=scoring)
        assert unplaced(layout, plan) is None, (layout, plan.node_names)
        planned += plan.freed
    assert planned > 100    # the layouts do leave nodes to free
