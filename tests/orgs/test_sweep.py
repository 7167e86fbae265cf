"""The hourly dormancy sweep on PostgreSQL: one conditional UPDATE, recorded, race-safe."""
from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from config import clock
from orgs.models import DormancySwitch, Org
from orgs.services import dormancy_sweep, org_mark_active
from tests.orgs.test_safety import broker_down  # noqa: F401 - the fixture
from tests.orgs.locks import backends_waiting_for_a_lock


def test_runs_on_postgresql():
    assert connection.vendor == "postgresql"


def test_sweep_marks_idle_orgs_dormant_and_records_the_switch(make_org):
    make_org("idle", idle_hours=30)
    make_org("busy", idle_hours=2)
    make_org("protected", idle_hours=30, scale_to_zero_allowed=False)
    now = clock.now()

    result = dormancy_sweep(now=now)

    assert result.switched == ("idle",)
    idle = Org.objects.get(slug="idle")
    assert idle.dormant and idle.dormant_since == now
    assert not Org.objects.get(slug="busy").dormant
    assert not Org.objects.get(slug="protected").dormant
    [switch] = DormancySwitch.objects.all()
    assert (switch.org.slug, switch.direction, switch.cause, switch.actor) == ("idle", "dormant", "sweep", None)


def test_a_second_sweep_changes_nothing(make_org):
    make_org("idle", idle_hours=30)
    dormancy_sweep(now=clock.now())
    assert dormancy_sweep(now=clock.now()).switched == ()
    assert DormancySwitch.objects.count() == 1


def test_dry_run_shows_what_it_would_do_and_writes_nothing(make_org):
    make_org("idle", idle_hours=30)
    result = dormancy_sweep(now=clock.now(), dry_run=True)
    assert result.switched == ("idle",)
    assert "no activity since before" in result.lines[0]
    assert not Org.objects.get(slug="idle").dormant
    assert not DormancySwitch.objects.exists()


def test_budget_limits_one_sweep_longest_idle_first(make_org):
    for i, hours in enumerate((30, 50, 40)):
        make_org(f"org-{i}", idle_hours=hours)
    assert dormancy_sweep(now=clock.now(), budget=2).switched == ("org-1", "org-2")
    assert dormancy_sweep(now=clock.now(), budget=2).switched == ("org-0",)


def test_over_budget_the_sweep_records_only_the_orgs_it_marked(make_org):
    for i, hours in enumerate((30, 50, 40, 60)):
        make_org(f"org-{i}", idle_hours=hours)
    assert dormancy_sweep(now=clock.now(), budget=3).switched == ("org-1", "org-2", "org-3")
    assert sorted(DormancySwitch.objects.values_list("org__slug", flat=True)) == ["org-1", "org-2", "org-3"]
    assert sorted(Org.objects.filter(dormant=True).values_list("slug", flat=True)) == ["org-1", "org-2", "org-3"]


def test_a_zero_budget_marks_no_org_as_the_dry_run_says(make_org):
    make_org("idle", idle_hours=30)
    assert dormancy_sweep(now=clock.now(), budget=0, dry_run=True).switched == ()
    assert dormancy_sweep(now=clock.now(), budget=0).switched == ()
    assert not Org.objects.get(slug="idle").dormant and not DormancySwitch.objects.exists()


def test_command_json_and_dry_run(make_org, capsys):
    make_org("idle", idle_hours=30)
    call_command("sweep_dormancy", "--dry-run", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out["dormant"] == ["idle"] and out["dry_run"] is True
    assert not Org.objects.get(slug="idle").dormant
    # The org's cluster cannot be reached: marked dormant, but the command says scale to
    # zero did not happen and exits non-zero, in one line.
    with pytest.raises(CommandError, match=r"^1 of 1 dormant org\(s\) not fully scaled to zero .*cannot load kubeconfig"):
        call_command("sweep_dormancy")
    assert "1 org(s) turned dormant" in capsys.readouterr().out
    assert Org.objects.get(slug="idle").dormant


def test_a_sweep_says_what_it_left_awake_as_its_dry_run_did(make_org, settings, capsys):
    """Over budget or held: the run that marks says so, in text and in JSON, like the dry run."""
    settings.ORGS_SWEEP_BUDGET = 1
    make_org("recent", idle_hours=30)
    make_org("oldest", idle_hours=50)
    make_org("kept", idle_hours=60, exempt=True, exemption_reason="launch week")
    left = ["recent: would turn dormant, left for the next sweep (budget)",
            "kept: idle, but exempt or snoozed: stays awake"]

    call_command("sweep_dormancy", "--dry-run", "--json")
    dry = json.loads(capsys.readouterr().out)
    call_command("sweep_dormancy", "--queue", "--json")
    real = json.loads(capsys.readouterr().out)

    for body in (dry, real):
        assert (body["dormant"], body["over_budget"], body["held"]) == (["oldest"], ["recent"], ["kept"])
        assert body["lines"][1:] == left
    assert real["lines"][0] == "oldest: dormant"
    assert sorted(Org.objects.filter(dormant=True).values_list("slug", flat=True)) == ["oldest"]

    call_command("sweep_dormancy", "--queue")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 org(s) turned dormant (no activity since ")
    assert out[1:3] == ["  recent: dormant", "  kept: idle, but exempt or snoozed: stays awake"]


def test_exactly_the_dormancy_period_idle_is_not_yet_dormant(make_org, settings):
    """The rule is "no activity since before now - 24 h": an org idle exactly 24 h turns dormant
    at the next sweep, in the dry run and the real one alike."""
    now = clock.now()
    org = make_org("edge")
    Org.objects.filter(id=org.id).update(last_activity_at=now - settings.ORGS_DORMANT_AFTER)
    assert dormancy_sweep(now=now, dry_run=True).switched == dormancy_sweep(now=now).switched == ()
    later = now + timedelta(microseconds=1)
    assert dormancy_sweep(now=later, dry_run=True).switched == dormancy_sweep(now=later).switched == ("edge",)



@pytest.mark.django_db(transaction=True)
def test_activity_racing_the_sweep_is_never_lost(make_org, settings):
    """An activity whose UPDATE holds the row while the sweep runs: the sweep waits for it,
    re-checks the condition on the new row, and the org ends active."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    org = make_org("racer", idle_hours=30)
    now = clock.now()
    activity_conn = connections.create_connection("default")
    activity_conn.set_autocommit(False)
    with activity_conn.cursor() as cursor:
        cursor.execute("UPDATE orgs_org SET last_activity_at = %s WHERE id = %s", [now, org.id])
    done = {}

    def sweep():
        done["result"] = dormancy_sweep(now=now)
        connections.close_all()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    assert backends_waiting_for_a_lock(query_like="%UPDATE orgs_org o SET dormant%"), \
        "the sweep must wait for the activity's row lock"
    assert sweeper.is_alive()
    activity_conn.commit()
    activity_conn.close()
    sweeper.join(timeout=30)
    assert done["result"].switched == ()
    assert not Org.objects.get(id=org.id).dormant


@pytest.mark.django_db(transaction=True)
def test_activity_after_the_sweep_wakes_the_org(make_org, celery_eager):
    make_org("late", idle_hours=30)
    dormancy_sweep(now=clock.now())
    assert Org.objects.get(slug="late").dormant
    woke = org_mark_active(org_slug="late", cause="activity", at=clock.now() + timedelta(seconds=1))
    assert woke
    org = Org.objects.get(slug="late")
    assert not org.dormant and org.dormant_since is None
    assert list(org.switches.values_list("direction", flat=True)) == ["active", "dormant"]


@pytest.mark.django_db(transaction=True)
def test_a_sweep_queues_each_switch_once_with_its_org_and_switch(make_org, monkeypatch):
    from orgs import tasks

    sent = []
    monkeypatch.setattr(tasks.org_scale_to_zero_apply, "apply_async",
                        lambda args, kwargs, priority, **options: sent.append((args[0], kwargs["switch_id"], priority)))
    orgs = [make_org(f"idle-{i}", idle_hours=30 + i) for i in range(3)]
    make_org("busy", idle_hours=2)

    result = dormancy_sweep(now=clock.now())

    switches = {s.org_id: s.id for s in DormancySwitch.objects.all()}
    assert sorted(sent) == sorted((o.id, switches[o.id], tasks.NORMAL_PRIORITY) for o in orgs)
    assert sorted(result.switches) == sorted(switches.items())


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_a_sweep_marks_and_records_and_says_once_what_it_could_not_queue(
        make_org, caplog):
    import logging
    import socket

    from config.celery import app
    from orgs.services import clusters_with_unapplied_orgs

    orgs = [make_org(f"idle-{i}", idle_hours=30) for i in range(20)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    old_url, old_eager = app.conf.broker_url, app.conf.task_always_eager

    def repoint(url: str) -> None:
        app.conf.broker_url = url
        app._pool = None
        app.amqp._producer_pool = None

    app.conf.task_always_eager = False
    repoint(f"redis://127.0.0.1:{dead_port}/0")
    try:
        with caplog.at_level(logging.ERROR, logger="orgs.services"):
            result = dormancy_sweep(now=clock.now())
    finally:
        repoint(old_url)
        app.conf.task_always_eager = old_eager

    assert len(result.switched) == 20
    assert Org.objects.filter(dormant=True).count() == 20 and DormancySwitch.objects.count() == 20
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "the broker is tried once, not once per org"
    assert "for 20 of 20 org(s)" in errors[0] and "the retry task applies them within 2 minutes" in errors[0]
    later = clock.now() + timedelta(minutes=1)
    assert clusters_with_unapplied_orgs(now=later) == [orgs[0].cluster_id], "the retry task picks them up"


@pytest.mark.django_db(transaction=True)
def test_a_queued_sweep_says_when_its_scale_to_zero_was_queued(make_org, monkeypatch, capsys):
    from orgs import tasks

    sent = []
    monkeypatch.setattr(tasks.org_scale_to_zero_apply, "apply_async",
                        lambda args, kwargs, priority, **options: sent.append(args[0]))
    org = make_org("idle", idle_hours=30)
    call_command("sweep_dormancy", "--queue")
    assert sent == [org.id]
    assert "  scale to zero queued for the workers" in capsys.readouterr().out.splitlines()


@pytest.mark.django_db(transaction=True)
def test_a_queued_sweep_the_queue_refused_says_so_exits_1_and_the_retry_task_applies_it(make_org, broker_down,
                                                                                         capsys):
    from orgs.services import RETRY_GRACE, clusters_with_unapplied_orgs

    orgs = [make_org(f"idle-{i}", idle_hours=30) for i in range(2)]
    with pytest.raises(CommandError) as refused:
        call_command("sweep_dormancy", "--queue")

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("2 org(s) turned dormant and are marked, but their scale to zero could not be queued "
                              "(OperationalError")
    assert message.endswith("; the retry task applies it within 2 minutes once the queue answers")
    out = capsys.readouterr().out
    assert "2 org(s) turned dormant" in out and "queued for the workers" not in out
    assert Org.objects.filter(dormant=True).count() == 2, "the org rows hold the intent"
    later = clock.now() + RETRY_GRACE + timedelta(seconds=1)
    assert clusters_with_unapplied_orgs(now=later) == [orgs[0].cluster_id], "the retry task picks them up"
