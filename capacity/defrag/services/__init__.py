"""Defrag jobs: discovery, start, one step at a time, drain and abort.

A job advances by `defrag_job_step`, which does at most one kind of side effect and then
records it (`_commit`) before returning. A Celery task holding the job's lease runs a few
steps; tests call it directly and move the simulated clock in between. Crash safety comes
from the order: each step re-reads what it is about to change, skips what is already done
(a crash between the side effect and `_commit` leaves the effect in the cluster and the
step in the database), and only then writes.

Races: every record is one conditional UPDATE (`WHERE id, state, version` as loaded by the
step); a step that loses re-reads and decides again. Operators never write the state: an
abort or a drain is a request in its own columns, taken up by the next step, so no step
can write over it.

Where each part lives:
  jobs.py               discovery, start, the step dispatcher and its table, the wait
                        between steps, the drain and abort requests
  steps.py              the forward steps: record the scales, cordon, orphan, wait, safe/failed
  orphans.py            ending orphans (evict, delete) under write-ahead intents
  drain.py, abort.py    the drain of a safe node; undoing a job, abort-stuck and its checks
  return_to_service.py  uncordoning a node a job has held, under its intent
  leases.py             which worker steps a job
  record.py             the step's record (compare-and-set), its log, audit entries, Events
Reads are in capacity/defrag/selectors.py, decisions in capacity/defrag/planning.py.
"""
from __future__ import annotations

from capacity.defrag.selectors import defrag_job_log_after, defrag_jobs_due
from capacity.defrag.services.record import (
    RESUME_PROMISE,
    RESUME_SECONDS,
    DefragError,
    ReturnUnconfirmed,
    StaleJob,
)
from capacity.defrag.services.jobs import (
    DEFRAG_JOB_RUN_TASK,
    ERROR_RETRY_SECONDS,
    POLL_RANGE,
    TIMEOUT_RANGE,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_pause_seconds,
    defrag_job_resting,
    defrag_job_start,
    defrag_job_step,
    defrag_job_wait,
    defrag_command,
    defrag_job_way_out,
    drain_refusal,
)
from capacity.defrag.services.steps import (
    SAFE_MESSAGE,
)
from capacity.defrag.services.orphans import (
    ANSWER_LOST_GONE,
    END_INTERRUPTED,
    EVICTION_REFUSED,
    EVICTION_RETRY_SECONDS,
    eviction_retry_seconds,
)
from capacity.defrag.services.abort import (
    NODE_OUTCOMES,
    NODE_RETURNED,
    NODE_UNCORDONING,
    abort_recheck_seconds,
)
from capacity.defrag.services.return_to_service import (
    ENDED_BY_RETURN,
    RETURNABLE_STATES,
    RETURN_INTENT_LAPSE_SECONDS,
    ReturnToService,
    defrag_job_holding_reason,
    defrag_return_intents_settle,
    node_return_to_service,
)
from capacity.defrag.services.leases import (
    LEASE_SECONDS,
    defrag_job_lease_acquire,
    defrag_job_lease_release,
    defrag_job_lease_renew,
)

__all__ = [
    "ANSWER_LOST_GONE",
    "DEFRAG_JOB_RUN_TASK",
    "DefragError",
    "ENDED_BY_RETURN",
    "END_INTERRUPTED",
    "ERROR_RETRY_SECONDS",
    "EVICTION_REFUSED",
    "EVICTION_RETRY_SECONDS",
    "LEASE_SECONDS",
    "NODE_OUTCOMES",
    "NODE_RETURNED",
    "NODE_UNCORDONING",
    "POLL_RANGE",
    "RESUME_PROMISE",
    "RESUME_SECONDS",
    "RETURNABLE_STATES",
    "RETURN_INTENT_LAPSE_SECONDS",
    "ReturnToService",
    "ReturnUnconfirmed",
    "SAFE_MESSAGE",
    "StaleJob",
    "TIMEOUT_RANGE",
    "abort_recheck_seconds",
    "defrag_discover",
    "defrag_job_abort",
    "defrag_job_drain",
    "defrag_job_holding_reason",
    "defrag_job_lease_acquire",
    "defrag_job_lease_release",
    "defrag_job_lease_renew",
    "defrag_job_log_after",
    "defrag_job_pause_seconds",
    "defrag_job_resting",
    "defrag_job_start",
    "defrag_job_step",
    "defrag_job_wait",
    "defrag_jobs_due",
    "defrag_return_intents_settle",
    "defrag_command",
    "defrag_job_way_out",
    "drain_refusal",
    "eviction_retry_seconds",
    "node_return_to_service",
]
