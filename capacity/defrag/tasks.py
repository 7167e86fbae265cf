"""Defrag tasks: short steps under a lease, and the resume beat.

Their names stay `capacity.tasks.…`: messages already queued and the installed beat row
name them so, and a rename would strand them across a deploy.
"""
from __future__ import annotations

import logging
import os
import socket
import time

from celery import shared_task

from clusters.errors import KubeError
from config import clock
from config.leases import LeaseHeartbeat, task_lease_owner

from capacity.defrag.models import DefragJob, JobState
from capacity.defrag.selectors import defrag_jobs_due
from capacity.defrag.services import (
    DEFRAG_JOB_RUN_TASK,
    defrag_job_lease_acquire,
    defrag_job_lease_release,
    defrag_job_lease_renew,
    defrag_job_pause_seconds,
    defrag_job_resting,
    defrag_job_step,
    defrag_job_wait,
    defrag_return_intents_settle,
)

log = logging.getLogger(__name__)


# A step task stops after this many seconds of wall time and re-queues itself: a step is a
# short task (a killed worker loses at most this much), well below the broker's
# visibility timeout (config/settings.py).
STEP_BUDGET_SECONDS = 20.0
# How often a stepping worker renews its lease (seconds), from a thread of its own so that
# a step blocked in a slow API call (a request may wait 30 s, the gateway retries) keeps
# the job: a third of services.LEASE_SECONDS, so two renewals may fail before it lapses.
HEARTBEAT_SECONDS = 10.0
# The longest a job's next check is queued ahead (seconds): below the visibility timeout.
MAX_COUNTDOWN_SECONDS = 60.0


@shared_task(name=DEFRAG_JOB_RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
             ignore_result=True)
def defrag_job_run(self, job_id: int) -> str:
    """Step the job for a short while under its lease, then hand it back to the queue.

    Two copies of this task for one job (a redelivered message, the resume beat) do not
    step it together: the second finds the lease taken and returns. A worker killed
    mid-step leaves the lease to expire (LEASE_SECONDS, 30 s); `defrag_jobs_resume` then
    re-queues the job and the next worker resumes from its recorded step.
    """
    owner = task_lease_owner(self)
    if not defrag_job_lease_acquire(job_id=job_id, owner=owner, now=clock.now()):
        return "leased"
    log.info("defrag job %s: stepped by %s on %s pid %s", job_id, owner, socket.gethostname(), os.getpid())
    job = DefragJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    started = time.monotonic()
    try:
        with _heartbeat(job_id=job_id, owner=owner) as heartbeat:
            while True:
                job = defrag_job_step(job=job, now=clock.now())
                if defrag_job_resting(job=job, now=clock.now()):
                    return job.state
                if heartbeat.lost.is_set() or not defrag_job_lease_renew(job_id=job_id, owner=owner,
                                                                         now=clock.now()):
                    return "lease lost"
                left = STEP_BUDGET_SECONDS - (time.monotonic() - started)
                pause = _pause(job)
                if pause > left:
                    break
                if pause > 0:
                    _wait(job, pause)
    finally:
        defrag_job_lease_release(job_id=job_id, owner=owner)
    defrag_job_run.apply_async((job_id,), countdown=min(_pause(job), MAX_COUNTDOWN_SECONDS))
    return job.state


def _heartbeat(*, job_id: int, owner: str) -> LeaseHeartbeat:
    """Renews the job's lease every HEARTBEAT_SECONDS while the task steps it; its `lost` is
    set once the lease was taken by another worker (the task then stops at its next step)."""
    return LeaseHeartbeat(renew=lambda: defrag_job_lease_renew(job_id=job_id, owner=owner, now=clock.now()),
                          every_seconds=HEARTBEAT_SECONDS, name=f"defrag-lease-{job_id}")


def _pause(job: DefragJob) -> float:
    return defrag_job_pause_seconds(job=job, now=clock.now())


def _wait(job: DefragJob, pause: float) -> None:
    """Until the next check, or until one of the job's PodAutoscalers changes."""
    if job.state == JobState.WAITING and not job.error:
        try:
            woken = defrag_job_wait(job=job, timeout_seconds=pause)
        except KubeError as exc:  # the watch failed: fall back to the interval
            log.warning("defrag job %s: watch failed, polling: %s", job.pk, exc)
            time.sleep(pause)
            return
        if woken:
            DefragJob.objects.filter(pk=job.pk, state=JobState.WAITING).update(next_check_at=None)
    else:
        time.sleep(pause)


@shared_task(name="capacity.tasks.defrag_jobs_resume", ignore_result=True)
def defrag_jobs_resume() -> int:
    """Every 10 s (config/schedule.py): re-queue each live job that should be stepped and
    no worker holds (its lease expired, or its queued message was lost). First, record
    what became of each return to service whose process stopped between its uncordon and
    its record (its audit entry, and the abort it asked for)."""
    try:
        defrag_return_intents_settle(now=clock.now())
    except Exception:  # noqa: BLE001 - the database blinked: the resume below must still run; next beat retries
        log.exception("defrag: returns to service left unrecorded were not settled now")
    due = defrag_jobs_due(now=clock.now())
    # A retired cluster is gone: no periodic job acts on it, so its open jobs are not stepped.
    due = list(DefragJob.objects.filter(pk__in=due, cluster__retired_at__isnull=True).order_by("pk")
               .values_list("pk", flat=True))
    for job_id in due:
        defrag_job_run.delay(job_id)
    return len(due)
