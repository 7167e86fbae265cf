"""Consolidation campaigns carried out on the simulated cluster, through the real client over
HTTP: the planned nodes freed with no pod landing on a campaign node, budgets, drops, abort."""
from __future__ import annotations

import pytest

from audit.selectors import entries_of_subject
from capacity.campaigns.models import Campaign, CampaignState, NodeRole, NodeState
from capacity.campaigns.services import CampaignError, campaign_abort, campaign_start
from capacity.defrag.models import DefragOrphan, JobState
from campaign_cluster import OPERATOR, half_full_pool, plan_now, run, start, tick
from defrag_builders import make_pod
from defrag_cluster import NS

pytestmark = pytest.mark.django_db


def pods_by_node(world) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pod in world.kube.pods():
        if pod.metadata.deletion_timestamp is None:
            out.setdefault(pod.spec.node_name, []).append(pod.metadata.name)
    return out


def campaign_audit(campaign):
    return list(entries_of_subject(subject_type="campaign", subject_id=campaign.pk, oldest_first=True))


def test_a_campaign_frees_exactly_the_planned_nodes_each_pod_moving_once_and_never_onto_a_campaign_node(
        defrag_world):
    world = defrag_world(half_full_pool())
    before = pods_by_node(world)
    assert sorted(len(p) for p in before.values()) == [2] * 6
    plan = plan_now(world)
    assert plan.freed == 3 and plan.replacements_on_campaign_nodes == 0
    campaign = start(world, max_in_flight=2, drain_when_safe=True)

    campaign = run(world, campaign)

    assert campaign.state == CampaignState.DONE
    freed = set(plan.node_names)
    rows = {n.node_name: n for n in campaign.nodes.filter(role=NodeRole.FREED)}
    assert {n: r.state for n, r in rows.items()} == {n: NodeState.DRAINED for n in plan.node_names}
    after = pods_by_node(world)
    # The planned nodes are empty and stay cordoned (their removal is the operator's step);
    # every pod now runs on a node outside the campaign.
    assert not freed & set(after), after
    assert all(world.kube.node_cordoned(n) for n in freed)
    assert not any(world.kube.node_cordoned(n) for n in set(before) - freed)
    # Each pod of a campaign node moved once (one orphan each), no other pod moved.
    orphaned = sorted(DefragOrphan.objects.filter(job__campaign_nodes__campaign=campaign)
                      .values_list("pod_name", flat=True))
    assert orphaned == sorted(p for n in freed for p in before[n])
    untouched = {p for n in set(before) - freed for p in before[n]}
    assert untouched <= {p for pods in after.values() for p in pods}
    assert sum(len(p) for p in after.values()) == 12
    actions = [e.action for e in campaign_audit(campaign)]
    assert actions[0] == "campaign_start" and actions[-1] == "campaign_done"
    assert actions.count("node_cordon") == 3 and actions.count("node_start") == 3
    # Passes run with no operator at hand (a worker): every act is still theirs, caused by the campaign.
    assert {(e.cause, e.actor_label) for e in campaign_audit(campaign)} == {(f"campaign #{campaign.pk}", OPERATOR)}
    job = rows[plan.node_names[0]].job
    assert {(e.cause.split(") ")[-1], e.actor_label) for e in entries_of_subject(
        subject_type="defrag_job", subject_id=job.pk)} == {(f"of campaign #{campaign.pk}", OPERATOR)}


def test_max_in_flight_is_never_passed(defrag_world, settings):
    settings.CAPACITY_CAMPAIGN_REVISION_FRACTION = 1.0
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    running: list[int] = []
    campaign = run(world, campaign, seen_running=running)
    assert campaign.state == CampaignState.DONE
    assert max(running) == 1
    assert set(campaign.nodes.values_list("state", flat=True)) == {NodeState.SAFE}
    # Safe, not drained: the orphans keep serving on the cordoned nodes until the operator drains.
    assert all(r.job.state == JobState.SAFE for r in campaign.nodes.all())


def test_a_do_not_disrupt_annotation_added_after_planning_drops_that_node_and_uncordons_it(defrag_world):
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    first, second = campaign.nodes.order_by("position")[:2]
    campaign = tick(world, campaign)                   # every campaign node cordoned, the first started
    assert world.kube.node_cordoned(second.node_name)
    world.kube.core.patch_node(second.node_name,
                               {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})

    campaign = run(world, campaign)

    second.refresh_from_db()
    assert second.state == NodeState.DROPPED and second.job is None
    assert second.dropped_reason == 'the node says karpenter.sh/do-not-disrupt: "true"'
    assert not world.kube.node_cordoned(second.node_name) and second.uncordoned
    assert campaign.state == CampaignState.DONE
    assert {e.action for e in campaign_audit(campaign) if e.target == f"Node/{second.node_name}"} >= {
        "node_cordon", "node_uncordon", "node_drop"}


def test_a_pod_disruption_budget_allowing_nothing_holds_its_node_back_until_it_allows(defrag_world):
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    first = campaign.nodes.order_by("position").first()
    [pod, *_] = world.kube.pods(node=first.node_name)
    service = pod.metadata.labels["serving.knative.dev/service"]
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-all"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {"serving.knative.dev/service": service}}}}
    world.kube.policy.create_namespaced_pod_disruption_budget(NS, pdb)
    world.advance(1)

    for _ in range(3):
        campaign = tick(world, campaign)
        world.advance(2)
    first.refresh_from_db()
    assert first.state == NodeState.CORDONED and first.job is None
    assert first.waiting_reason.startswith(f"PodDisruptionBudget {NS}/keep-all allows no disruption now")
    assert world.kube.node_cordoned(first.node_name)

    world.kube.policy.patch_namespaced_pod_disruption_budget("keep-all", NS, {"spec": {"minAvailable": 1}})
    world.advance(1)
    campaign = run(world, campaign, until=lambda c: c.nodes.get(pk=first.pk).state != NodeState.CORDONED)
    first.refresh_from_db()
    assert first.state == NodeState.RUNNING and first.job is not None and first.waiting_reason == ""


def test_a_plan_no_longer_true_at_start_is_refused_and_nothing_starts(defrag_world):
    world = defrag_world(half_full_pool())
    plan = plan_now(world)
    world.kube.core.patch_node(plan.node_names[2], {"spec": {"unschedulable": True}})
    with pytest.raises(CampaignError, match=rf"changed since the plan was shown.*{plan.node_names[2]} \(cordoned\)"):
        campaign_start(cluster=world.cluster, plan=plan, actor=None, max_in_flight=1, gateway=world.gateway,
                       now=world.now(), enqueue=False)
    assert not Campaign.objects.exists()
    assert [n for n in plan.node_names if world.kube.node_cordoned(n)] == [plan.node_names[2]]


def test_abort_midway_uncordons_what_the_campaign_cordoned_and_leaves_what_it_did_not(defrag_world):
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    first, second, third = campaign.nodes.order_by("position")
    # An operator cordons the third node before the campaign's first pass: not its cordon.
    world.kube.core.patch_node(third.node_name, {"spec": {"unschedulable": True}})
    campaign = tick(world, campaign)
    first.refresh_from_db()
    third.refresh_from_db()
    assert first.state == NodeState.RUNNING and not third.cordoned_by_campaign
    world.advance(2)
    campaign = tick(world, campaign)                   # the first job orphans its pods

    campaign = campaign_abort(campaign=campaign, actor=None, now=world.now(), enqueue=False)
    again = campaign_abort(campaign=campaign, actor=None, now=world.now(), enqueue=False)
    assert again.abort_requested_at == campaign.abort_requested_at      # asked again: nothing new
    campaign = run(world, campaign)

    assert campaign.state == CampaignState.ABORTED
    assert not world.kube.node_cordoned(first.node_name) and not world.kube.node_cordoned(second.node_name)
    assert world.kube.node_cordoned(third.node_name)
    first.refresh_from_db()
    assert first.job.abort_requested_at is not None
    assert set(campaign.nodes.values_list("state", flat=True)) == {NodeState.ABORTED}
    entries = campaign_audit(campaign)
    assert [e.action for e in entries][-1] == "campaign_abort"
    assert {e.target for e in entries if e.action == "node_uncordon"} == {f"Node/{first.node_name}",
                                                                         f"Node/{second.node_name}"}
    second.refresh_from_db()
    assert second.job is None                          # never started, never touched again


def test_a_replacement_the_scheduler_cannot_place_drops_its_node_with_the_schedulers_reason(defrag_world):
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    campaign = tick(world, campaign)                   # all three cordoned, the first started
    first = campaign.nodes.get(position=1)
    outside = set(pods_by_node(world)) - set(campaign.nodes.values_list("node_name", flat=True))
    for node in sorted(outside):                       # the room the plan counted on is taken
        world.kube.core.create_namespaced_pod(NS, make_pod(f"hog-{node}", node=node, gpus=4))

    campaign = run(world, campaign, until=lambda c: c.nodes.get(pk=first.pk).state == NodeState.DROPPED)

    first.refresh_from_db()
    assert first.dropped_reason.startswith(f"replacement {NS}/")
    assert "cannot be scheduled: " in first.dropped_reason and "Insufficient nvidia.com/gpu" in first.dropped_reason
    assert first.job.abort_requested_at is not None and not world.kube.node_cordoned(first.node_name)
