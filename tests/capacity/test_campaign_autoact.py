"""Campaigns that start on their own: the proposals task over a simulated cluster starts a
pool's proposed campaign only where an operator enabled a policy, inside its window and
within its node budget, and audits the act with the proposal it came from; the panel's
policy form refuses bad input and audits every change."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from audit.selectors import entries_of_subject
from capacity.campaigns.models import (
    LIVE_CAMPAIGN_STATES,
    Campaign,
    CampaignPolicy,
    CampaignProposal,
    CampaignState,
)
from capacity.campaigns.selectors import campaign_plan_read
from capacity.campaigns.services import (
    campaign_abort,
    campaign_proposals_act,
    campaign_proposals_compute,
    campaign_start,
    campaign_step,
)
from capacity.campaigns.tasks import campaign_proposals_all
from clusters import kube
from config import clock
from test_campaign_proposals import ProductClock, objects

pytestmark = pytest.mark.django_db

H100 = {"karpenter.sh/nodepool": "h100"}


@pytest.fixture
def cluster(sim_cluster_factory, settings):
    settings.CAPACITY_SCHEDULER_SCORING = "MostAllocated"
    handle = sim_cluster_factory(objects(), name="sim")
    handle.control.advance(5)
    return handle


@pytest.fixture
def product_clock(settings, tmp_path) -> ProductClock:
    settings.CLOCK_OFFSET_FILE = str(tmp_path / "clock-offset")
    return ProductClock(tmp_path / "clock-offset")


def daily_at(moment) -> str:
    """A cron expression that fires once a day at `moment`'s minute (UTC)."""
    return f"{moment.minute} {moment.hour} * * *"


def policy(cluster, **values) -> CampaignPolicy:
    return CampaignPolicy.objects.create(cluster=cluster.cluster, selector="karpenter.sh/nodepool=h100",
                                         **{"enabled": True, "nodes": "1", **values})


def auto_campaigns(cluster):
    return list(Campaign.objects.filter(cluster=cluster.cluster, source__startswith="proposal:"))


def test_inside_its_window_the_proposal_starts_with_the_budget_goal_and_is_audited(cluster, celery_eager,
                                                                                   product_clock):
    now = clock.now()
    row = policy(cluster, schedule=daily_at(now), duration="1h", nodes="20%")   # 20% of 5 nodes: 1

    campaign_proposals_all.apply()

    proposal = CampaignProposal.objects.get(cluster=cluster.cluster, pool="h100")
    assert proposal.freed == 2 and proposal.campaign.node_names == ("h1", "h2")
    [campaign] = auto_campaigns(cluster)
    # The budget frees one of the two: the first node of the proposal's order.
    assert campaign.goal == 1 and [n.node_name for n in campaign.nodes.all()] == ["h1"]
    assert campaign.source == f"proposal:{proposal.pk}" and campaign.requested_by is None
    assert campaign.requested_by_label == f"schedule: campaign policy #{row.pk}"
    assert campaign.max_in_flight == 1 and not campaign.drain_when_safe
    # The campaign's own audit says where it came from; the policy's says which proposal and terms.
    [started] = [e for e in entries_of_subject(subject_type="campaign", subject_id=campaign.pk)
                 if e.action == "campaign_start"]
    assert started.new["source"] == f"proposal:{proposal.pk}" and started.new["nodes"] == ["h1"]
    assert started.actor is None and started.actor_label == f"schedule: campaign policy #{row.pk}"
    [act] = entries_of_subject(subject_type="campaign_policy", subject_id=row.pk)
    assert act.action == "campaign_auto_start" and act.cause == f"proposal #{proposal.pk}"
    assert (act.new["proposal"], act.new["campaign"], act.new["goal"], act.new["budget_nodes"],
            act.new["proposal_freed"]) == (proposal.pk, campaign.pk, 1, 1, 2)
    assert act.new["terms"]["schedule"] == daily_at(now) and act.new["terms"]["nodes"] == "20%"
    row.refresh_from_db()
    assert row.last_act_proposal == proposal.pk and row.last_act.startswith(f"campaign #{campaign.pk} started")

    # Ten minutes on, still in the window: the campaign is live, so nothing more starts.
    product_clock.advance(timedelta(minutes=10))
    campaign_proposals_all.apply()
    assert len(auto_campaigns(cluster)) == 1
    assert len(entries_of_subject(subject_type="campaign_policy", subject_id=row.pk)) == 1

    # An operator aborts it; the window's one campaign has been started, so none starts again.
    campaign_abort(campaign=campaign, actor=None, enqueue=False)
    campaign = campaign_step(campaign=campaign, now=clock.now(), enqueue=False)
    assert campaign.state == CampaignState.ABORTED
    product_clock.advance(timedelta(minutes=10))
    campaign_proposals_all.apply()
    assert len(auto_campaigns(cluster)) == 1
    latest = CampaignProposal.objects.filter(cluster=cluster.cluster, pool="h100").latest("computed_at")
    [act] = campaign_proposals_act(cluster=cluster.cluster, proposals=[latest], now=clock.now())
    fired = now.replace(second=0, microsecond=0)
    assert act.decision.why == (f"a campaign started on its own at {campaign.created_at:%Y-%m-%d %H:%M} UTC, since "
                                f"the window opened at {fired:%Y-%m-%d %H:%M} UTC: one per window")


@pytest.mark.parametrize("case", ["outside the window", "disabled", "no policy", "another campaign live"])
def test_nothing_starts_on_its_own_unless_allowed(cluster, celery_eager, case):
    now = clock.now()
    why = None
    if case == "outside the window":
        opens = (now + timedelta(hours=3)).replace(second=0, microsecond=0)
        row = policy(cluster, schedule=daily_at(opens), duration="2h")
        why = f"outside its window ({daily_at(opens)} for 2h, UTC): the next window opens at {opens:%Y-%m-%d %H:%M} UTC"
    elif case == "disabled":
        row = policy(cluster, enabled=False)
    elif case == "another campaign live":
        row = policy(cluster)
        # An operator's campaign frees h1 of the pool; the proposal then frees h2.
        plan = campaign_plan_read(cluster=cluster.cluster, selector=H100, goal=1, now=now)
        operator = campaign_start(cluster=cluster.cluster, plan=plan, actor=None, max_in_flight=1, now=now,
                                  enqueue=False)
        assert operator.state in LIVE_CAMPAIGN_STATES
        why = f"campaign #{operator.pk} is live on the cluster: one campaign at a time"
    else:
        row = None

    campaign_proposals_all.apply()

    proposal = CampaignProposal.objects.filter(cluster=cluster.cluster, pool="h100").latest("computed_at")
    assert proposal.freed >= 1, "there was something to free"
    assert auto_campaigns(cluster) == []
    if row is not None:
        row.refresh_from_db()
        assert row.last_act_at is None and row.last_act_proposal is None
        assert not entries_of_subject(subject_type="campaign_policy", subject_id=row.pk).exists()
    # Asked again, the schedule says why it did not act (a disabled or missing policy: not asked).
    acts = campaign_proposals_act(cluster=cluster.cluster, proposals=[proposal], now=clock.now())
    assert [act.decision.why for act in acts] == ([why] if why else [])


def test_a_stale_proposal_is_refused_audited_and_not_tried_again(cluster):
    now = clock.now()
    row = policy(cluster, nodes="100%")
    rows = campaign_proposals_compute(cluster=cluster.cluster, now=now)
    # The cluster changes between the proposal and the start: h2's pod goes.
    kube.gateway_for(cluster.cluster).delete(kube.PODS, "small2-1", namespace="org-a")
    cluster.control.advance(5)

    [act] = campaign_proposals_act(cluster=cluster.cluster, proposals=rows, now=now)

    assert act.campaign_id is None and "the cluster changed since the plan was shown" in act.refused
    assert auto_campaigns(cluster) == []
    proposal = next(r for r in rows if r.pool == "h100")
    [entry] = entries_of_subject(subject_type="campaign_policy", subject_id=row.pk)
    assert entry.action == "campaign_auto_refused" and entry.new["proposal"] == proposal.pk
    assert entry.new["refused"] == act.refused and entry.actor_label == f"schedule: campaign policy #{row.pk}"
    # The same proposal again: not retried.
    [again] = campaign_proposals_act(cluster=cluster.cluster, proposals=rows, now=now)
    assert not again.decision.start and again.decision.why == f"proposal #{proposal.pk} was acted on already"
    assert entries_of_subject(subject_type="campaign_policy", subject_id=row.pk).count() == 1


# ---- the panel ------------------------------------------------------------------------------

@pytest.fixture
def editor(django_user_model, client):
    """A staff user who may change campaign policies (and read the cluster's pages), nothing else."""
    user = django_user_model.objects.create_user("lead", "lead@example.com", "pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=[
        "change_campaignpolicy", "view_campaignpolicy", "view_cluster_contents"]))
    client.force_login(user)
    return user


def form(cluster, **values) -> dict:
    return {"cluster": cluster.cluster.pk, "selector": "karpenter.sh/nodepool=h100", "enabled": "on",
            "schedule": "0 22 * * mon-fri", "duration": "2h", "nodes": "10%", "max_in_flight": "1", **values}


def errors(page: str) -> dict[str, str]:
    """Field → its error, as the admin form shows them."""
    found = {}
    for field, block in re.findall(r'<div class="form-row[^"]*field-(\w+)[^"]*">(.*?)</div>\s*</div>', page, re.S):
        message = re.search(r'<ul class="errorlist[^"]*"[^>]*><li>(.*?)</li>', block, re.S)
        if message:
            found[field] = re.sub(r"<[^>]+>", "", message.group(1)).replace("&#x27;", "'").replace("&quot;", '"')
    return found


@pytest.mark.parametrize(("values", "field", "says"), [
    ({"schedule": "0 22 * * mon-fry"}, "schedule", "'0 22 * * mon-fry' is not a valid cron expression"),
    ({"duration": "2 hours"}, "duration", "'2 hours' is not a duration in hours and minutes, as 2h, 30m or 1h30m"),
    ({"nodes": "150%"}, "nodes", "'150%' is not a node budget"),
    ({"duration": ""}, "duration", "a duration is set with the schedule"),
    ({"selector": "karpenter.sh/nodepool=b200"}, "selector",
     "karpenter.sh/nodepool=b200 selects no GPU node of cluster sim"),
    ({"selector": "h100"}, "selector", "'h100' is not a pool: give node labels as KEY=VALUE"),
    ({"selector": "karpenter.sh/nodepool=h100,nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"}, "selector",
     "is not a pool the proposals name; its pools: karpenter.sh/nodepool=a10g, karpenter.sh/nodepool=h100"),
    ({"max_in_flight": "9"}, "max_in_flight", "9 nodes at once: from 1 to the defrag jobs a cluster may run at once"),
    ({"drain_when_safe": "on"}, "drain_when_safe", "may not drain nodes (needs capacity.drain_defragjob)"),
])
def test_the_form_refuses_bad_input_naming_the_field_and_saves_nothing(cluster, client, editor, values, field, says):
    response = client.post(reverse("admin:capacity_campaignpolicy_add"), form(cluster, **values))
    assert response.status_code == 200
    shown = errors(response.content.decode())
    assert field in shown and says in shown[field], shown
    assert not CampaignPolicy.objects.exists()


def test_a_change_is_audited_with_the_operator_and_shown_on_the_dashboard(cluster, client, editor, celery_eager):
    campaign_proposals_all.apply()
    dashboard = client.get("/capacity/clusters/sim/").content.decode()
    assert _acting(dashboard) == "acts on its own: off"

    added = client.post(reverse("admin:capacity_campaignpolicy_add"), form(cluster, enabled=""))
    assert added.status_code == 302, errors(added.content.decode())
    row = CampaignPolicy.objects.get()
    assert (row.enabled, row.changed_by) == (False, editor)
    assert _acting(client.get("/capacity/clusters/sim/").content.decode()) == "acts on its own: off"

    changed = client.post(reverse("admin:capacity_campaignpolicy_change", args=[row.pk]),
                          form(cluster, nodes="40%"))
    assert changed.status_code == 302, errors(changed.content.decode())
    first, second = entries_of_subject(subject_type="campaign_policy", subject_id=row.pk, oldest_first=True)
    assert first.action == "policy_create" and first.actor == editor and first.new["enabled"] is False
    assert second.action == "policy_change" and second.actor == editor
    assert second.old == {"enabled": False, "nodes": "10%"} and second.new == {"enabled": True, "nodes": "40%"}

    line = _acting(client.get("/capacity/clusters/sim/").content.decode())
    row.refresh_from_db()
    window = row.terms.window(clock.now())
    assert line == (f"acts on its own: 0 22 * * mon-fri for 2h (UTC), at most 40% of 5 nodes = 2 nodes per campaign "
                    f"— {window.text}")
    page = client.get("/capacity/clusters/sim/gpu-map/?pool=h100&campaign=1").content.decode()
    assert _text(re.search(r'<p class="campaign-acting">(.*?)</p>', page, re.S).group(1)) == line
    # The policy's own page says the same, with its history: who changed what.
    own = client.get(reverse("admin:capacity_campaignpolicy_change", args=[row.pk])).content.decode()
    assert line in _text(own)
    history = re.findall(r"<tr><td>[^<]*</td><td>([a-z_]+)</td><td>([^<]*)</td>", own)
    assert history == [("policy_change", "lead"), ("policy_create", "lead")]


def test_without_the_permission_the_policies_are_not_editable(cluster, client, django_user_model):
    user = django_user_model.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    client.force_login(user)
    assert client.post(reverse("admin:capacity_campaignpolicy_add"), form(cluster)).status_code == 403
    assert not CampaignPolicy.objects.exists()


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&#x27;", "'").strip()


def _acting(dashboard: str) -> str:
    return _text(re.search(r'<li class="campaign-proposal" data-pool="h100">.*?<span class="campaign-acting">(.*?)'
                           r"</span>", dashboard, re.S).group(1))
