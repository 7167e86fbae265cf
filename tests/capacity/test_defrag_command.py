"""`manage.py defrag` end to end, and the Celery task, on a simulated cluster whose clock runs
(speed 50: the 5 s pod start-up takes 0.1 s of wall time)."""
from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from capacity.defrag.models import DefragJob, JobState
from defrag_cluster import NS, REVISION, Kube, knative_service, scenario

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(sim_cluster_factory):
    handle = sim_cluster_factory(scenario(knative_service(min_scale=3)), name="sim", speed=50.0)
    kube = Kube(handle.kubeconfig_path)
    for _ in range(200):   # wait for the model to come up (wall time: the cluster's clock runs)
        if kube.actual_scale() == 3:
            break
        __import__("time").sleep(0.05)
    return handle, kube


def test_defrag_yes_runs_to_safe_and_exits_0(running, capsys):
    handle, kube = running
    node = kube.node_with_pods()
    call_command("defrag", node, "--cluster", "sim", "--yes", "--poll-interval", "0.2", "--timeout", "120")
    out = capsys.readouterr().out
    assert "Found pods to defrag:" in out
    assert f"Node {node} has been cordoned (marked unschedulable)." in out
    assert f"Revision {REVISION} - 1 extra needed - current_scale=" in out
    assert out.rstrip().endswith("Safe to defrag/remove node\nFinal state of defrag job "
                                 f"#{DefragJob.objects.get().pk}: safe; exit 0")
    assert kube.node_cordoned(node)


def test_answering_no_says_nothing_was_done_and_exits_1_as_other_refusals(running, monkeypatch, capsys):
    handle, kube = running
    node = kube.node_with_pods()
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    with pytest.raises(SystemExit) as exited:
        call_command("defrag", node, "--cluster", "sim")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == (f"Not confirmed: nothing was done (node {node} was not cordoned and "
                                               "no defrag job was created).")
    assert not kube.node_cordoned(node) and not DefragJob.objects.exists()


def test_no_terminal_and_no_answer_is_a_no_said_in_one_line(running, monkeypatch, capsys):
    handle, kube = running
    node = kube.node_with_pods()
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(""))      # input closed: a script, cron
    with pytest.raises(SystemExit) as exited:
        call_command("defrag", node, "--cluster", "sim")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "no answer: standard input is closed; add --yes to confirm without a terminal",
        f"Not confirmed: nothing was done (node {node} was not cordoned and no defrag job was created)."]
    assert not kube.node_cordoned(node) and not DefragJob.objects.exists()


def test_json_then_abort_then_bad_input(running, capsys):
    handle, kube = running
    node = kube.node_with_pods()
    call_command("defrag", node, "--cluster", "sim", "--yes", "--json", "--poll-interval", "0.2")
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "safe" and report["revisions"][0]["satisfied"]
    call_command("defrag", node, "--cluster", "sim", "--abort", "--poll-interval", "0.2")
    assert not kube.node_cordoned(node)
    assert DefragJob.objects.get().state == JobState.ABORTED
    assert len(kube.pods(NS, revision=REVISION)) == 3
    with pytest.raises(CommandError, match="no live defrag job"):
        call_command("defrag", node, "--cluster", "sim", "--drain", "--yes")
    with pytest.raises(CommandError, match="--timeout must be between 1 and 86400 seconds, got 0"):
        call_command("defrag", node, "--cluster", "sim", "--timeout", "0")
    with pytest.raises(CommandError, match="no cluster named 'nope'"):
        call_command("defrag", node, "--cluster", "nope")


def test_the_celery_task_carries_a_confirmed_job_to_safe(running, celery_eager):
    from capacity.defrag.services import defrag_discover, defrag_job_start

    handle, kube = running
    node = kube.node_with_pods()
    plan = defrag_discover(cluster=handle.cluster, node_name=node)
    # Autocommit: on_commit fires at once and the eager task runs the job here, waking on PA watch events.
    job = defrag_job_start(cluster=handle.cluster, node_name=node, plan=plan, poll_interval_seconds=0.5)
    job.refresh_from_db()
    assert job.state == JobState.SAFE and job.log[-1] == "Safe to defrag/remove node"


def test_a_node_name_no_node_can_have_is_refused_in_one_plain_line_before_any_request(
        sim_cluster_factory, capsys, caplog):
    from capacity.management.commands.defrag import Command

    handle = sim_cluster_factory(scenario(nodes=1), name="sim")
    caplog.set_level("DEBUG", logger="simcluster.http")   # the simulated cluster's access log
    with pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "defrag", "n1?x=1", "--cluster", "sim", "--return-to-service", "--yes"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "CommandError: nothing changed: 400 Invalid: Node name 'n1?x=1' is not a valid Kubernetes name: it must be "
        "a DNS-1123 subdomain: at most 253 characters, lowercase letters, digits, '-' and '.', each dot-separated "
        "part starting and ending with a letter or digit\n")
    assert [r for r in caplog.records if r.name == "simcluster.http"] == []   # node n1 was never read
    assert not Kube(handle.kubeconfig_path).node_cordoned("n1")


def test_a_node_without_gpus_is_no_defrag_candidate_and_nothing_is_done(sim_cluster_factory, client,
                                                                        django_user_model):
    """A CPU node (no allocatable nvidia.com/gpu): the CLI and the panel's start page say it has
    no GPUs, instead of a report of "0x unknown GPUs" and a confirmation; nothing is cordoned."""
    from defrag_builders import make_node

    cpu = make_node("cpu-1", gpus=0, product="", pool="cpu")
    handle = sim_cluster_factory(scenario(cpu, nodes=1), name="sim")
    kube = Kube(handle.kubeconfig_path)
    with pytest.raises(CommandError) as refused:
        call_command("defrag", "cpu-1", "--cluster", "sim", "--yes")
    assert str(refused.value) == ("node 'cpu-1' has no GPUs (no allocatable nvidia.com/gpu): defrag empties GPU "
                                  "nodes, so there is nothing to defrag on it; nothing was done")
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/capacity/defragjob/start/", {"cluster": "sim", "node": "cpu-1"}, follow=True)
    html = page.content.decode()
    assert "Cannot defrag &#x27;cpu-1&#x27;: node &#x27;cpu-1&#x27; has no GPUs" in html
    assert "Proceed with defrag" not in html
    assert not kube.node_cordoned("cpu-1") and not DefragJob.objects.exists()
