"""Defrag reads: a job's log lines after a point, the jobs a worker should step, a job's
orphans still tracked, the other live jobs holding nodes, what a stuck message said, and
when (and by whom) a job's node was returned to service."""
from __future__ import annotations

from datetime import datetime

from django.db.models import F, OuterRef, Q, Subquery

from audit.models import AuditEntry
from audit.selectors import entries_of_subject

from capacity.defrag.models import (
    LIVE_STATES,
    RUNNING_STATES,
    DefragJob,
    DefragLogLine,
    DefragRevision,
    JobState,
    OrphanState,
)


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


def defrag_revision_orphan_names(*, revision: DefragRevision) -> list[str]:
    """ns/name of the revision's orphans the job still tracks."""
    return [f"{o.namespace}/{o.pod_name}" for o in revision.orphans.filter(
        state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).order_by("pod_name")]


def defrag_job_live_orphans(*, job: DefragJob) -> int:
    """How many of the job's orphans are planned or still serving (not yet gone)."""
    return job.orphans.filter(state__in=[OrphanState.PLANNED, OrphanState.ORPHANED, OrphanState.DELETING]).count()


def defrag_jobs_holding_nodes(*, job: DefragJob) -> dict[str, tuple[int, str]]:
    """node name -> (id, state) of each other live job of the job's cluster: who holds a
    cordoned node's room."""
    return {node: (pk, state) for node, pk, state in DefragJob.objects.filter(
        cluster=job.cluster, state__in=LIVE_STATES).exclude(pk=job.pk).values_list("node_name", "pk", "state")}


def defrag_job_stuck_counts_said(*, job: DefragJob) -> dict[str, tuple[int, int]]:
    """The ready counts the job's stuck message gives: those its last `job_abort_stuck`
    entry recorded with it."""
    entry = entries_of_subject(subject_type="defrag_job", subject_id=job.pk).filter(action="job_abort_stuck").first()
    kept = ((entry.new or {}).get("kept") or ()) if entry is not None else ()
    return {k["revision"]: (k["ready"], k["wanted"]) for k in kept}


# The audit action a return to service of a job's node is recorded under (return_to_service.py).
RETURN_ACTION = "node_return_to_service"


def defrag_job_return(*, job_id: int):
    """The newest return to service of the job's node, as its audit entry records it (`at`,
    `actor`, `actor_label`), or None when the product never returned it to service."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job_id).filter(action=RETURN_ACTION).first()


def defrag_jobs_with_return(queryset):
    """`queryset` with, per job, its newest return to service: `returned_at`, and who asked it
    (`returned_by_username`, `returned_by_label`); None where the node was never returned."""
    newest = AuditEntry.objects.filter(subject_type="defrag_job", subject_id=OuterRef("pk"),
                                       action=RETURN_ACTION).order_by("-at", "-id")
    return queryset.annotate(returned_at=Subquery(newest.values("at")[:1]),
                             returned_by_username=Subquery(newest.values("actor__username")[:1]),
                             returned_by_label=Subquery(newest.values("actor_label")[:1]))
