"""The campaign page in the panel: the plan, each node's progress with its defrag job, the
kept-empty nodes and the audit; read-only; Abort… behind a confirmation and a permission."""
from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from audit.selectors import entries_of_subject
from capacity.campaigns.models import CampaignState, NodeState
from campaign_cluster import half_full_pool, run, start, tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def campaign_with_a_drop(defrag_world):
    world = defrag_world(half_full_pool())
    campaign = start(world, max_in_flight=1)
    campaign = tick(world, campaign)
    second = campaign.nodes.get(position=2)     # dropped when its turn comes; the third then starts
    world.kube.core.patch_node(second.node_name, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    return world, run(world, campaign, until=lambda c: c.nodes.filter(state=NodeState.DROPPED).exists())


def test_the_page_shows_plan_progress_and_reasons_and_offers_no_edit_or_delete(client, django_user_model,
                                                                               campaign_with_a_drop):
    world, campaign = campaign_with_a_drop
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get(reverse("admin:capacity_campaign_change", args=[campaign.pk])).content.decode()
    assert campaign.plan["nodes"][0]["node"] in page
    assert "3 nodes of pool karpenter.sh/nodepool=h100 can be freed (24 GPUs)" in page
    for row in campaign.nodes.all():
        assert re.search(rf'<td class="token">{row.node_name}</td>', page)
    dropped = campaign.nodes.get(state=NodeState.DROPPED)
    assert 'the node says karpenter.sh/do-not-disrupt: &quot;true&quot; (uncordoned)' in page
    running = campaign.nodes.exclude(job=None).first()
    assert reverse("admin:capacity_defragjob_change", args=[running.job.pk]) in page
    assert "Left out of the plan (3)" in page and "receives" in page
    assert 'id="campaign-abort"' in page
    assert not re.search(r'name="_save"|class="deletelink"', page)
    assert client.get(reverse("admin:capacity_campaign_delete", args=[campaign.pk])).status_code == 403
    assert dropped.node_name in page
    listing = client.get(reverse("admin:capacity_campaign_changelist")).content.decode()
    assert "karpenter.sh/nodepool=h100" in listing and "Add campaign" not in listing


def test_abort_asks_first_then_ends_the_campaign(client, django_user_model, campaign_with_a_drop):
    world, campaign = campaign_with_a_drop
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    url = reverse("admin:capacity_campaign_abort", args=[campaign.pk])
    confirm = client.get(url).content.decode()
    assert f"Abort campaign #{campaign.pk} of cluster sim?" in confirm
    assert campaign.nodes.filter(state=NodeState.RUNNING).count() == 1
    assert "The nodes it cordoned are uncordoned:" in confirm
    campaign.refresh_from_db()
    assert campaign.abort_requested_at is None          # looking at the page asks nothing
    client.post(url, {"confirm": "yes"})
    campaign = run(world, campaign)
    assert campaign.state == CampaignState.ABORTED
    assert not any(world.kube.node_cordoned(n.node_name) for n in campaign.nodes.all())
    [request] = entries_of_subject(subject_type="campaign", subject_id=campaign.pk).filter(action="abort_request")
    assert request.actor.username == "ops"


def test_a_staff_user_without_the_permission_cannot_abort(client, django_user_model, campaign_with_a_drop):
    world, campaign = campaign_with_a_drop
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_campaign"))
    client.force_login(user)
    page = client.get(reverse("admin:capacity_campaign_change", args=[campaign.pk])).content.decode()
    assert 'id="campaign-abort"' not in page
    assert client.post(reverse("admin:capacity_campaign_abort", args=[campaign.pk]),
                       {"confirm": "yes"}).status_code == 403
    campaign.refresh_from_db()
    assert campaign.abort_requested_at is None


def test_a_safe_node_the_operator_drained_after_the_campaign_reads_drained(client, django_user_model, defrag_world):
    from capacity.defrag.models import JobState
    from capacity.defrag.services import defrag_job_drain, defrag_job_step

    world = defrag_world(half_full_pool())
    campaign = run(world, start(world, goal=1, max_in_flight=1))
    assert campaign.state == CampaignState.DONE
    row = campaign.nodes.get()
    assert row.state == NodeState.SAFE
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))

    def next_step() -> str:
        page = client.get(reverse("admin:capacity_campaign_change", args=[campaign.pk])).content.decode()
        return html.unescape(re.sub(r"\s+", " ", re.search(r'<p id="campaign-next">(.*?)</p>', page, re.S).group(1)))

    assert next_step() == (f"<strong>Next:</strong> Done: {row.node_name} stays cordoned with its orphans serving; "
                           "drain each (its defrag job's Drain…) before removing it, or return it to service.")
    # The drain is the operator's step, after the campaign: its defrag job drains the node.
    job = defrag_job_drain(job=row.job, actor=None, now=world.now(), enqueue=False)
    for _ in range(60):
        job = defrag_job_step(job=job, gateway=world.gateway, now=world.now())
        if job.state == JobState.DRAINED:
            break
        world.advance(5)
    assert job.state == JobState.DRAINED
    # Nothing is left to drain: the page no longer asks for it.
    assert next_step() == ("<strong>Next:</strong> Done: the drained nodes stay cordoned and empty until you "
                           "remove them.")
    page = client.get(reverse("admin:capacity_campaign_change", args=[campaign.pk])).content.decode()
    assert f'data-node="{row.node_name}" data-state="drained"' in page
    assert "1 of 1 node safe or drained, 0 dropped" in page
