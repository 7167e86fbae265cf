"""A binpack write run whose process is killed (or stalled) mid-write is settled from the
pods, and every cost that lands is audited once.

The crash is real: a separate process runs a binpack write run and SIGKILLs itself as
soon as its 2nd of 4 pod patches returned (`binpack_crash_worker.py`), against the
test's PostgreSQL database and simulated cluster. Its run row was announced (`writing`,
with every change) before the first write; past its lease the next run on the cluster,
or the beat's task, audits the two costs the pods carry under the run's actor, marks the
run interrupted with true counts, then plans and writes the remainder.

A write whose answer was lost (applied or not, the cluster then failing its retries) is of
unknown outcome: its run keeps it announced, and the next run settles it from the pod the
same way, under the same claim and row lock.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.utils.html import escape

from audit.models import AuditEntry
from capacity.binpack import services
from capacity.binpack.models import WRITE_RESULTS, BinpackRun, settled_describe
from capacity.binpack.tasks import binpack_cluster
from clusters import kube, labels
from clusters.errors import Unavailable
from config import clock
from tests.capacity.test_binpack_services import NS, PatchFaults, changes_table, world  # noqa: F401 (the fixture)

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
    assert run.lease_owner == "" and run.finished_at is not None
    # What the settle found on each pod stays, should the run's process answer after all.
    assert {a["pod"] for a in run.announced if a["found"]} == written and len(run.announced) == 4
    assert run.errors[0].startswith("interrupted: its process stopped mid-write; settled from the cluster at ")
    # One entry for the run, as a run that finishes writes: the written pods, none of the unwritten.
    (entry,) = AuditEntry.objects.filter(app="binpack", subject_type="binpack_run", subject_id=run.pk)
    assert set(entry.new) == {f"{NS}/{p}" for p in written} and set(entry.old) == set(entry.new)
    assert entry.target == f"2 pod(s) of cluster {handle.cluster}"
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
    assert AuditEntry.objects.filter(app="binpack", subject_id=run.pk).count() == 1

    # The runs page says so.
    client.force_login(ops)
    html = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    assert "interrupted (its process stopped mid-write; settled later from the cluster)" in html
    assert sorted(row[4] for row in changes_table(html)) == sorted(
        [escape(WRITE_RESULTS["settled-written"])] * 2 + [escape(WRITE_RESULTS["settled-not-written"])] * 2)


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


def list_cells(client, url: str, column: str) -> list[str]:
    """The text of one column of an admin list, row by row."""
    html = client.get(url).content.decode()
    return [re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(rf'<td class="field-{column}[^"]*">(.*?)</td>', html, re.S)]


def test_while_a_run_writes_its_lists_say_so_and_once_settled_its_settled_counts(world, ops, later, client):
    handle, core = world
    run, written = killed_run(world, ops)
    client.force_login(ops)

    def cells(url: str, column: str) -> list[str]:
        return list_cells(client, url, column)

    assert cells("/admin/capacity/binpackrun/", "written_shown") == [
        "writing: 4 change(s) announced, counts not final"]
    assert cells("/admin/capacity/binpackrun/", "stale_shown") == ["not final"]
    assert cells("/admin/capacity/binpackcluster/", "last_written") == [
        "writing: 4 change(s) announced, counts not final"]
    page = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    assert "writing: 4 change(s) announced, counts not final" in page
    assert "field-written" not in page.replace("field-written_shown", "")   # no bare 0 written

    later()
    services.binpack_runs_settle(cluster=handle.cluster)

    assert cells("/admin/capacity/binpackrun/", "written_shown") == [
        "2 of 4 announced (interrupted, settled from the cluster)"]
    assert cells("/admin/capacity/binpackrun/", "unwritten_shown") == ["2"]
    assert cells("/admin/capacity/binpackcluster/", "last_written") == [
        "2 of 4 announced (interrupted, settled from the cluster)"]


class HeldWrite:
    """The gateway, with one pod's write held back: `before_write()` runs first (on the
    writing thread), then the write goes out. Writes answered are counted per pod."""

    def __init__(self, gateway, pod: str, before_write):
        self.gateway, self.pod, self.before_write = gateway, pod, before_write
        self.answered: list[str] = []
        self.changed = threading.Condition()

    def wait_answered(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.answered) >= count, timeout=60)

    def __getattr__(self, name):
        return getattr(self.gateway, name)

    def patch(self, resource, name, body, **kwargs):
        if resource is kube.PODS and name == self.pod:
            try:
                self.before_write()
            finally:
                connections.close_all()      # this thread's own database connection
        answer = self.gateway.patch(resource, name, body, **kwargs)
        if resource is kube.PODS:
            with self.changed:
                self.answered.append(name)
                self.changed.notify_all()
        return answer


def settle_now(handle) -> list[BinpackRun]:
    """What the next run on the cluster does first, past the writing run's lease."""
    return services.binpack_runs_settle(cluster=handle.cluster, gateway=handle.gateway,
                                        now=clock.now() + timedelta(seconds=services.LEASE_SECONDS + 1))


def held_until_settled(gateway, handle, pod: str = "a-1") -> tuple[HeldWrite, list[BinpackRun]]:
    """`gateway` with `pod`'s write held until the other three writes answered and the run
    (its lease lapsed) was settled by another process; returns it and the runs settled."""
    settled: list[BinpackRun] = []

    def settle_once_the_others_answered():
        held.wait_answered(3)
        settled.extend(settle_now(handle))

    held = HeldWrite(gateway, pod, settle_once_the_others_answered)
    return held, settled


def audited(run) -> dict[str, list[AuditEntry]]:
    """Each pod of the run's audit entries, with the entries that name it."""
    by_pod: dict[str, list[AuditEntry]] = {}
    for entry in AuditEntry.objects.filter(app="binpack", subject_type="binpack_run", subject_id=run.pk):
        assert set(entry.old) == set(entry.new)
        for key in entry.new:
            by_pod.setdefault(key.split("/", 1)[1], []).append(entry)
    return by_pod


@pytest.fixture
def no_renewal(monkeypatch):
    """The writer does not renew its lease during the test (however slow the machine): the
    settle takes the run as the test says, not as a renewal racing it decides."""
    monkeypatch.setattr(services, "LEASE_RENEW_SECONDS", 3600)


def test_a_write_that_lands_after_its_stalled_run_was_settled_is_audited_once_by_the_writer(world, ops, settings,
                                                                                            no_renewal):
    """All four writes are in flight at once; a-1's is held until the other three answered
    and the run (its lease lapsed) was settled: the settle finds three costs on the pods and
    audits them. a-1's cost then lands: its writer audits it, alone, and the run counts it."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 4
    gateway, settled = held_until_settled(handle.gateway, handle)
    run, plan = services.pod_deletion_costs_apply(cluster=handle.cluster, actor=ops, gateway=gateway,
                                                  trigger=BinpackRun.Trigger.ADMIN)

    assert [r.pk for r in settled] == [run.pk] and gateway.answered[-1] == "a-1"
    assert carried(core, [{"pod": c.name, "new": c.new} for c in plan.changes]) == set(PODS)
    run.refresh_from_db()
    assert run.state == BinpackRun.State.INTERRUPTED and (run.written, run.unwritten) == (4, 0)
    assert run.announced == []                # its process answered: nothing more can land
    assert {c["pod"]: c["result"] for c in run.changes} == {
        "a-0": "settled-written", "a-1": "written-late", "a-2": "settled-written", "b-0": "settled-written"}
    by_pod = audited(run)
    assert {p: len(entries) for p, entries in by_pod.items()} == dict.fromkeys(PODS, 1)   # each once
    settle_entry, late_entry = by_pod["a-0"][0], by_pod["a-1"][0]
    assert set(settle_entry.new) == {f"{NS}/a-0", f"{NS}/a-2", f"{NS}/b-0"}
    assert "after an interruption" in settle_entry.cause
    planned = {c.name: c.new for c in plan.changes}
    assert late_entry.new == {f"{NS}/a-1": planned["a-1"]} and late_entry.old == {f"{NS}/a-1": None}
    assert services.LATE_CAUSE in late_entry.cause and f"binpack run #{run.pk}" in late_entry.cause
    assert late_entry.actor == settle_entry.actor == ops
    assert run.errors[1].startswith("its process's writes all answered at ")
    assert run.errors[1].endswith("after the settle: 1 more cost(s) written, audited by it; 4 of 4 written in all")


def test_a_stalled_writer_whose_lease_was_taken_starts_no_more_writes_and_audits_the_one_that_landed(
        world, settings, monkeypatch, capsys):
    """One write at a time; the command's first write is stalled past the lease: a settler
    records the run (no cost on any pod yet), the writer's renewal then finds its lease gone,
    and only then the stalled write lands. The three writes not started are not sent; the one
    that landed is audited by the writer, once, and counted; the command says so and exits 1."""
    from django.core.management.base import CommandError

    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    monkeypatch.setattr(services, "LEASE_RENEW_SECONDS", 0.01)
    settle_done, lease_lost = threading.Event(), threading.Event()
    renew = services._renew

    def renew_after_the_settle(run):
        # A renewal between the settler's read and its claim would (rightly) keep the run the
        # writer's: the writer renews only once the settle happened, so the test goes one way.
        assert settle_done.wait(timeout=60)
        held = renew(run)
        if not held:
            lease_lost.set()
        return held

    monkeypatch.setattr(services, "_renew", renew_after_the_settle)
    settled = []

    def settle_then_wait_for_the_writer_to_see_it():
        settled.extend(settle_now(handle))
        settle_done.set()
        assert lease_lost.wait(timeout=60)

    gateway = HeldWrite(handle.gateway, "a-0", settle_then_wait_for_the_writer_to_see_it)
    monkeypatch.setattr(kube, "gateway_for", lambda cluster: gateway)

    with pytest.raises(CommandError) as failed:
        call_command("binpack", "--cluster", handle.cluster.name)

    (run,) = BinpackRun.objects.all()
    assert [r.pk for r in settled] == [run.pk] and gateway.answered == ["a-0"]
    assert str(failed.value).startswith(f"3 of 4 cost(s) not written on cluster {handle.cluster.name} "
                                        f"(run {run.pk}): interrupted: ")
    out = capsys.readouterr().out.splitlines()
    lapsed = "not written, not tried: the run's lease lapsed while it wrote (taken to be settled as interrupted): "
    assert out[0].startswith("wrote team/a-0: ") and all(line.startswith(lapsed + "team/") for line in out[1:4])
    assert out[-1] == f"written 1, stale 0, errors 0, not tried (lease lapsed) 3 (run {run.pk})"
    costs = {p: annotations(core, p).get(labels.DELETION_COST) for p in PODS}
    assert costs == {"a-0": str(run.changes[0]["new"]), "a-1": None, "a-2": None, "b-0": None}
    assert run.state == BinpackRun.State.INTERRUPTED and (run.written, run.unwritten) == (1, 3)
    assert {c["pod"]: c["result"] for c in run.changes} == {
        "a-0": "written-late", "a-1": "settled-not-written", "a-2": "settled-not-written",
        "b-0": "settled-not-written"}
    (entry,) = AuditEntry.objects.filter(app="binpack", subject_id=run.pk)
    assert set(entry.new) == {f"{NS}/a-0"} and services.LATE_CAUSE in entry.cause
    assert (entry.actor, entry.actor_label) == (None, run.actor_label) and run.actor_label.startswith("cli:")
    assert run.errors[-1] == ("3 write(s) not tried: the run's lease lapsed while it wrote and another process took "
                              "it to settle as interrupted; the next run plans them again")


def test_a_writer_finishing_before_its_settler_records_records_its_run_and_the_settler_nothing(world, ops, settings,
                                                                                               no_renewal):
    """A settler claims the stalled run and reads the pods before the last write (b-0) lands;
    the writer then finishes before the settler records: every write answered, so the writer
    records its run as done and audits all four; the settler, finding it done, records
    nothing (its reading would have missed b-0)."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    read, writer_done, by_settler = threading.Event(), threading.Event(), []

    class ReadThenWait:
        def list(self, resource, **kwargs):
            pods = handle.gateway.list(resource, **kwargs)
            read.set()
            assert writer_done.wait(timeout=60)
            return pods

    def settle():
        try:
            by_settler.extend(services.binpack_runs_settle(
                cluster=handle.cluster, gateway=ReadThenWait(),
                now=clock.now() + timedelta(seconds=services.LEASE_SECONDS + 1)))
        finally:
            connections.close_all()

    settler = threading.Thread(target=settle)

    def start_the_settler():
        settler.start()
        assert read.wait(timeout=60)

    gateway = HeldWrite(handle.gateway, "b-0", start_the_settler)
    try:
        run, plan = services.pod_deletion_costs_apply(cluster=handle.cluster, actor=ops, gateway=gateway)
    finally:
        writer_done.set()
        settler.join(timeout=60)

    assert by_settler == []
    run.refresh_from_db()
    assert run.state == BinpackRun.State.DONE and (run.written, run.stale) == (4, 0) and run.lease_owner == ""
    (entry,) = AuditEntry.objects.filter(app="binpack", subject_id=run.pk)
    assert set(entry.new) == {f"{NS}/{p}" for p in PODS} and "interruption" not in entry.cause


# ---- writes whose answer was lost ---------------------------------------------------------------

def lost_answer(handle, *, pod: str = "a-0", applied: bool, then: str = "server errors"):
    """A fault for `PatchFaults`: `pod`'s first patch is `applied` by the API server or not
    (it timed out before reaching it), its answer lost either way; then the cluster stops
    answering pod patches: real 500s from the simulated cluster ("server errors"), or no
    answer at all ("no answer"). Returns the fault and the pods of the patches tried."""
    tried: list[str] = []

    def fault(name, send):
        if name != pod:
            return send()
        tried.append(name)
        if len(tried) == 1:
            if applied:
                send()
            if then == "server errors":
                handle.control.set_faults(error_rate=1.0, match={"verbs": ["patch"], "resources": ["pods"]})
            raise Unavailable(f"PATCH pods {name}: no answer: read timed out", code=0)
        if then == "server errors":
            return send()
        raise Unavailable(f"PATCH pods {name}: no answer: connection refused", code=0)
    return fault, tried


def apply_through(handle, gateway, *, actor, closing=None) -> BinpackRun:
    """A run (an admin action) writing through `gateway` (its faults); the gateway (or
    `closing`, the one `gateway` wraps) is closed and the cluster answers plainly again
    afterwards."""
    try:
        run, _ = services.pod_deletion_costs_apply(cluster=handle.cluster, actor=actor, gateway=gateway,
                                                   trigger=BinpackRun.Trigger.ADMIN)
    finally:
        (closing or gateway).close()
        handle.control.clear_faults()
    return run


def run_losing_an_answer(handle, settings, *, actor=None, **fault) -> BinpackRun:
    """A run (an admin action) whose write of a-0 met `lost_answer(**fault)`, one write at a
    time, so the others are not tried; the cluster answers again afterwards."""
    settings.BINPACK_WRITE_CONCURRENCY = 1
    run = apply_through(handle, PatchFaults.to(handle, settings, lost_answer(handle, **fault)[0]), actor=actor)
    assert run.results == ["unknown", "untried", "untried", "untried"] and run.unknown == 1
    return run


@pytest.mark.parametrize(("settled_by", "then"), [("command", "server errors"), ("beat", "no answer")])
def test_a_cost_applied_whose_answer_was_lost_is_settled_by_the_next_run_and_audited_once(
        world, settings, monkeypatch, capsys, client, ops, celery_eager, settled_by, then):
    """a-0's patch is applied but its answer lost, and the cluster then stops answering its
    retries: the command says its outcome is not known and exits 1, nothing is audited yet.
    The next run (the command's, or the beat's) finds the cost on the pod before it plans:
    audited once under the first run's actor, counted written; the next plan leaves it."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    fault, tried = lost_answer(handle, applied=True, then=then)
    gateway = PatchFaults.to(handle, settings, fault)
    with monkeypatch.context() as patched:
        patched.setattr(kube, "gateway_for", lambda cluster: gateway)
        with pytest.raises(CommandError) as failed:
            call_command("binpack", "--cluster", handle.cluster.name)
    gateway.close()
    handle.control.clear_faults()                                                   # it answers again

    (run,) = BinpackRun.objects.all()
    assert tried == ["a-0"] * settings.KUBE_RETRY_ATTEMPTS
    assert str(failed.value).startswith(
        "3 of 4 cost(s) not written and 1 of 4 cost(s) of unknown outcome (the write's answer was lost; the next "
        f"run on the cluster settles it from the pod) on cluster {handle.cluster.name} (run {run.pk}): team/a-0: ")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{WRITE_RESULTS['unknown']}: team/a-0: ")
    assert out[-1] == (f"written 0, stale 0, errors 0, outcome unknown 1 (settled by the next run), not tried 3 "
                       f"(run {run.pk})")
    planned = {c["pod"]: c["new"] for c in run.changes}
    assert annotations(core, "a-0")[labels.DELETION_COST] == str(planned["a-0"])    # applied all the same
    assert run.state == BinpackRun.State.DONE and (run.written, run.unknown, run.lease_owner) == (0, 1, "")
    assert [a["pod"] for a in run.announced] == ["a-0"]                              # kept for the settle
    assert {c["pod"]: c["result"] for c in run.changes} == {"a-0": "unknown", "a-1": "untried", "a-2": "untried",
                                                           "b-0": "untried"}
    assert not AuditEntry.objects.filter(app="binpack").exists()
    client.force_login(ops)
    assert list_cells(client, "/admin/capacity/binpackrun/", "written_shown") == [
        "0 of 4, 1 outcome(s) unknown (to be settled by the next run)"]
    assert list_cells(client, "/admin/capacity/binpackrun/", "unknown_shown") == ["1"]

    if settled_by == "command":
        call_command("binpack", "--cluster", handle.cluster.name)
        assert capsys.readouterr().out.splitlines()[0] == (
            f"run {run.pk} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z}) had 1 write(s) whose answer was lost, "
            "settled now from the pods: 1 found written and audited, 0 not written")
    else:
        result = binpack_cluster.apply(args=[handle.cluster.pk])
        assert result.successful(), result.result
        assert result.result["settled"] == [run.pk] and result.result["unknown"] == 0

    run.refresh_from_db()
    assert run.state == BinpackRun.State.DONE
    assert (run.written, run.unwritten, run.unknown, run.announced) == (1, 0, 0, [])
    assert {c["pod"]: c["result"] for c in run.changes}["a-0"] == "settled-written"
    (entry,) = AuditEntry.objects.filter(app="binpack", subject_type="binpack_run", subject_id=run.pk)
    assert entry.new == {f"{NS}/a-0": planned["a-0"]} and entry.old == {f"{NS}/a-0": None}
    assert entry.target == f"1 pod(s) of cluster {handle.cluster}"
    assert services.LOST_ANSWER_CAUSE in entry.cause and f"binpack run #{run.pk}" in entry.cause
    assert (entry.actor, entry.actor_label) == (None, run.actor_label) and run.actor_label.startswith("cli:")
    # The next run planned from the pods as settled: a-0 unchanged, the rest written.
    nxt = BinpackRun.objects.exclude(pk=run.pk).get()
    assert (nxt.planned, nxt.written, nxt.unchanged, nxt.unknown) == (3, 3, 1, 0)
    assert "a-0" not in {c["pod"] for c in nxt.changes}
    assert set(AuditEntry.objects.get(app="binpack", subject_id=nxt.pk).new) == {f"{NS}/{p}" for p in PODS[1:]}
    # Settled once: a further settle finds nothing, and the lists show the final counts.
    assert services.binpack_runs_settle(cluster=handle.cluster) == []
    assert AuditEntry.objects.filter(app="binpack", subject_id=run.pk).count() == 1
    assert list_cells(client, "/admin/capacity/binpackrun/", "written_shown") == ["3 of 3", "1 of 4"]
    html = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    assert escape(WRITE_RESULTS["settled-written"]) in {row[4] for row in changes_table(html)}


def test_a_write_that_timed_out_unapplied_is_settled_not_written_and_written_by_the_next_run(world, settings, ops):
    handle, core = world
    run = run_losing_an_answer(handle, settings, actor=ops, applied=False, then="no answer")
    assert labels.DELETION_COST not in annotations(core, "a-0")

    nxt, plan = services.pod_deletion_costs_apply(cluster=handle.cluster)

    assert [r.pk for r in nxt.settled] == [run.pk]
    assert settled_describe(nxt.settled[0]) == (
        f"run {run.pk} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z}) had 1 write(s) whose answer was lost, "
        "settled now from the pods: 0 found written and audited, 1 not written")
    run.refresh_from_db()
    assert (run.written, run.unwritten, run.unknown, run.announced) == (0, 1, 0, [])
    assert {c["pod"]: c["result"] for c in run.changes}["a-0"] == "settled-not-written"
    assert run.errors[-1].endswith("0 found written and audited then, 1 not written (the next run plans them again)")
    assert not AuditEntry.objects.filter(app="binpack", subject_id=run.pk).exists()
    # The next run wrote it, audited as its own.
    assert (nxt.planned, nxt.written) == (4, 4)
    a0 = next(c for c in plan.changes if c.name == "a-0")
    assert annotations(core, "a-0")[labels.DELETION_COST] == str(a0.new)
    assert AuditEntry.objects.get(app="binpack", subject_id=nxt.pk).new[f"{NS}/a-0"] == a0.new


@pytest.mark.parametrize("refusal", ["422 invalid", "429 throttled"])
def test_a_write_the_cluster_refused_stays_an_error_and_is_not_kept_for_settling(world, settings, ops, client,
                                                                                refusal):
    """A refusal says the write was not applied: nothing is left to settle."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1

    def invalid_cost_for_a0(pod, send):
        return send({"metadata": {"annotations": {labels.DELETION_COST: "soon"}}}) if pod == "a-0" else send()

    if refusal == "429 throttled":
        handle.control.set_faults(throttle_rate=1.0, match={"verbs": ["patch"], "resources": ["pods"]})
    run = apply_through(handle, PatchFaults.to(handle, settings, invalid_cost_for_a0 if refusal == "422 invalid"
                                               else lambda pod, send: send()), actor=ops)

    assert run.results[0] == "error" and run.errors[0].startswith(f"team/a-0: {refusal.split()[0]} ")
    run.refresh_from_db()
    assert run.state == BinpackRun.State.DONE and (run.unknown, run.announced) == (0, [])
    client.force_login(ops)
    assert list_cells(client, "/admin/capacity/binpackrun/", "unknown_shown") == ["0"]
    assert list_cells(client, "/admin/capacity/binpackrun/", "written_shown") == [f"{run.written} of 4"]

    nxt, plan = services.pod_deletion_costs_apply(cluster=handle.cluster)

    assert nxt.settled == [] and "a-0" in {c.name for c in plan.changes} and nxt.written == nxt.planned
    assert all(f"{NS}/a-0" not in e.new for e in AuditEntry.objects.filter(app="binpack", subject_id=run.pk))


def test_two_settlers_at_once_settle_a_lost_answer_once(world, settings, ops):
    """Settler A claims the run and reads the pods; meanwhile B finds it claimed and leaves
    it, then (A's claim lapsed) C takes it over and records it. A, holding a claim it lost,
    records nothing: the cost is audited once."""
    handle, core = world
    run = run_losing_an_answer(handle, settings, actor=ops, applied=True)
    gateway = handle.gateway
    by_b: list[BinpackRun] = []
    by_c: list[BinpackRun] = []

    class SlowReader:
        def list(self, resource, **kwargs):
            by_b.extend(services.binpack_runs_settle(cluster=handle.cluster, gateway=gateway))
            by_c.extend(settle_now(handle))
            return gateway.list(resource, **kwargs)

    by_a = services.binpack_runs_settle(cluster=handle.cluster, gateway=SlowReader())

    assert by_a == by_b == [] and [r.pk for r in by_c] == [run.pk]
    run.refresh_from_db()
    assert (run.written, run.unwritten, run.unknown, run.lease_owner) == (1, 0, 0, "")
    (entry,) = AuditEntry.objects.filter(app="binpack", subject_id=run.pk)
    assert set(entry.new) == {f"{NS}/a-0"} and entry.actor == ops
    assert services.binpack_runs_settle(cluster=handle.cluster) == []


def test_a_lost_answer_of_a_stalled_run_settled_meanwhile_is_settled_by_the_next_run_once(world, ops, settings,
                                                                                          no_renewal, client):
    """All four writes in flight; a-1's is held until the others answered and the run (its
    lease lapsed) was settled: three costs found. a-1's write is then applied but its answer
    lost, its retries refused: its process keeps it unknown, not written. The next run finds
    it on the pod and audits it, once."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 4
    losing = PatchFaults.to(handle, settings, lost_answer(handle, pod="a-1", applied=True)[0])
    held, settled = held_until_settled(losing, handle)
    run = apply_through(handle, held, actor=ops, closing=losing)

    assert [r.pk for r in settled] == [run.pk] and run.results[1] == "unknown"
    run.refresh_from_db()
    assert run.state == BinpackRun.State.INTERRUPTED and (run.written, run.unwritten, run.unknown) == (3, 0, 1)
    assert [a["pod"] for a in run.announced] == ["a-1"]
    assert {c["pod"]: c["result"] for c in run.changes}["a-1"] == "unknown"
    client.force_login(ops)
    assert list_cells(client, "/admin/capacity/binpackrun/", "written_shown") == [
        "3 of 4 announced (interrupted, settled from the cluster), 1 outcome(s) unknown (to be settled by the next "
        "run)"]

    nxt, _ = services.pod_deletion_costs_apply(cluster=handle.cluster)

    assert [r.pk for r in nxt.settled] == [run.pk] and (nxt.planned, nxt.unchanged) == (0, 4)
    run.refresh_from_db()
    assert run.state == BinpackRun.State.INTERRUPTED and (run.written, run.unwritten, run.unknown) == (4, 0, 0)
    assert {c["pod"]: c["result"] for c in run.changes} == dict.fromkeys(PODS, "settled-written")
    by_pod = audited(run)
    assert {p: len(entries) for p, entries in by_pod.items()} == dict.fromkeys(PODS, 1)   # each once
    assert services.LOST_ANSWER_CAUSE in by_pod["a-1"][0].cause and by_pod["a-1"][0].actor == ops


def test_the_admin_action_says_a_write_of_unknown_outcome_and_the_next_run_says_how_it_was_settled(
        world, settings, monkeypatch, ops, client):
    """An operator's "Run binpack now" whose write of a-0 was applied but its answer lost is
    told so, as a warning, not a success; the next run from the panel first says what it
    settled from the pods."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    fault, _ = lost_answer(handle, applied=True)
    gateway = PatchFaults.to(handle, settings, fault)
    client.force_login(ops)
    form = {"action": "run_binpack", "_selected_action": [handle.cluster.pk]}
    with monkeypatch.context() as patched:
        patched.setattr(kube, "gateway_for", lambda cluster: gateway)
        response = client.post("/admin/capacity/binpackcluster/", form, follow=True)
    gateway.close()
    handle.control.clear_faults()

    (run,) = BinpackRun.objects.all()
    (message,) = response.context["messages"]
    assert message.level == messages.WARNING
    assert str(message) == (f"{handle.cluster.name}: wrote 0 of 4 cost(s), 0 unchanged, 2 skipped, 0 stale, "
                            f"0 error(s), 1 of unknown outcome (the write's answer was lost; the next run settles it "
                            f"from the pod), 3 not tried (the cluster had stopped answering) (run {run.pk})")

    response = client.post("/admin/capacity/binpackcluster/", form, follow=True)

    nxt = BinpackRun.objects.exclude(pk=run.pk).get()
    settled, done = response.context["messages"]
    assert settled.level == messages.WARNING and str(settled) == (
        f"{handle.cluster.name}: run {run.pk} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z}) had 1 write(s) whose "
        "answer was lost, settled now from the pods: 1 found written and audited, 0 not written")
    assert done.level == messages.SUCCESS and str(done) == (     # a-0's cost, settled, is left as it is
        f"{handle.cluster.name}: wrote 3 of 3 cost(s), 1 unchanged, 2 skipped, 0 stale, 0 error(s) (run {nxt.pk})")
