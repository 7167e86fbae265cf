"""The step task's lease on real PostgreSQL: a live worker keeps its job through its heartbeat
thread even while one step outlasts the lease, and learns when it lost the job; a dead
worker's lease lapses within LEASE_SECONDS and the resume beat re-queues the job."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.defrag import tasks
from capacity.defrag.models import DefragJob, JobState
from capacity.defrag.services import LEASE_SECONDS, defrag_job_lease_acquire, defrag_jobs_due
from clusters.models import Cluster
from config import clock

pytestmark = pytest.mark.django_db(transaction=True)   # the heartbeat thread has its own connection


def _job() -> DefragJob:
    cluster = Cluster.objects.create(name="leases", kubeconfig_path="/nonexistent")
    return DefragJob.objects.create(cluster=cluster, node_name="n1", state=JobState.WAITING, created_at=clock.now())


def test_a_step_longer_than_the_lease_keeps_the_job_through_its_heartbeat(monkeypatch):
    job = _job()
    moved = {"seconds": 0.0}
    monkeypatch.setattr(tasks.clock, "now", lambda: timezone.now() + timedelta(seconds=moved["seconds"]))
    monkeypatch.setattr(tasks, "HEARTBEAT_SECONDS", 0.05)
    assert defrag_job_lease_acquire(job_id=job.pk, owner="w1", now=tasks.clock.now())
    with tasks._heartbeat(job_id=job.pk, owner="w1") as heartbeat:
        # One step blocked in slow API calls for twice the lease (time moved, not waited).
        for _ in range(4):
            moved["seconds"] += LEASE_SECONDS / 2
            before = DefragJob.objects.get(pk=job.pk).heartbeat_at
            deadline = time.monotonic() + 5
            while DefragJob.objects.get(pk=job.pk).heartbeat_at == before:
                assert time.monotonic() < deadline, "no heartbeat"
                time.sleep(0.01)
            assert defrag_jobs_due(now=tasks.clock.now()) == [], "the live worker's job is not handed out"
        assert not heartbeat.lost.is_set()
    assert [t for t in threading.enumerate() if t.name.startswith("defrag-lease-")] == []


def test_a_worker_whose_lease_lapsed_and_was_taken_learns_it_at_its_next_heartbeat(monkeypatch):
    job = _job()
    monkeypatch.setattr(tasks, "HEARTBEAT_SECONDS", 0.05)
    now = clock.now()
    assert defrag_job_lease_acquire(job_id=job.pk, owner="w1", now=now)
    # w1 stalled (a paused VM): its lease lapsed and w2 took the job.
    assert defrag_job_lease_acquire(job_id=job.pk, owner="w2", now=now + timedelta(seconds=LEASE_SECONDS + 1))
    with tasks._heartbeat(job_id=job.pk, owner="w1") as heartbeat:
        assert heartbeat.lost.wait(5)
    assert DefragJob.objects.get(pk=job.pk).lease_owner == "w2", "the loser did not take it back"


def test_a_dead_workers_job_is_due_again_within_one_lease_and_requeued_by_the_next_beat(monkeypatch):
    from config.schedule import SCHEDULES

    job = _job()
    now = clock.now()
    assert defrag_job_lease_acquire(job_id=job.pk, owner="killed", now=now)
    assert defrag_jobs_due(now=now + timedelta(seconds=LEASE_SECONDS - 1)) == []
    assert defrag_jobs_due(now=now + timedelta(seconds=LEASE_SECONDS + 0.1)) == [job.pk]
    queued = []
    monkeypatch.setattr(tasks.defrag_job_run, "delay", queued.append)
    monkeypatch.setattr(tasks.clock, "now", lambda: now + timedelta(seconds=LEASE_SECONDS + 0.1))
    assert tasks.defrag_jobs_resume() == 1 and queued == [job.pk]
    [resume] = [p for p in SCHEDULES if p.task == "capacity.tasks.defrag_jobs_resume"]
    assert LEASE_SECONDS + resume.every_seconds <= 45, "a whole-worker kill is recovered well inside a minute"


def test_with_redis_the_broker_hands_an_unacknowledged_step_back_after_the_longest_step_not_an_hour():
    """kombu's default visibility timeout (1 h) left a killed worker's job unstepped that long;
    below the longest step and countdown, Redis would hand a live step to a second worker."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0", "DJANGO_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-c", "import json, config.settings as s; print(json.dumps("
                          "[s.CELERY_BROKER_TRANSPORT_OPTIONS, s.CELERY_TASK_ACKS_LATE, "
                          "s.CELERY_TASK_REJECT_ON_WORKER_LOST]))"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    options, acks_late, reject_on_lost = json.loads(out.stdout.strip().splitlines()[-1])
    assert acks_late and reject_on_lost
    assert tasks.STEP_BUDGET_SECONDS + tasks.MAX_COUNTDOWN_SECONDS < options["visibility_timeout"] < 3600
