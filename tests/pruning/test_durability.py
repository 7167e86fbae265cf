"""A worker dying mid-prune loses nothing: the before-state is recorded before the
Kubernetes write, the run's lapsed lease brings the reconcile, and restore undoes what
the dead worker took away. Failures say whether trying again may help.

The crash is real: a separate process runs the prune and SIGKILLs itself around the
write (`crash_worker.py`), against the test's PostgreSQL database and simulated cluster.
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
from kubernetes import client as k8s

from clusters.errors import (ConfigError, Conflict, Forbidden, Invalid, NotFound, PrometheusError,
                             TooManyRequests, Unavailable, is_transient)
from clusters.models import Cluster
from config import clock
from pruning.models import PruneDecision, PruneRun
from pruning.services import (LEASE_SECONDS, PruneParams, prune_decision_restore, prune_run_execute,
                              prune_runs_reconcile)

from pruning_world import World, deployment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parents[2]
CRASH_WORKER = Path(__file__).with_name("crash_worker.py")


def _database_url() -> str:
    db = django_settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "the crash test shares the database with its worker process"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        w.create(deployment("web", "team-a", replicas=3, util="0"))
        w.record_history(minutes=40)
        prom = w.prometheus()
        w.cluster = Cluster.objects.create(name="sim", kubeconfig_path=w.kubeconfig, prometheus_url=prom.url)
        yield w


def replicas(world) -> int:
    return k8s.AppsV1Api(world.api).read_namespaced_deployment_scale("web", "team-a").spec.replicas


def crash_worker(world, point: str) -> None:
    env = {**os.environ, "DATABASE_URL": _database_url(), "PYTHONPATH": str(ROOT), "KUBE_RETRY_BACKOFF": "0.05"}
    env.pop("KUBECONFIG", None)
    done = subprocess.run([sys.executable, str(CRASH_WORKER), "sim", world.now().isoformat(), point],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def after_the_lease() -> "clock.datetime":
    return clock.now() + timedelta(seconds=LEASE_SECONDS + 1)


@pytest.mark.parametrize("undo", ["reconcile, then restore", "restore at once"])
def test_a_worker_killed_after_the_write_leaves_a_restorable_decision(world, undo):
    crash_worker(world, "after-write")

    # What the dead worker left: the Deployment at 0, and the row that says so.
    assert replicas(world) == 0
    run = PruneRun.objects.get()
    decision = run.decisions.get(decision="prune")
    assert run.status == "running"
    assert (decision.result, decision.restore_state, decision.applied_state) == (
        "acting", {"replicas": 3}, {"replicas": 0})
    assert decision.restorable

    # Its lease is still live: nobody takes the run from a worker that may still be working.
    assert prune_runs_reconcile(now=clock.now()).runs_completed == []
    assert PruneRun.objects.get().status == "running"

    if undo == "reconcile, then restore":
        report = prune_runs_reconcile(now=after_the_lease())
        assert report.runs_completed == [run.pk] and report.decisions_settled == 1
        run.refresh_from_db()
        decision.refresh_from_db()
        assert (run.status, run.acted, run.lease_expires_at) == ("succeeded", 1, None)
        assert "the run's worker stopped" in run.errors[0] and "reconciled from the cluster" in run.errors[0]
        assert (decision.result, decision.event_sent) == ("succeeded", True)
        events = k8s.CoreV1Api(world.api).list_namespaced_event("team-a").items
        assert [e.message for e in events if e.reason == "GPUIdleScaledToZero"
                and "confirmed from the cluster" in e.message]
        # A second beat changes nothing.
        assert prune_runs_reconcile(now=after_the_lease()).runs_completed == []

    restored = prune_decision_restore(kube_gateway=world.gateway, decision=decision, actor="alice", now=world.now())
    assert (restored.result, restored.restore) == ("succeeded", "restored")
    assert replicas(world) == 3


def test_a_worker_killed_before_the_write_changed_nothing_and_says_so(world):
    crash_worker(world, "before-write")
    assert replicas(world) == 3
    run = PruneRun.objects.get()
    assert run.decisions.get(decision="prune").result == "acting"

    report = prune_runs_reconcile(now=after_the_lease())
    run.refresh_from_db()
    decision = run.decisions.get(decision="prune")
    assert report.runs_completed == [run.pk] and run.status == "partial"
    assert decision.result == "failed" and decision.restore_state is None
    assert "nothing was changed" in decision.error and not decision.restorable
    with pytest.raises(ValueError, match="was not acted on"):
        prune_decision_restore(kube_gateway=world.gateway, decision=decision, actor="alice", now=world.now())
    assert replicas(world) == 3
    # The next run finds the idle pods again and acts.
    again = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                              cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    assert again.acted == 1 and replicas(world) == 0


def test_a_run_killed_before_it_recorded_decisions_is_marked_failed(world):
    run = PruneRun.objects.create(cluster=world.cluster, mode="scale-down", evaluated_at=world.now(),
                                  lease_owner="worker:gone:1:x", lease_expires_at=clock.now() + timedelta(seconds=30))
    assert prune_runs_reconcile(now=clock.now()).runs_failed == []
    assert prune_runs_reconcile(now=after_the_lease()).runs_failed == [run.pk]
    run.refresh_from_db()
    assert run.status == "failed" and "stopped before recording any decision; nothing was changed" in run.errors[0]


def test_planned_scale_downs_a_dead_worker_never_reached_are_said_to_be_not_started(world):
    world.create(deployment("other", "team-b", util="0"))
    world.record_history(minutes=40)
    # The worker records its plan, then dies before acting on anything.
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            cluster=world.cluster, params=PruneParams())
    run_dead = PruneRun.objects.create(cluster=world.cluster, mode="scale-down", evaluated_at=world.now(),
                                       lease_owner="worker:gone:2:y",
                                       lease_expires_at=clock.now() - timedelta(seconds=5), planned=2,
                                       pods_seen=2, idle_candidates=2)
    for d in run.decisions.all():
        d.pk, d.run, d.result = None, run_dead, ""
        d.save()
    prune_runs_reconcile(now=clock.now())
    run_dead.refresh_from_db()
    assert run_dead.status == "failed" and "2 planned scale-down(s) were never started" in run_dead.errors[0]
    assert run_dead.decisions.filter(reason="run-interrupted").count() == 2
    assert not run_dead.decisions.filter(decision="prune").exists()
    assert replicas(world) == 3


def test_a_worker_that_lost_its_lease_stops_acting(world, monkeypatch):
    from pruning import services

    real_renew = services._Lease.renew
    calls = []

    def renew_then_lose(self, **fields):
        calls.append(fields)
        if len(calls) == 2:   # before the first write: the reconcile took the run meanwhile
            PruneRun.objects.filter(pk=self.run.pk).update(lease_owner="reconcile:elsewhere")
        return real_renew(self, **fields)

    monkeypatch.setattr(services._Lease, "renew", renew_then_lose)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    assert replicas(world) == 3 and run.decisions.get(decision="prune").result == ""
    assert world.gateway.calls_total(("patch",)) == 0


# --- errors that say whether to retry -------------------------------------------------------

@pytest.mark.parametrize("exc,transient", [
    (Unavailable("no answer", code=0), True), (Unavailable("bad gateway", code=502), True),
    (TooManyRequests("slow down"), True), (TimeoutError("read timed out"), True),
    (ConnectionResetError("reset"), True), (PrometheusError("503", status=503, transient=True), True),
    (Forbidden("no"), False), (Forbidden("who are you", code=401), False), (NotFound("gone"), False),
    (Invalid("bad"), False), (Conflict("stale"), False), (ConfigError("no kubeconfig"), False),
    (PrometheusError("bad query", status=400), False), (ValueError("nan"), False),
])
def test_is_transient_tells_a_retry_from_a_refusal(exc, transient):
    assert is_transient(exc) is transient


def test_a_conflict_that_persists_after_re_reading_fails_the_step_with_its_reason(world):
    world.control.set_faults(seed=3, conflict_rate=1.0, match={"verbs": ["patch"]})
    try:
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                                cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    finally:
        world.control.clear_faults()
    d = run.decisions.get(decision="prune")
    assert (run.status, d.result, d.event_sent) == ("partial", "failed", False)
    assert "kept changing under the write (3 re-reads)" in d.error and "nothing was changed" in d.error
    assert world.gateway.calls_total(("patch",)) == 3    # re-read and tried again, then gave up
    assert replicas(world) == 3


def test_the_task_retries_a_transient_failure_and_not_a_refusal(world, tmp_path, settings):
    from django.utils import timezone

    from simcluster.kubeconfig import write_kubeconfig

    from config.celery import app
    from pruning.tasks import prune_cluster

    refused = Cluster.objects.create(name="bad-token", prometheus_url=world.cluster.prometheus_url,
                                     kubeconfig_path=str(write_kubeconfig(tmp_path / "bad", world.url, token="nope")))
    unreachable = Cluster.objects.create(name="down", prometheus_url=world.cluster.prometheus_url,
                                         kubeconfig_path=str(write_kubeconfig(tmp_path / "down",
                                                                              "http://127.0.0.1:9")))
    # The product's clock at the simulated cluster's time, where the GPU history is.
    offset = tmp_path / "offset"
    offset.write_text(str((world.now() - timezone.now()).total_seconds()))
    settings.CLOCK_OFFSET_FILE = str(offset)
    app.conf.task_always_eager = True
    try:
        refusal = prune_cluster.apply(args=[refused.pk])
        outage = prune_cluster.apply(args=[unreachable.pk])
    finally:
        app.conf.task_always_eager = False
    assert refusal.failed() and isinstance(refusal.result, Forbidden)
    assert outage.failed() and isinstance(outage.result, Unavailable)
    # The refusal ran once and says why; the unreachable cluster was tried 1 + 3 times.
    refused_runs = PruneRun.objects.filter(cluster=refused)
    assert refused_runs.count() == 1
    assert refused_runs.get().errors[0].startswith("refused: 401")
    down_runs = PruneRun.objects.filter(cluster=unreachable)
    assert down_runs.count() == 4 and all(r.errors[0].startswith("transient: ") for r in down_runs)
    assert not PruneRun.objects.filter(status="running").exists()


def test_an_unreadable_cluster_keeps_the_run_pending_then_failed_and_the_decision_checked(world, tmp_path):
    from clusters.kube import KubeGateway
    from simcluster.kubeconfig import write_kubeconfig

    crash_worker(world, "after-write")
    run = PruneRun.objects.get()
    down = KubeGateway.from_kubeconfig(str(write_kubeconfig(tmp_path / "down", "http://127.0.0.1:9")),
                                       retry_attempts=1, backoff=0.0)

    report = prune_runs_reconcile(now=after_the_lease(), gateway_of=lambda cluster: down)
    assert report.runs_pending == [run.pk]
    run.refresh_from_db()
    decision = run.decisions.get(decision="prune")
    assert run.status == "running" and decision.result == "acting"
    assert "outcome not yet known, the owner could not be read (transient: " in decision.error

    # An hour on, the run is marked failed, and says why; the decision is still checked.
    later = clock.now() + timedelta(hours=1, minutes=1)
    assert prune_runs_reconcile(now=later, gateway_of=lambda cluster: down).runs_failed == [run.pk]
    run.refresh_from_db()
    assert run.status == "failed" and "1 scale-down(s) could not be confirmed" in run.errors[0]
    assert PruneDecision.objects.get(pk=decision.pk).restorable

    # The cluster answers again: the next beat settles it, and restore brings the replicas back.
    assert prune_runs_reconcile(now=later).decisions_settled == 1
    decision.refresh_from_db()
    assert decision.result == "succeeded"
    prune_decision_restore(kube_gateway=world.gateway, decision=decision, actor="alice", now=world.now())
    assert replicas(world) == 3
