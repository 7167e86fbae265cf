"""A binpack write run whose process is killed mid-write is settled from the pods, once.

The crash is real: a separate process runs a binpack write run and SIGKILLs itself as
soon as its 2nd of 4 pod patches returned (`binpack_crash_worker.py`), against the
test's PostgreSQL database and simulated cluster. Its run row was announced (`writing`,
with every change) before the first write; past its lease the next run on the cluster,
or the beat's task, audits the two costs the pods carry under the run's actor, marks the
run interrupted with true counts, then plans and writes the remainder.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.management import call_command

from audit.models import AuditEntry
from capacity.binpack import services
from capacity.binpack.models import BinpackRun
from capacity.binpack.tasks import binpack_cluster
from clusters import labels
from config import clock
from tests.capacity.test_binpack_services import NS, changes_table, world  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
CRASH_WORKER = Path(__file__).with_name("binpack_crash_worker.py")
PODS = ("a-0", "a-1", "a-2", "b-0")     # the four pods the scenario's plan costs


@pytest.fixture
def ops():
    return User.objects.create_superuser("ops", "ops@example.com", "pw")


def _database_url() -> str:
    db = django_settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "the crash test shares the database with its child process"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def crash(handle, user, *, after: int) -> BinpackRun:
    """A write run killed after its `after`th patch returned (one write in flight at a time,
    so exactly that many are on pods); returns its row as the database holds it."""
    env = {**os.environ, "DATABASE_URL": _database_url(), "PYTHONPATH": str(ROOT), "KUBE_RETRY_BACKOFF": "0.05",
           "BINPACK_WRITE_CONCURRENCY": "1"}
    env.pop("KUBECONFIG", None)
    env.pop("CLOCK_OFFSET_FILE", None)
    done = subprocess.run([sys.executable, str(CRASH_WORKER), str(handle.cluster.pk), str(user.pk), str(after)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    (run,) = BinpackRun.objects.filter(cluster=handle.cluster)
    return run


def annotations(core, name: str) -> dict:
    return core.read_namespaced_pod(name, NS).metadata.annotations or {}


def carried(core, run_announced: list[dict]) -> set[str]:
    """Pods carrying exactly the cost (and marker) their run announced."""
    return {a["pod"] for a in run_announced
            if annotations(core, a["pod"]).get(labels.DELETION_COST) == str(a["new"])
            and annotations(core, a["pod"]).get(labels.BINPACK_MARKER) == str(a["new"])}


@pytest.fixture
def later(settings, tmp_path):
    """Move the product clock past a writing run's lease (the injected clock, as workers read it)."""
    offset = tmp_path / "clock-offset"
    settings.CLOCK_OFFSET_FILE = str(offset)

    def move(seconds: float = services.LEASE_SECONDS + 1):
        offset.write_text(str(seconds))
    return move


def killed_run(world, ops):
    handle, core = world
    run = crash(handle, ops, after=2)
    assert run.state == BinpackRun.State.WRITING and len(run.announced) == 4
    assert {a["pod"] for a in run.announced} == set(PODS)
    written = carried(core, run.announced)
    assert len(written) == 2                                   # the pods carry what was written before the kill
    assert not AuditEntry.objects.filter(app="binpack").exists()
    return run, written


def assert_settled_once(handle, run, written, ops):
    run.refresh_from_db()
    assert run.state == BinpackRun.State.INTERRUPTED and (run.written, run.unwritten, run.stale) == (2, 2, 0)
    assert run.announced == [] and run.lease_owner == "" and run.finished_at is not None
    assert run.errors[0].startswith("interrupted: its process stopped mid-write; settled from the cluster at ")
    entries = AuditEntry.objects.filter(app="binpack", subject_type="binpack_run", subject_id=run.pk)
    assert sorted(k for e in entries for k in e.new) == sorted(f"{NS}/{p}" for p in written)
    assert entries.count() == 2                               # one per written pod, none for the unwritten
    for entry in entries:
        assert entry.actor == ops and entry.cluster == handle.cluster
        assert "after an interruption" in entry.cause and f"binpack run #{run.pk}" in entry.cause
    assert {c["pod"]: c["result"] for c in run.changes} == {
        p: "settled-written" if p in written else "settled-not-written" for p in PODS}


def test_the_next_run_settles_a_killed_run_once_then_writes_the_rest(world, ops, later, capsys, client):
    handle, core = world
    run, written = killed_run(world, ops)

    # Within its lease the run may still be writing: nobody settles it.
    assert services.binpack_runs_settle(cluster=handle.cluster) == []
    assert BinpackRun.objects.get(pk=run.pk).state == BinpackRun.State.WRITING

    later()
    call_command("binpack", "--cluster", handle.cluster.name)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"run {run.pk} (started ") and out[0].endswith(
        "was interrupted mid-write and settled now: 2 of 4 announced cost(s) found written and audited, "
        "2 not written")
    assert_settled_once(handle, run, written, ops)

    # The next run then planned and wrote the remainder, audited as its own.
    nxt = BinpackRun.objects.exclude(pk=run.pk).get()
    assert nxt.state == BinpackRun.State.DONE and (nxt.planned, nxt.written, nxt.unchanged) == (2, 2, 2)
    assert carried(core, [{"pod": p, "new": int(annotations(core, p)[labels.DELETION_COST])} for p in PODS]) == set(PODS)
    assert set(AuditEntry.objects.get(app="binpack", subject_id=nxt.pk).new) == {
        f"{NS}/{p}" for p in set(PODS) - written}

    # A further settle finds nothing to do: nothing audited twice.
    assert services.binpack_runs_settle(cluster=handle.cluster) == []
    assert AuditEntry.objects.filter(app="binpack", subject_id=run.pk).count() == 2

    # The runs page says so.
    client.force_login(ops)
    html = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    assert "interrupted (its process stopped mid-write; settled later from the cluster)" in html
    assert sorted(row[4] for row in changes_table(html)) == sorted(
        ["written (its run was interrupted; found on the pod and recorded later)"] * 2
        + ["not written: its run was interrupted and the pod does not carry the cost"] * 2)


def test_the_beat_task_settles_a_killed_run(world, ops, later, celery_eager):
    handle, core = world
    run, written = killed_run(world, ops)
    later()

    result = binpack_cluster.apply(args=[handle.cluster.pk])

    assert result.successful(), result.result
    assert result.result["settled"] == [run.pk] and result.result["written"] == 2
    assert_settled_once(handle, run, written, ops)


def test_a_second_settler_at_the_same_time_audits_nothing_twice(world, ops, later):
    """Settler A claims the run and reads the pods; meanwhile A's own lease lapses too and
    settler B takes the run over and records it. A, holding a claim it lost, records nothing."""
    handle, core = world
    run, written = killed_run(world, ops)
    later()
    gateway = handle.gateway
    by_b: list[BinpackRun] = []

    class SlowReader:
        def list(self, resource, **kwargs):
            by_b.extend(services.binpack_runs_settle(
                cluster=handle.cluster, now=clock.now() + timedelta(seconds=services.LEASE_SECONDS + 1)))
            return gateway.list(resource, **kwargs)

    by_a = services.binpack_runs_settle(cluster=handle.cluster, gateway=SlowReader())

    assert by_a == [] and [r.pk for r in by_b] == [run.pk]
    assert_settled_once(handle, run, written, ops)


def test_a_run_within_its_lease_is_not_settled_even_by_the_next_run(world, ops, later):
    handle, core = world
    run, written = killed_run(world, ops)
    later(services.LEASE_SECONDS - 5)

    nxt, _ = services.pod_deletion_costs_apply(cluster=handle.cluster)

    assert nxt.settled == []
    run.refresh_from_db()
    assert run.state == BinpackRun.State.WRITING and run.lease_owner.startswith("writer:")
    assert not AuditEntry.objects.filter(app="binpack", subject_id=run.pk).exists()
