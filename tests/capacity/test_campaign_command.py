"""`manage.py consolidate`: the plan printed, dry run, refusals, and a campaign run to the end
on a simulated cluster whose clock runs."""
from __future__ import annotations

import json
import time

import pytest
from django.core.management import CommandError, call_command

from capacity.campaigns.models import Campaign, CampaignState, NodeState
from campaign_cluster import half_full_pool
from defrag_cluster import Kube

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pool(sim_cluster_factory):
    handle = sim_cluster_factory(half_full_pool(4), name="sim", speed=50.0)
    kube = Kube(handle.kubeconfig_path)
    for _ in range(400):   # wall time: the cluster's clock runs until the 8 pods are ready
        if sum(1 for p in kube.pods() if p.status.phase == "Running") == 8:
            break
        time.sleep(0.05)
    return kube


def cordoned(kube) -> list[str]:
    return [n.metadata.name for n in kube.core.list_node().items if n.spec.unschedulable]


def test_dry_run_prints_the_plan_and_changes_nothing(pool, capsys):
    call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--max", "--cluster", "sim", "--dry-run")
    out = capsys.readouterr().out
    assert out.startswith("2 nodes of pool karpenter.sh/nodepool=h100 can be freed (16 GPUs); 4 pods move once each")
    assert "  1. " in out and "  2. " in out and "Left out:" in out
    assert out.rstrip().splitlines()[-1].startswith("Dry run: nothing was changed. To rehearse it on a copy")
    assert not Campaign.objects.exists() and cordoned(pool) == []


def test_json_has_the_plan_and_its_state(pool, capsys):
    call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--free", "1", "--cluster", "sim",
                 "--dry-run", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "planned" and out["campaign"] is None
    assert out["freed"] == len(out["nodes"]) == 1 and out["pods_moved"] == 2
    assert out["replacements_on_campaign_nodes"] == 0 and out["lower_bound"] == 2
    assert [o["reason"] for o in out["left_out"]] == ["goal-met"] * 3
    assert {m["from"] for m in out["moves"]} == set(out["nodes"])
    assert not Campaign.objects.exists() and cordoned(pool) == []


@pytest.mark.parametrize("args, message", [
    (["--pool", "h100", "--max"], "--pool takes KEY=VALUE node labels"),
    (["--pool", "karpenter.sh/nodepool=h100", "--free", "0"], "--free takes a whole number, 1 or more, not 0"),
    (["--pool", "karpenter.sh/nodepool=h100", "--free", "two"], "--free takes a whole number, 1 or more, not 'two'"),
    (["--pool", "karpenter.sh/nodepool=h100", "--max", "--max-in-flight", "9"],
     "--max-in-flight 9 is more than the defrag jobs a cluster may run at once (2"),
    (["--pool", "karpenter.sh/nodepool=a100", "--max"], "no GPU node has the labels karpenter.sh/nodepool=a100"),
])
def test_bad_input_is_refused_by_name_and_changes_nothing(pool, args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        call_command("consolidate", *args, "--cluster", "sim", "--yes")
    assert not Campaign.objects.exists() and cordoned(pool) == []


def test_an_unknown_cluster_is_refused(pool):
    with pytest.raises(CommandError, match="nope"):
        call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--max", "--cluster", "nope", "--yes")
    assert not Campaign.objects.exists()


def test_answering_no_says_nothing_was_done_and_exits_1(pool, monkeypatch, capsys):
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    with pytest.raises(SystemExit) as exited:
        call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--max", "--cluster", "sim")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == ("Not confirmed: nothing was done (no node was cordoned and no "
                                               "campaign was created).")
    assert not Campaign.objects.exists() and cordoned(pool) == []


def test_yes_runs_the_campaign_to_the_end_and_exits_0(pool, settings, capsys):
    settings.CAPACITY_DEFRAG_POLL_SECONDS = 0.2
    settings.CAPACITY_CAMPAIGN_POLL_SECONDS = 0.2
    call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--max", "--cluster", "sim", "--yes",
                 "--max-in-flight", "2", "--drain-when-safe")
    out = capsys.readouterr().out
    campaign = Campaign.objects.get()
    assert campaign.state == CampaignState.DONE and campaign.source == "cli"
    freed = list(campaign.nodes.values_list("node_name", flat=True))
    assert set(campaign.nodes.values_list("state", flat=True)) == {NodeState.DRAINED}
    assert sorted(cordoned(pool)) == sorted(freed)
    assert not [p for p in pool.pods() if p.spec.node_name in freed and p.metadata.deletion_timestamp is None]
    assert out.rstrip().endswith(f"Final state of campaign #{campaign.pk}: done (0 safe, 2 drained, 0 dropped); "
                                 "exit 0")


def test_without_drain_the_safe_nodes_stay_cordoned_and_the_command_says_draining_is_the_operators_step(
        pool, settings, capsys):
    settings.CAPACITY_DEFRAG_POLL_SECONDS = 0.2
    settings.CAPACITY_CAMPAIGN_POLL_SECONDS = 0.2
    call_command("consolidate", "--pool", "karpenter.sh/nodepool=h100", "--free", "1", "--cluster", "sim", "--yes")
    lines = capsys.readouterr().out.rstrip().splitlines()
    campaign = Campaign.objects.get()
    [node] = campaign.nodes.values_list("node_name", flat=True)
    assert campaign.nodes.get().state == NodeState.SAFE and cordoned(pool) == [node]
    assert lines[-2] == (f"Safe, cordoned, their orphans still serving: {node}. Draining and removing them is your "
                         "step: `manage.py defrag NODE --drain` for each, or the campaign's defrag jobs in the panel.")
    assert lines[-1] == f"Final state of campaign #{campaign.pk}: done (1 safe, 0 drained, 0 dropped); exit 0"
