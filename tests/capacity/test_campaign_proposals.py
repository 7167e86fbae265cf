"""Campaign proposals: the schedule's task over a simulated cluster writes the best campaign
of each GPU pool, and the dashboard and the GPU map show it as an operator reads it."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission

from capacity.campaigns.models import CampaignProposal
from capacity.campaigns.planning import ON_HOLD, campaign_plan
from capacity.campaigns.tasks import campaign_proposals_all
from capacity.defrag.models import DefragJob, JobState
from clusters import kube
from clusters.selectors import snapshot_take
from config import clock
from defrag_builders import make_model_pod, make_node
from orgs.models import Org, WorkloadExemption

pytestmark = pytest.mark.django_db

H100 = {"karpenter.sh/nodepool": "h100"}


def running(pod: dict) -> dict:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def objects() -> list[dict]:
    """Pool h100 of five 8-GPU nodes: h1 and h2 hold one 2-GPU pod each, h3 and h4 six GPUs
    of 2-GPU pods, h5 is empty; pool a10g: two 1-GPU nodes, both full (nothing to free)."""
    docs = [{"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation", "spec": {"placement": "most-allocated"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}}]
    docs += [make_node(f"h{i}") for i in range(1, 6)]
    docs += [make_node(f"a{i}", gpus=1, product="NVIDIA-A10G", pool="a10g") for i in (1, 2)]
    docs += [running(make_model_pod(f"small{i}-1", revision=f"small{i}-00001", node=f"h{i}", gpus=2)) for i in (1, 2)]
    docs += [running(make_model_pod(f"big{n}-{i}", revision=f"big{n}-00001", node=f"h{n}", gpus=2))
             for n in (3, 4) for i in range(3)]
    docs += [running(make_model_pod(f"tiny{i}-1", revision=f"tiny{i}-00001", node=f"a{i}", gpus=1)) for i in (1, 2)]
    return docs


@pytest.fixture
def operator(django_user_model, client):
    """A staff user who may read the cluster's pages (not a superuser)."""
    user = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(user)
    return user


@pytest.fixture
def cluster(sim_cluster_factory, settings):
    settings.CAPACITY_SCHEDULER_SCORING = "MostAllocated"
    handle = sim_cluster_factory(objects(), name="sim")
    handle.control.advance(5)
    return handle


class ProductClock:
    """The product's clock (config.clock), moved forward through CLOCK_OFFSET_FILE."""

    def __init__(self, path):
        self.path, self.seconds = path, 0.0

    def advance(self, delta: timedelta) -> None:
        self.seconds += delta.total_seconds()
        self.path.write_text(str(self.seconds))


@pytest.fixture
def product_clock(settings, tmp_path) -> ProductClock:
    settings.CLOCK_OFFSET_FILE = str(tmp_path / "clock-offset")
    return ProductClock(tmp_path / "clock-offset")


def plan_now(handle, **kwargs):
    snapshot = snapshot_take(kube.gateway_for(handle.cluster), now=clock.now(), gpu_nodes_only=True)
    return campaign_plan(snapshot, scoring="MostAllocated", **kwargs)


def test_the_task_writes_one_proposal_per_pool_with_the_plans_numbers(cluster, celery_eager, product_clock):
    assert campaign_proposals_all.apply().get() == 1   # one cluster: one task queued

    rows = {row.pool: row for row in CampaignProposal.objects.filter(cluster=cluster.cluster)}
    assert set(rows) == {"h100", "a10g"}
    h100 = rows["h100"]
    plan = plan_now(cluster, selector=H100)
    assert h100.selector == H100 and h100.scoring == "MostAllocated" and not h100.rehearsed
    assert (h100.freed, h100.gpus_freed, h100.pods_moved, h100.lower_bound) == (
        plan.freed, plan.gpus_freed, plan.pods_moved, plan.lower_bound)
    # By hand: 16 GPUs requested fit on 2 of the 5 nodes (lower bound 2; h5 is already empty,
    # so at most 2 more); h1's and h2's pods fill h3's and h4's free GPUs, which frees both,
    # each pod moved once.
    assert (h100.freed, h100.pods_moved, h100.lower_bound, h100.campaign.most_freeable) == (2, 2, 2, 2)
    assert h100.campaign.node_names == ("h1", "h2")
    assert {m.to for m in h100.campaign.moves} == {"h3", "h4"}
    assert rows["a10g"].freed == 0 and rows["a10g"].selector == {"karpenter.sh/nodepool": "a10g"}

    # The cluster unchanged, the next run moves the same proposals forward instead of adding rows.
    first = h100.computed_at
    product_clock.advance(timedelta(minutes=10))
    campaign_proposals_all.apply()
    h100.refresh_from_db()
    assert CampaignProposal.objects.filter(cluster=cluster.cluster).count() == 2
    assert h100.computed_at > first


def test_history_older_than_the_setting_goes_but_each_pools_latest_stays(cluster, celery_eager, settings,
                                                                          product_clock):
    settings.CAPACITY_CAMPAIGN_PROPOSAL_DAYS = 1
    campaign_proposals_all.apply()
    old = CampaignProposal.objects.get(cluster=cluster.cluster, pool="h100")
    # h2's pod goes: the plan differs, so a new proposal is written and the old one is history.
    kube.gateway_for(cluster.cluster).delete(kube.PODS, "small2-1", namespace="org-a")
    cluster.control.advance(5)
    product_clock.advance(timedelta(hours=2))
    campaign_proposals_all.apply()
    assert CampaignProposal.objects.filter(cluster=cluster.cluster, pool="h100").count() == 2
    product_clock.advance(timedelta(days=1))
    campaign_proposals_all.apply()
    kept = CampaignProposal.objects.filter(cluster=cluster.cluster, pool="h100")
    assert old.pk not in {row.pk for row in kept} and kept.count() == 1


def test_a_snoozed_workload_and_a_held_node_keep_their_nodes_out(cluster, celery_eager):
    org = Org.objects.create(slug="org-a", cluster=cluster.cluster, namespace="org-a")
    WorkloadExemption.objects.create(org=org, kind=WorkloadExemption.Kind.PYNODE, name="small1",
                                     until=clock.now() + timedelta(hours=4), reason="demo on Monday",
                                     created_at=clock.now())
    DefragJob.objects.create(cluster=cluster.cluster, node_name="h4", state=JobState.WAITING, created_at=clock.now())

    campaign_proposals_all.apply()

    plan = CampaignProposal.objects.get(cluster=cluster.cluster, pool="h100").campaign
    assert "h1" not in plan.node_names and "h4" not in plan.node_names
    left_out = {o.node: o for o in plan.left_out}
    assert left_out["h1"].reason == ON_HOLD
    assert left_out["h1"].why == "org-a/small1 is on hold (snoozed by an operator)"
    assert left_out["h4"].reason == "held"
    # What is left: h2's pod moves to h3, the one node with room outside the campaign.
    assert plan.node_names == ("h2",) and [m.to for m in plan.moves] == ["h3"]


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&#x27;", "'")


def test_before_the_first_proposal_the_dashboard_says_when_campaigns_are_proposed(cluster, celery_eager, client,
                                                                                 operator):
    """An operator opening the dashboard right after the control plane starts finds the
    Campaigns section saying when the schedule proposes and how to plan one now, not nothing."""
    dashboard = client.get("/capacity/clusters/sim/").content.decode()
    assert "<h2>Campaigns</h2>" in dashboard
    none = _text(re.search(r'<p id="campaign-none">(.*?)</p>', dashboard, re.S).group(1))
    assert none.startswith("No campaign proposed yet: each GPU pool's best campaign is proposed every 10 min "
                           '(schedule "capacity: campaign proposals")'), none
    assert "manage.py consolidate --cluster sim --pool LABEL=VALUE --max --dry-run" in none

    campaign_proposals_all.apply()
    dashboard = client.get("/capacity/clusters/sim/").content.decode()
    assert 'id="campaign-none"' not in dashboard and '<ul id="campaign-proposals">' in dashboard


def test_the_dashboard_and_the_map_show_the_campaign_and_agree_with_the_proposal(cluster, celery_eager, client,
                                                                                operator):
    campaign_proposals_all.apply()
    row = CampaignProposal.objects.get(cluster=cluster.cluster, pool="h100")
    command = "manage.py consolidate --cluster sim --pool karpenter.sh/nodepool=h100 --max"
    line = (f"{row.freed} nodes of pool h100 can be freed together as one campaign ({row.gpus_freed} GPUs); "
            f"{row.pods_moved} pods move once each; at most 2 could be freed by any plan (the pool's requests fit "
            f"on {row.lower_bound} nodes of its 5, 1 already empty); rehearsed: no")

    dashboard = client.get("/capacity/clusters/sim/").content.decode()
    proposals = re.search(r'<ul id="campaign-proposals">(.*?)</ul>', dashboard, re.S).group(1)
    items = re.findall(r'<li class="campaign-proposal" data-pool="([^"]+)">(.*?)</li>', proposals, re.S)
    assert [pool for pool, _ in items] == ["h100"], "a pool with nothing to free has no line"
    assert _text(items[0][1]).startswith(f"{line} — {command} (proposed under a minute ago")
    # The one-at-a-time advice is labelled as such beside it.
    assert "one node at a time" in _text(re.search(r'<p class="help" id="advice-one-at-a-time">(.*?)</p>',
                                                     dashboard, re.S).group(1))

    plain = client.get("/capacity/clusters/sim/gpu-map/?pool=h100").content.decode()
    assert 'class="campaign-mark' not in plain, "the marks are drawn once the toggle is on"
    assert 'href="?pool=h100&amp;campaign=1">Show the campaign</a>' in plain
    page = client.get("/capacity/clusters/sim/gpu-map/?pool=h100&campaign=1").content.decode()
    assert _text(re.search(r'<p class="campaign-line">(.*?)</p>', page, re.S).group(1)).startswith(
        f"Pool h100: {line} — {command}")
    # Said once: the line carries the counts and the lower bound; the plan's summary is not repeated under it.
    assert _text(page).count("can be freed together as one campaign") == 1
    assert row.campaign.summary not in _text(page)
    marks = dict(re.findall(r'<g class="node" data-node="([^"]+)".*?data-campaign="([^"]+)"', page, re.S))
    assert marks == {"h1": "#1", "h2": "#2"}
    h1 = re.search(r'data-node="h1".*?</g>\s*</g>', page, re.S).group(0)
    assert 'class="campaign-frame"' in h1
    moves = {m.source: m.to for m in row.campaign.moves}
    assert f"#1 → {moves['h1']} (2 GPUs)</text>" in h1
    table = re.search(r'<table class="campaign-nodes">(.*?)</table>', page, re.S).group(1)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    assert [r[:4] for r in rows if r] == [["1", "h1", "8", "1"], ["2", "h2", "8", "1"]]
    assert sum(int(r[3]) for r in rows if r) == row.pods_moved
    assert sum(int(r[2]) for r in rows if r) == row.gpus_freed

    # The a10g pool frees nothing: its map shows no campaign at all.
    a10g = client.get("/capacity/clusters/sim/gpu-map/?pool=a10g&campaign=1").content.decode()
    assert '<h2 id="campaign"' not in a10g and 'class="campaign-mark' not in a10g
    assert "Show the campaign" not in a10g and "Hide the campaign" not in a10g


def test_the_empty_nodes_a_spreading_scheduler_would_fill_are_marked_kept_empty(sim_cluster_factory, celery_eager,
                                                                               client, operator, settings):
    settings.CAPACITY_SCHEDULER_SCORING = "LeastAllocated"
    handle = sim_cluster_factory(objects(), name="sim")
    handle.control.advance(5)
    campaign_proposals_all.apply()
    row = CampaignProposal.objects.get(cluster=handle.cluster, pool="h100")
    assert row.campaign.kept_empty == ("h5",) and row.freed >= 1
    page = client.get("/capacity/clusters/sim/gpu-map/?campaign=1").content.decode()
    h5 = re.search(r'data-node="h5".*?</g>\s*</g>', page, re.S).group(0)
    assert 'class="campaign-mark kept-empty" data-campaign="kept empty"' in h5
    assert "Kept empty while it runs" in page and "h5" in re.search(
        r'<p class="campaign-kept-empty">(.*?)</p>', page, re.S).group(1)


def test_the_proposal_and_a_consolidate_dry_run_hold_the_same_workloads_and_agree(sim_cluster_factory, settings,
                                                                                  capsys):
    """An exempt org, a snoozed model and a snooze that has ended: the schedule's proposal and
    the plan `consolidate --dry-run` prints leave out the same nodes for the same reasons and
    free the same nodes with the same moves."""
    import json

    from django.core.management import call_command

    settings.CAPACITY_SCHEDULER_SCORING = "MostAllocated"
    docs = objects() + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-b"}}, make_node("h6"),
                        running(make_model_pod("solo-1", revision="solo-00001", namespace="org-b", node="h6",
                                               gpus=2))]
    handle = sim_cluster_factory(docs, name="sim")
    handle.control.advance(5)
    now = clock.now()
    org_a = Org.objects.create(slug="org-a", cluster=handle.cluster, namespace="org-a")
    Org.objects.create(slug="org-b", cluster=handle.cluster, namespace="org-b", exempt=True)
    WorkloadExemption.objects.create(org=org_a, kind=WorkloadExemption.Kind.PYNODE, name="small1",
                                     until=now + timedelta(hours=4), created_at=now)
    WorkloadExemption.objects.create(org=org_a, kind=WorkloadExemption.Kind.PYNODE, name="small2",
                                     until=now - timedelta(minutes=1), created_at=now - timedelta(days=1))

    from capacity.campaigns.services import campaign_proposals_compute

    [proposal] = [r for r in campaign_proposals_compute(cluster=handle.cluster, now=now) if r.pool == "h100"]
    call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--max", "--cluster", "sim", "--dry-run",
                 "--json")
    printed = json.loads(capsys.readouterr().out)

    plan = proposal.campaign
    why = {o.node: o.why for o in plan.left_out}
    assert why["h6"] == "org-b/solo is on hold (its org is exempted by an operator)"
    assert why["h1"] == "org-a/small1 is on hold (snoozed by an operator)"
    assert "h2" in plan.node_names, "the snooze of small2 has ended: its node is freed"
    assert printed["nodes"] == list(plan.node_names)
    assert printed["left_out"] == [{"node": o.node, "reason": o.reason, "why": o.why} for o in plan.left_out]
    assert printed["moves"] == [{"pod": m.pod, "gpus": m.gpus, "from": m.source, "to": m.to} for m in plan.moves]
    assert printed["summary"] == plan.summary and printed["kept_empty"] == list(plan.kept_empty)
