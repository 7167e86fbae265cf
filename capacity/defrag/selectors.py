"""Defrag reads: a job's log lines after a point, and the jobs a worker should step."""
from __future__ import annotations

from datetime import datetime

from django.db.models import F, Q

from capacity.defrag.models import LIVE_STATES, RUNNING_STATES, DefragJob, DefragLogLine, JobState


def defrag_job_log_after(*, job: DefragJob, seq: int) -> list[tuple[int, str]]:
    """(seq, line) of the kept lines after `seq`, oldest first: how a follower (the CLI)
    reads on from where it stopped, and sees from a jump in the numbers what it missed."""
    return list(DefragLogLine.objects.filter(job=job, seq__gt=seq).order_by("seq").values_list("seq", "text"))


def defrag_jobs_due(*, now: datetime) -> list[int]:
    """Jobs a worker should step and none does: running (or with an operator's request not
    taken up), or abort-stuck (its orphans may end now: `_step_recheck`), no live lease, and
    their next check due."""
    pending_abort = Q(abort_requested_at__isnull=False) & (
        Q(abort_started_at__isnull=True) | Q(abort_requested_at__gt=F("abort_started_at")))
    pending_drain = Q(state=JobState.SAFE, drain_requested_at__isnull=False)
    wanted = (Q(state__in=RUNNING_STATES) | Q(state=JobState.ABORT_STUCK)
              | (Q(state__in=LIVE_STATES) & (pending_abort | pending_drain)))
    unleased = Q(lease_owner="") | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    due = Q(next_check_at__isnull=True) | Q(next_check_at__lte=now)
    return list(DefragJob.objects.filter(wanted & unleased & due).order_by("pk").values_list("pk", flat=True))
