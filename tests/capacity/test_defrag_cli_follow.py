"""`manage.py defrag` on long jobs and bad input: the operator's terminal always ends with
the job's final state and its exit code; bad numbers start nothing.

The command runs in this process on the simulated cluster's manual clock: its sleeps move
that clock (and the product's injected clock reads it), so a 20-minute job takes seconds.
"""
from __future__ import annotations

import types

import pytest
from django.core.management import CommandError, call_command

from capacity.management.commands import defrag as defrag_command
from capacity.defrag.models import DefragJob, JobState
from config import clock
from defrag_cluster import NS, REVISION, knative_service, scenario
from test_defrag_services import world_without_room

pytestmark = pytest.mark.django_db


@pytest.fixture
def on_sim_clock(monkeypatch):
    def use(world):
        monkeypatch.setattr(clock, "now", world.now)
        monkeypatch.setattr(defrag_command, "time", types.SimpleNamespace(sleep=world.advance))
        return world

    return use


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    try:
        call_command("defrag", *args)
        code = 0
    except SystemExit as exited:
        code = exited.code
    return code, capsys.readouterr().out.splitlines()


def test_a_job_with_thousands_of_log_lines_ends_with_its_final_state_on_the_cli(
        defrag_world, on_sim_clock, capsys, settings):
    settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS = 120
    world = on_sim_clock(world_without_room(defrag_world))
    code, out = run_cli(capsys, "n1", "--cluster", "sim", "--yes", "--timeout", "450", "--poll-interval", "1")
    job = DefragJob.objects.get()
    assert job.log_seq > 650 and job.log_lines.count() == 500      # hundreds more written, the log bounded
    assert code == 1
    assert out[-1] == f"Final state of defrag job #{job.pk}: failed; exit 1"
    assert out[-2] == job.error and job.error.startswith("Timed out after 450s: not safe.")
    # The poll's two lines are printed once, then folded: the terminal stays readable.
    waiting = f"Revision {REVISION} - 1 extra needed - current_scale=1 replicas=1 initial_scale=1"
    assert out.count(waiting) <= 2
    folds = [line for line in out if line.startswith("… ×")]
    assert folds and int(folds[0].split("×")[1].split()[0]) > 300
    assert len(out) < 60

    # The abort cannot end the orphan (its replacement has no room): it stops at its deadline.
    [orphan] = job.orphans.all()
    code, out = run_cli(capsys, "n1", "--cluster", "sim", "--abort", "--poll-interval", "1")
    job.refresh_from_db()
    assert code == 1 and job.state == JobState.ABORT_STUCK
    assert out[0] == "Abort requested by CLI" and "Node n1 uncordoned" in out
    kept = f"Pod {NS}/{orphan.pod_name} kept: revision {REVISION} has 0/1 ready without it"
    assert out.count(kept) == 1 and any(line.startswith("… ×") for line in out)
    assert out[-1] == f"Final state of defrag job #{job.pk}: abort-stuck; exit 1"
    assert out[-2] == job.error and job.error.startswith("Abort stuck after 120s")
    assert "`manage.py defrag n1 --abort --delete-orphans`" in job.error

    # The operator's explicit choice finishes it.
    code, out = run_cli(capsys, "n1", "--cluster", "sim", "--abort", "--delete-orphans", "--yes",
                        "--poll-interval", "1")
    job.refresh_from_db()
    assert code == 0 and job.state == JobState.ABORTED
    assert out[-2] == "Aborted: node n1 uncordoned; every orphan gone"
    assert out[-1] == f"Final state of defrag job #{job.pk}: aborted; exit 0"
    assert not world.kube.pod_exists(NS, orphan.pod_name)


@pytest.mark.parametrize("flag, value", [
    ("--poll-interval", "nan"), ("--poll-interval", "inf"), ("--poll-interval", "-1"), ("--poll-interval", "0"),
    ("--poll-interval", "1e9"), ("--timeout", "nan"), ("--timeout", "-inf"), ("--timeout", "0"),
    ("--timeout", "2.5"), ("--timeout", "1e12")])
def test_bad_numbers_name_the_flag_and_start_nothing(defrag_world, flag, value):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    with pytest.raises(CommandError) as refused:
        call_command("defrag", node, "--cluster", "sim", "--yes", f"{flag}={value}")
    assert str(refused.value).startswith(f"{flag} must be")
    assert not DefragJob.objects.exists() and not world.kube.node_cordoned(node)


@pytest.mark.parametrize("field, value", [("poll_interval", "nan"), ("poll_interval", "inf"),
                                          ("poll_interval", "-2"), ("timeout", "0"), ("timeout", "nan")])
def test_the_panel_refuses_bad_numbers_naming_the_field(defrag_world, client, django_user_model, field, value):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    report = client.get(f"/admin/capacity/defragjob/start/?cluster=sim&node={node}").context["report"]
    form = {"cluster": "sim", "node": node, "confirm": "yes", "timeout": "1800", "poll_interval": "10", field: value,
            "report": report}
    page = client.post("/admin/capacity/defragjob/start/", form)
    assert page.status_code == 200
    assert f"Not started: {field}: " in page.content.decode()
    assert not DefragJob.objects.exists() and not world.kube.node_cordoned(node)
