"""Celery tasks of the capacity app: a worker loops one defrag job over its steps."""
from __future__ import annotations

import logging
import time

from celery import shared_task

from clusters.errors import KubeError
from config import clock

from capacity.models import RESTING_STATES, RUNNING_STATES, DefragJob, JobState
from capacity.services import defrag_job_step, defrag_job_wait

log = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True)
def defrag_job_run(job_id: int) -> str:
    """Step the job until it rests (safe, blocked, failed, drained, aborted).

    With acks_late a worker killed mid-job gets the message redelivered, and the job
    resumes from its recorded step; `defrag_jobs_resume` catches jobs whose message was lost.
    """
    job = DefragJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    while job.state not in RESTING_STATES:
        job = defrag_job_step(job=job, now=clock.now())
        if job.state in RESTING_STATES:
            break
        if job.next_check_at:
            pause = max(0.0, min((job.next_check_at - clock.now()).total_seconds(), job.poll_interval_seconds))
            if job.state == JobState.WAITING and not job.error:
                # Wake on the first PodAutoscaler change rather than at the end of the interval.
                try:
                    woken = defrag_job_wait(job=job, timeout_seconds=job.poll_interval_seconds)
                except KubeError as exc:  # the watch failed: fall back to the interval
                    log.warning("defrag job %s: watch failed, polling: %s", job.pk, exc)
                    woken = False
                    time.sleep(pause)
                if woken:
                    job.next_check_at = None
                    job.save(update_fields=["next_check_at", "updated_at"])
            else:
                time.sleep(pause)
        job.refresh_from_db()  # an operator may have asked to abort meanwhile
    return job.state


@shared_task(ignore_result=True)
def defrag_jobs_resume(stale_seconds: float = 300.0) -> int:
    """Re-enqueue running jobs no worker has written for `stale_seconds` (a lost message)."""
    from datetime import timedelta

    from django.utils import timezone

    stale = DefragJob.objects.filter(state__in=RUNNING_STATES,
                                     updated_at__lt=timezone.now() - timedelta(seconds=stale_seconds))
    count = 0
    for job_id in stale.values_list("pk", flat=True):
        defrag_job_run.delay(job_id)
        count += 1
    return count

# Issue 6: the binpack and runbook tasks live in their packages; import them so the
# worker registers them (autodiscovery looks at capacity.tasks only).
from capacity.binpack import tasks as _binpack_tasks  # noqa: E402,F401
from capacity.runbook import tasks as _runbook_tasks  # noqa: E402,F401
