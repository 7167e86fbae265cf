"""`consolidate --rehearse DUMP`: a campaign run on a copy of the cluster loaded from a
kubectl dump of it, the copy's clock fast-forwarded, and what happened reported and kept,
while the cluster itself receives no request."""
from __future__ import annotations

import hashlib
import json
import re

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from capacity.campaigns.models import (
    Campaign,
    CampaignProposal,
    CampaignRehearsal,
    CampaignState,
    NodeState,
    RehearsalState,
)
from capacity.campaigns.planning import CampaignPlan
from capacity.campaigns.services import campaign_proposals_compute
from campaign_cluster import half_full_pool
from cluster_dump import cluster_dump
from clusters.models import Cluster
from config import clock
from defrag_builders import make_node
from defrag_cluster import NS, Kube, knative_service

pytestmark = pytest.mark.django_db

POOL = "karpenter.sh/nodepool=h100"


@pytest.fixture
def source(sim_cluster_factory):
    """The cluster an operator would consolidate: four 8-GPU nodes, each with two 2-GPU model
    pods (simulated, named "sim" in the product), settled."""
    handle = sim_cluster_factory(half_full_pool(4), name="sim")
    handle.advance(60)
    return handle


def left_alone(handle):
    """What shows the cluster received no request: the API requests it served and its
    resourceVersion."""
    return dict(handle.server.app.requests), handle.sim.store.resource_version


def cordoned(kube: Kube) -> list[str]:
    return [n.metadata.name for n in kube.core.list_node().items if n.spec.unschedulable]


def rehearse(dump, *args):
    return call_command("consolidate", "--pool", POOL, "--cluster", "sim", "--rehearse", str(dump), *args)


def test_a_rehearsal_frees_the_planned_nodes_on_a_copy_and_sends_the_cluster_nothing(source, tmp_path, capsys):
    dump = cluster_dump(source.kubeconfig_path, tmp_path / "dump.json")
    untouched = left_alone(source)
    assert untouched[0], "the dump was read through the API: the count moves when the cluster is asked"

    rehearse(dump, "--max")                        # exit 0: no SystemExit

    assert left_alone(source) == untouched, "the cluster the dump was taken of received a request"
    assert cordoned(Kube(source.kubeconfig_path)) == []
    out = capsys.readouterr().out
    record = CampaignRehearsal.objects.get()
    plan = CampaignPlan.from_dict(record.plan)
    assert out.startswith(plan.report_lines()[0]) and plan.freed == 2 and plan.pods_moved == 4
    assert "Freed 2 of the 2 planned node(s) — the nodes the plan named." in out
    assert "Pods moved: 4; replacements on campaign nodes: 0." in out
    safe = re.search(r"^Time to all safe: (?:(\d+) min )?(\d+) s\.$", out, re.M)
    assert safe, out
    assert int(safe.group(1) or 0) * 60 + int(safe.group(2)) == round(record.seconds_to_all_safe) > 0
    assert "Dropped" not in out and "Stuck" not in out
    assert out.rstrip().splitlines()[-1] == ("Nothing was sent to the cluster. To run it for real: "
                                             f"manage.py consolidate --cluster sim --pool {POOL} --max")

    # Kept: which dump, the plan and the outcome, under the cluster it was taken of.
    assert record.state == RehearsalState.DONE and record.freed == record.planned == 2
    assert record.dump_sha256 == hashlib.sha256(dump.read_bytes()).hexdigest() and record.dump_path == str(dump)
    assert (record.dump_nodes, record.dump_pods) == (4, 8) and record.cluster == source.cluster
    assert record.outcome["freed"] == list(plan.node_names) and record.outcome["pending"] == []
    landed = [node for _, node in record.outcome["replacements"]]
    assert len(landed) == 4 and not set(landed) & set(plan.node_names) and "" not in landed
    # The campaign ran on the copy, a cluster row no list that acts reaches.
    copy = record.copy_cluster
    assert copy.name == f"rehearsal-{record.pk}" and copy.retired
    assert not Cluster.objects.filter(name=copy.name).exists()
    campaign = record.campaign
    assert campaign.cluster == copy and campaign.state == CampaignState.DONE
    assert campaign.source == f"rehearsal:{record.pk}"
    assert set(campaign.nodes.values_list("state", flat=True)) == {NodeState.SAFE}
    assert not Campaign.objects.filter(cluster=source.cluster).exists()


def stuck_pool() -> list[dict]:
    """n1 holds one pod of m1, whose pods must run on rack r1 (only n1 is there); m2 and m3 fill
    six GPUs of n2 and n3, racks r2 and r3. A plan (GPUs only) frees n1 by moving m1's pod to
    n2 or n3, where the scheduler cannot put it."""
    def on_rack(service: dict, rack: str) -> dict:
        service["spec"]["template"]["spec"]["nodeSelector"] = {"example.com/rack": rack}
        return service

    return ([make_node(f"n{i}", labels={"example.com/rack": f"r{i}"}) for i in (1, 2, 3)]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
               on_rack(knative_service("m1", min_scale=1, gpus=2), "r1"),
               on_rack(knative_service("m2", min_scale=3, gpus=2), "r2"),
               on_rack(knative_service("m3", min_scale=3, gpus=2), "r3")])


def test_a_node_whose_replacements_cannot_be_placed_is_reported_with_the_schedulers_reason(
        sim_cluster_factory, tmp_path, capsys):
    handle = sim_cluster_factory(stuck_pool(), name="sim")
    handle.advance(60)
    dump = cluster_dump(handle.kubeconfig_path, tmp_path / "dump.json")
    untouched = left_alone(handle)

    with pytest.raises(SystemExit) as exited:
        rehearse(dump, "--free", "1")

    assert exited.value.code == 1 and left_alone(handle) == untouched
    out = capsys.readouterr().out
    assert "Freed 0 of the 1 planned node(s): none (planned n1)." in out
    dropped = re.search(r"^Dropped n1: (.*)$", out, re.M).group(1)
    assert dropped.startswith(f"replacement {NS}/m1-") and "cannot be scheduled: 0/3 nodes are available" in dropped
    assert "didn't match Pod's node affinity/selector" in dropped
    assert "Time to all safe" not in out
    record = CampaignRehearsal.objects.get()
    assert record.state == RehearsalState.DONE and (record.freed, record.planned) == (0, 1)
    assert record.outcome["dropped"] == {"n1": dropped} and record.seconds_to_all_safe is None


def test_json_carries_the_runs_fields_and_the_outcome_and_the_proposal_says_rehearsed(
        source, tmp_path, capsys, client, django_user_model):
    [proposal] = campaign_proposals_compute(cluster=source.cluster, now=clock.now())
    dump = cluster_dump(source.kubeconfig_path, tmp_path / "dump.json")

    rehearse(dump, "--max", "--json")

    out = json.loads(capsys.readouterr().out)
    record = CampaignRehearsal.objects.get()
    assert out["campaign"] is None and out["state"] == "done"
    assert out["nodes"] == list(proposal.campaign.node_names) and out["freed"] == 2 and out["pods_moved"] == 4
    assert out["replacements_on_campaign_nodes"] == 0
    rehearsal = out["rehearsal"]
    assert rehearsal["id"] == record.pk and rehearsal["freed"] == out["nodes"] and rehearsal["dropped"] == {}
    assert rehearsal["replacements_on_campaign_nodes"] == 0 and rehearsal["pods_moved"] == 4
    assert rehearsal["seconds_to_all_safe"] == record.seconds_to_all_safe
    assert rehearsal["command"] == f"manage.py consolidate --cluster sim --pool {POOL} --max"

    # The cluster's proposal for the pool frees the same nodes in the same order: rehearsed.
    proposal.refresh_from_db()
    assert proposal.rehearsed and proposal.rehearsal == record
    user = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(user)

    def dashboard_line() -> str:
        page = client.get("/capacity/clusters/sim/").content.decode()
        return re.search(r'<span class="campaign-line">(.*?)</span>', page, re.S).group(1)

    assert dashboard_line().endswith("rehearsed: yes — freed 2 of 2 (under a minute ago)")

    # The cluster changes: a planned node is cordoned, so the next proposal frees other nodes.
    Kube(source.kubeconfig_path).core.patch_node(proposal.campaign.node_names[0], {"spec": {"unschedulable": True}})
    source.advance(0)
    [later] = campaign_proposals_compute(cluster=source.cluster, now=clock.now())
    assert later.pk != proposal.pk and later.campaign.node_names != proposal.campaign.node_names
    assert dashboard_line().endswith("rehearsed: no")


def test_a_partial_rehearsal_points_at_its_record(source, tmp_path, client, django_user_model):
    """A proposal whose rehearsal did not free every node sends the operator to it."""
    [proposal] = campaign_proposals_compute(cluster=source.cluster, now=clock.now())
    copy = Cluster.all_objects.create(name="rehearsal-x", kubeconfig_path="/nonexistent", retired_at=clock.now())
    record = CampaignRehearsal.objects.create(
        cluster=source.cluster, copy_cluster=copy, dump_path="dump.json", dump_sha256="0" * 64, dump_nodes=4,
        dump_pods=8, selector=proposal.selector, max_in_flight=1, scoring="LeastAllocated",
        state=RehearsalState.DONE, plan=proposal.plan, planned=2, freed=1, started_at=clock.now(),
        finished_at=clock.now())
    CampaignProposal.objects.filter(pk=proposal.pk).update(rehearsed=True, rehearsal=record)
    user = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(user)
    page = client.get("/capacity/clusters/sim/").content.decode()
    assert f"rehearsed: yes — freed 1 of 2: see rehearsal #{record.pk}" in page


def write(path, text: str | bytes):
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


NODE = make_node("n1")


@pytest.mark.parametrize("name, content, message", [
    ("missing.json", None, "DUMP {path}: no such file"),
    ("empty.json", "", "DUMP {path}: the file is empty"),
    ("binary.json", b"\x00\xff\xfe{", "not UTF-8 text"),
    ("text.yaml", "just some words\n", "a manifest must be a mapping, got str"),
    ("items.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": 3}), "items must be a list"),
    ("nothing.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": []}),
     "DUMP {path}: holds no nodes and no pods (0 nodes, 0 pods)"),
    ("nodes.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": [NODE]}),
     "DUMP {path}: holds no pods (1 nodes, 0 pods)"),
])
def test_a_dump_that_cannot_be_rehearsed_on_is_refused_by_name_and_nothing_is_recorded(
        tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        write(path, content)
    clusters = Cluster.all_objects.count()
    with pytest.raises(CommandError) as refused:
        call_command("consolidate", "--pool", POOL, "--max", "--rehearse", str(path))
    assert message.format(path=path) in str(refused.value)
    assert str(refused.value).startswith(f"DUMP {path}")
    assert not CampaignRehearsal.objects.exists() and not Campaign.objects.exists()
    assert Cluster.all_objects.count() == clusters


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(CommandError, match=f"DUMP {tmp_path}: not a file"):
        call_command("consolidate", "--pool", POOL, "--max", "--rehearse", str(tmp_path))


def test_a_pool_the_dump_does_not_have_is_refused_and_nothing_is_recorded(source, tmp_path):
    dump = cluster_dump(source.kubeconfig_path, tmp_path / "dump.json")
    with pytest.raises(CommandError, match="no GPU node has the labels karpenter.sh/nodepool=a100"):
        call_command("consolidate", "--pool", "karpenter.sh/nodepool=a100", "--max", "--rehearse", str(dump))
    assert not CampaignRehearsal.objects.exists() and not Cluster.all_objects.filter(
        name__startswith="rehearsal-").exists()


@pytest.mark.parametrize("flag, message", [
    ("--dry-run", "--rehearse and --dry-run exclude each other"),
    ("--yes", "--rehearse starts nothing on the cluster, so there is nothing to confirm: leave out --yes"),
])
def test_rehearse_with_a_flag_that_acts_on_the_cluster_is_refused(tmp_path, flag, message):
    dump = write(tmp_path / "dump.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": [NODE]}))
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("consolidate", "--pool", POOL, "--max", "--rehearse", str(dump), flag)
    assert not CampaignRehearsal.objects.exists()


def test_the_rehearsal_record_is_read_only_in_the_admin(client, django_user_model):
    copy = Cluster.all_objects.create(name="rehearsal-1", kubeconfig_path="/nonexistent", retired_at=clock.now())
    plan = {"selector": {"karpenter.sh/nodepool": "h100"}}
    record = CampaignRehearsal.objects.create(
        copy_cluster=copy, dump_path="dump.json", dump_sha256="0" * 64, dump_nodes=4, dump_pods=8,
        selector=plan["selector"], max_in_flight=1, scoring="LeastAllocated", state=RehearsalState.FAILED,
        error="the copy stopped answering", plan={}, planned=0, started_at=clock.now())
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    listing = client.get("/admin/capacity/campaignrehearsal/").content.decode()
    assert f"/admin/capacity/campaignrehearsal/{record.pk}/change/" in listing and "Add campaign rehearsal" not in listing
    url = f"/admin/capacity/campaignrehearsal/{record.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and "the copy stopped answering" in page.content.decode()
    assert 'name="_save"' not in page.content.decode() and "deletelink" not in page.content.decode()
    assert client.post(url, {"error": "edited"}).status_code == 403
    assert client.post(f"/admin/capacity/campaignrehearsal/{record.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/capacity/campaignrehearsal/add/").status_code == 403
    record.refresh_from_db()
    assert record.error == "the copy stopped answering"
    # The copy is kept for the records that name it: deleting it is refused.
    with pytest.raises(Exception, match="protected"):
        copy.delete()


def test_a_rehearsal_of_the_pool_by_another_label_marks_its_proposal_rehearsed(
        source, tmp_path, client, django_user_model):
    """The operator rehearses the pool under a label of their choosing (the README's
    `capacity.io/pool=h100`, here the GPU product) while the dashboard proposes it under
    another: both select the same nodes, so the proposal's line says rehearsed."""
    [proposal] = campaign_proposals_compute(cluster=source.cluster, now=clock.now())
    dump = cluster_dump(source.kubeconfig_path, tmp_path / "dump.json")

    call_command("consolidate", "--pool", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3", "--cluster", "sim",
                 "--rehearse", str(dump), "--max")

    proposal.refresh_from_db()
    assert proposal.selector != CampaignRehearsal.objects.get().selector
    assert proposal.rehearsed and proposal.rehearsal == CampaignRehearsal.objects.get()
    user = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(user)
    page = client.get("/capacity/clusters/sim/").content.decode()
    line = re.search(r'<span class="campaign-line">(.*?)</span>', page, re.S).group(1)
    assert line.endswith("rehearsed: yes — freed 2 of 2 (under a minute ago)")


def test_the_copys_clock_starts_at_the_products_so_the_rehearsals_records_read_in_its_time(source, tmp_path):
    """With the product's clock ahead of the wall clock (a demo clock advanced, a test clock),
    the rehearsal's campaign and defrag jobs are dated from the product's time, not the
    wall clock's."""
    from datetime import timedelta

    from capacity.campaigns.services import campaign_rehearse
    from capacity.defrag.models import DefragJob

    dump = cluster_dump(source.kubeconfig_path, tmp_path / "dump.json")
    ahead = clock.now() + timedelta(hours=25)
    rehearsal = campaign_rehearse(dump=dump, selector={"karpenter.sh/nodepool": "h100"}, goal=None,
                                  max_in_flight=1, now=ahead)
    assert rehearsal.freed_all
    jobs = DefragJob.objects.filter(campaign_nodes__campaign=rehearsal.campaign)
    assert jobs.exists()
    for when in [rehearsal.campaign.created_at, *jobs.values_list("created_at", flat=True)]:
        assert ahead <= when <= ahead + timedelta(seconds=rehearsal.simulated_seconds + 60)
