"""A defrag job from the operator's side and the dispatcher: discovery, start, one step
at a time (`defrag_job_step` and its table of actions), the wait between steps, and the
drain and abort requests the next step takes up."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import IntegrityError, transaction

from clusters import kube
from clusters.errors import Invalid, KubeError, NotFound
from clusters.labels import REVISION_LABEL
from clusters.services import cluster_lock
from clusters.snapshot import NodeView, PodView
from config import clock
from config.celery import task_send

from capacity.defrag.models import LIVE_STATES, RUNNING_STATES, AbortChoice, DefragJob, JobState
from capacity.defrag.planning import (
    DefragPlan,
    RevisionScale,
    Role,
    Step,
    defrag_plan,
    defrag_step_decide,
    interval_validate,
    pod_classify,
)
from capacity.defrag.services.abort import _step_abort, _step_recheck
from capacity.defrag.services.drain import _step_drain
from capacity.defrag.services.record import (
    DefragError,
    RESUME_PROMISE,
    StaleJob,
    _append_log,
    _audit,
    _commit,
    _gateway,
    _loaded,
    _log_write,
    _scale,
)
from capacity.defrag.services.steps import (
    _fail,
    _step_cordon,
    _step_orphan,
    _step_record,
    _step_wait,
    _take_up_abort,
    _take_up_drain,
    _timed_out,
)

if TYPE_CHECKING:
    from clusters.models import Cluster

log = logging.getLogger(__name__)


# The step task's registered name (capacity/defrag/tasks.py registers it under it), with
# the `capacity.tasks.` prefix by which queued messages and the beat name it.
DEFRAG_JOB_RUN_TASK = "capacity.tasks.defrag_job_run"
# Backoff after an API failure inside a step, seconds (the gateway already retried).
ERROR_RETRY_SECONDS = 5.0
# Bounds of what an operator may ask for (seconds): a poll below 0.1 s only loads the API
# server; a day is longer than any defrag is worth waiting for.
POLL_RANGE = (0.1, 3600.0)
TIMEOUT_RANGE = (1, 86400)


# ---- discovery -------------------------------------------------------------------------------

def defrag_discover(*, cluster: Cluster, node_name: str, gateway: kube.KubeGateway | None = None) -> DefragPlan:
    """Read the node, its pods, and for every model revision its PodAutoscaler and ReplicaSet.

    API calls: 2 + 2 per revision on the node (pods are one filtered LIST).
    """
    if not node_name or not isinstance(node_name, str):
        raise DefragError(f"a node name is required, got {node_name!r}")
    try:
        # Checked before any call: the pods are listed by a field selector on this name, where
        # the gateway's own check of names in paths does not reach ("n1,x" would select others).
        kube.name_check(node_name, what="node name")
    except Invalid as exc:
        raise DefragError(exc.message) from None
    gateway = _gateway(cluster, gateway)
    try:
        node = gateway.get(kube.NODES, node_name)
    except NotFound:
        raise DefragError(f"node {node_name!r} not found in cluster {cluster.name!r}") from None
    pods = [PodView.from_object(p) for p in
            gateway.list(kube.PODS, field_selector=f"spec.nodeName={node_name}")]
    scales: dict[tuple[str, str], RevisionScale] = {}
    for pod in pods:
        role, _ = pod_classify(pod)
        if role != Role.MODEL:
            continue
        key = (pod.namespace, pod.labels[REVISION_LABEL])
        if key in scales:
            continue
        try:
            pa = gateway.get(kube.PODAUTOSCALERS, key[1], namespace=key[0])
            rs = gateway.get(kube.REPLICASETS, pod.controller.name, namespace=pod.namespace)
        except NotFound:
            continue  # defrag_plan turns the pod into a blocker: nothing counts its orphan
        scales[key] = RevisionScale(kpa_scale=_scale((pa.get("status") or {}).get("actualScale")),
                                    replicas=_scale((rs.get("spec") or {}).get("replicas")))
    try:
        return defrag_plan(node=NodeView.from_object(node), pods=pods, scales=scales)
    except ValueError as exc:
        raise DefragError(exc.message) from None


# ---- start ----------------------------------------------------------------------------------

def defrag_job_start(*, cluster: Cluster, node_name: str, plan: DefragPlan, actor=None,
                     timeout_seconds: int | None = None, poll_interval_seconds: float | None = None,
                     now: datetime | None = None, enqueue: bool = True, on_behalf_of: str = "") -> DefragJob:
    """Create the confirmed job (the operator saw `plan`) and hand it to a worker.

    `on_behalf_of`: what started it when not an operator's own confirmation ("campaign #7"):
    kept with the report and named in the cause of every audit entry of the job."""
    now = now or clock.now()
    timeout_seconds = settings.CAPACITY_DEFRAG_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    poll = settings.CAPACITY_DEFRAG_POLL_SECONDS if poll_interval_seconds is None else poll_interval_seconds
    error = (interval_validate(timeout_seconds, field="timeout_seconds", minimum=TIMEOUT_RANGE[0],
                               maximum=TIMEOUT_RANGE[1], whole=True)
             or interval_validate(poll, field="poll_interval_seconds", minimum=POLL_RANGE[0],
                                  maximum=POLL_RANGE[1]))
    if error:
        raise DefragError(error)
    if plan.node != node_name:
        raise DefragError(f"the report is for node {plan.node!r}, not {node_name!r}")
    limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
    try:
        with transaction.atomic():
            # Lock the cluster row so two operators cannot both pass the limit check.
            cluster_lock(cluster=cluster)
            live = DefragJob.objects.filter(cluster=cluster, node_name=node_name, state__in=LIVE_STATES).first()
            if live is not None:
                raise DefragError(f"node {node_name!r} already has a live defrag job #{live.pk} ({live.state}); "
                                  f"{defrag_job_way_out(live)}")
            running = DefragJob.objects.filter(cluster=cluster, state__in=RUNNING_STATES).count()
            if running >= limit:
                raise DefragError(f"cluster {cluster.name!r} already runs {running} defrag job(s); "
                                  f"the limit is {limit} (CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
            job = DefragJob.objects.create(
                cluster=cluster, node_name=node_name,
                report={**plan.to_dict(), **({"on_behalf_of": on_behalf_of} if on_behalf_of else {})},
                timeout_seconds=int(timeout_seconds),
                poll_interval_seconds=float(poll), requested_by=actor, operator=actor, created_at=now)
            _log_write(job.pk, plan.report_lines() + ["Proceed with defrag? (y/n): y"])
            job.refresh_from_db(fields=["log_seq"])
            _audit(job, now=now, action="job_confirm", target=f"Node/{node_name}",
                   new={"pods": [p.key for p in plan.model_pods], "blockers": [p.key for p in plan.blockers]})
    except IntegrityError:
        raise DefragError(f"node {node_name!r} already has a live defrag job") from None
    if enqueue:
        _enqueue(job)
    return job


def _enqueue(job: DefragJob) -> None:
    """Hand the job to a worker once this transaction commits: by the task's name, since
    tasks import services and never the reverse (the task keeps its acks_late and
    reject_on_worker_lost; `task_send` queues it as `.delay()` does).

    The job row is the intent: if the broker cannot take the message, the job is still
    recorded and the resume beat hands it to a worker; the job's log says so, and the
    operator's page is not an error page for a job that will run."""
    def send() -> None:
        try:
            task_send(DEFRAG_JOB_RUN_TASK, args=(job.pk,))
        except Exception as exc:  # noqa: BLE001 - any broker failure; the row holds the intent
            log.warning("defrag job %s: could not queue its step (%s); the resume beat picks it up", job.pk, exc)
            _log_write(job.pk, [f"Could not hand the job to a worker now ({type(exc).__name__}: {exc}); "
                                f"the resume beat picks it up within {RESUME_PROMISE}."])

    transaction.on_commit(send)


# ---- one step --------------------------------------------------------------------------------

# What each step `defrag_step_decide` names is carried out by: forward steps in steps.py,
# the drain in drain.py, the abort and its later checks in abort.py.
_ACTIONS = {
    Step.TAKE_UP_ABORT: _take_up_abort,
    Step.TAKE_UP_DRAIN: _take_up_drain,
    Step.RECORD: _step_record,
    Step.CORDON: _step_cordon,
    Step.ORPHAN: _step_orphan,
    Step.CHECK: _step_wait,
    Step.DRAIN: _step_drain,
    Step.ABORT: _step_abort,
    Step.RECHECK: _step_recheck,
}


def defrag_job_step(*, job: DefragJob, gateway: kube.KubeGateway | None = None,
                    now: datetime | None = None) -> DefragJob:
    """Advance the job by one step from its recorded state; returns the job (saved).

    API failures are recorded on the job and retried on a later step; the time limit
    turns a job that never gets there into `failed`.
    """
    now = now or clock.now()
    gateway = _gateway(job, gateway)
    job.refresh_from_db()  # decide from what the database says now, never from a stale copy
    _loaded(job)
    try:
        # Decide from the record, then act; taking up a request is a step of its own, after
        # which the job's own step follows at once (an abort starts undoing right away).
        step = _decide(job, now)
        if step in (Step.TAKE_UP_ABORT, Step.TAKE_UP_DRAIN):
            _ACTIONS[step](job, gateway, now)
            step = _decide(job, now)
        if step in _ACTIONS:
            _ACTIONS[step](job, gateway, now)
    except StaleJob as exc:
        log.info("%s: re-reading", exc)
    except KubeError as exc:
        pending = job.__dict__.get("_pending_log") or []
        job.refresh_from_db()
        _loaded(job)
        try:
            if job.state in _TIMED_STATES and not job.abort_pending and _timed_out(job, now):
                _append_log(job, *pending)
                _fail(job, gateway, now, last_error=exc)
            else:
                _append_log(job, *pending, f"API error, retrying in {ERROR_RETRY_SECONDS:g}s: {exc}")
                job.error = f"{exc} (retrying in {ERROR_RETRY_SECONDS:g}s)"
                job.next_check_at = now + timedelta(seconds=ERROR_RETRY_SECONDS)
                _commit(job, now=now)
        except StaleJob:
            pass
    # What the database says now (an operator's request may have landed during the step).
    job.refresh_from_db()
    return _loaded(job)


# States whose waiting the job's time limit ends (drain and abort have their own limits).
_TIMED_STATES = (JobState.CONFIRMED, JobState.RECORDED, JobState.CORDONED, JobState.WAITING)


def _decide(job: DefragJob, now: datetime) -> str:
    return defrag_step_decide(state=job.state, now=now, next_check_at=job.next_check_at,
                              abort_pending=job.abort_pending, drain_requested=job.drain_requested_at is not None)


def defrag_job_resting(*, job: DefragJob, now: datetime) -> bool:
    """Nothing for a runner (the step task, the CLI) to do until an operator asks: their
    request re-queues the job."""
    return _decide(job, now) == Step.REST


def defrag_job_pause_seconds(*, job: DefragJob, now: datetime) -> float:
    """Seconds until the job's next check is due (0: due now)."""
    if not job.next_check_at:
        return 0.0
    return max(0.0, (job.next_check_at - now).total_seconds())


def defrag_job_wait(*, job: DefragJob, gateway: kube.KubeGateway | None = None, timeout_seconds: float) -> bool:
    """Block until one of the job's PodAutoscalers changes, or `timeout_seconds` pass.

    A watch instead of a sleep: the job re-checks as soon as a scale moves, and the cost is
    one LIST (limit 1, for a resourceVersion) and one watch, however many pods there are.
    A change between the last check and the LIST is caught by the timeout (one interval).
    Returns True when a change woke it.
    """
    gateway = _gateway(job, gateway)
    wanted = {(r.namespace, r.revision) for r in job.revisions.all()}
    if not wanted:
        return False
    namespaces = {ns for ns, _ in wanted}
    namespace = next(iter(namespaces)) if len(namespaces) == 1 else None
    page = gateway.list_page(kube.PODAUTOSCALERS, namespace=namespace, limit=1)
    version = (page.get("metadata") or {}).get("resourceVersion") or "0"
    for event in gateway.watch(kube.PODAUTOSCALERS, namespace=namespace, resource_version=version,
                               timeout_seconds=max(1, round(timeout_seconds))):
        meta = event.object.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) in wanted:
            return True
    return False


# ---- drain and abort requests (taken up by the next step) ------------------------------------

def defrag_command(job: DefragJob, *flags: str) -> str:
    """The `manage.py defrag` command line that acts on `job`'s node (`--cluster` named
    unless it is the default cluster)."""
    cluster = "" if job.cluster.name == settings.DEFAULT_CLUSTER_NAME else f" --cluster {job.cluster.name}"
    return " ".join([f"manage.py defrag {job.node_name}{cluster}", *flags])


def defrag_job_way_out(job: DefragJob) -> str:
    """How a live job ends, freeing its node for a new defrag: the way that works in its state."""
    abort = defrag_command(job, "--abort")
    if job.state == JobState.ABORTING or job.abort_pending:
        return "its abort is under way: wait until the job reads aborted"
    if job.state == JobState.DRAINING or (job.state == JobState.SAFE and job.drain_requested_at):
        return f"its drain is under way: wait until the job reads drained (or stop the drain: {abort})"
    if job.state == JobState.SAFE:
        return f"drain the node ({defrag_command(job, '--drain')}) or abort the job ({abort})"
    if job.state == JobState.ABORT_STUCK:
        return (f"its abort waits for room for its orphans' replacements and ends once they are ready; to end it "
                f"now, delete the orphans anyway: {defrag_command(job, '--abort', '--delete-orphans')} "
                f"(capacity drops)")
    return f"abort it: {abort}"


def drain_refusal(job: DefragJob, *, delete_node: bool | None = None) -> str | None:
    """Why a drain of `job` would be refused now, with what works instead, or None.
    `delete_node` None: whichever the operator picks (the drain page, before it is picked)."""
    if job.state == JobState.DRAINING or (job.drain_requested_at and job.state == JobState.SAFE):
        if delete_node is not None and job.delete_node != delete_node:
            return (f"job #{job.pk} already has a drain requested {'that deletes' if job.delete_node else 'that keeps'}"
                    f" the Node: it is not changed (abort the job to stop the drain)")
        return None
    said = f"job #{job.pk} is {job.state}"
    abort = defrag_command(job, "--abort")
    if job.state == JobState.DRAINED:
        return f"{said}: its node was drained already"
    if job.state == JobState.ABORTED:
        return f"{said}: an aborted job is not drained (a new defrag of the node starts with {defrag_command(job)})"
    if job.state == JobState.ABORTING or (job.abort_pending and job.state != JobState.ABORT_STUCK):
        return f"{said} and its abort is under way: an aborted job is not drained; wait until it reads aborted"
    if job.state == JobState.ABORT_STUCK:
        return (f"{said}: an aborted job is not drained; to end its orphans now, delete them anyway: "
                f"{defrag_command(job, '--abort', '--delete-orphans')} (capacity drops)")
    if job.state == JobState.BLOCKED:
        return f"{said}: pods other than models still block the node, so it cannot be drained; abort it: {abort}"
    if job.state == JobState.FAILED:
        return f"{said}: it failed before reporting the node safe, so it cannot be drained; abort it: {abort}"
    if job.state != JobState.SAFE:
        return (f"{said}: it has not reported the node safe yet; wait until it reads safe, then drain "
                f"({defrag_command(job, '--drain')})")
    return None


def defrag_job_drain(*, job: DefragJob, actor, delete_node: bool = False, now: datetime | None = None,
                     enqueue: bool = True) -> DefragJob:
    """Ask for the drain of a safe node: its orphans are evicted (PDBs honoured), and
    the Node deleted if asked. Needs the `capacity.drain_defragjob` permission.

    Recorded as a request the next step takes up (it never writes the state itself)."""
    now = now or clock.now()
    if actor is not None and not actor.has_perm("capacity.drain_defragjob"):
        raise DefragError(f"user {actor} may not drain nodes (needs capacity.drain_defragjob)")
    with transaction.atomic():
        row = DefragJob.objects.select_for_update().get(pk=job.pk)
        refusal = drain_refusal(row, delete_node=delete_node)
        if refusal:
            raise DefragError(refusal)
        if row.state == JobState.DRAINING or (row.drain_requested_at and row.state == JobState.SAFE):
            return row   # the same drain asked again: already on its way
        DefragJob.objects.filter(pk=row.pk).update(drain_requested_at=now, drain_requested_by=actor,
                                                   delete_node=delete_node)
        _log_write(row.pk, [f"Drain requested by {actor or 'CLI'}"
                            + (" (the Node will be deleted)" if delete_node else "")])
        _audit(row, now=now, action="drain_request", target=f"Node/{row.node_name}", actor=actor,
               new={"delete_node": delete_node})
    if enqueue:
        _enqueue(row)
    row.refresh_from_db()
    return row


def defrag_job_abort(*, job: DefragJob, actor, orphans: str = AbortChoice.WAIT, now: datetime | None = None,
                     poll_interval_seconds: float | None = None, enqueue: bool = True) -> DefragJob:
    """Ask for an abort: uncordon the node if the job cordoned it, then delete each orphan
    once its revision is back to its wanted scale without it.

    `orphans` is the operator's choice for orphans whose replacements cannot become ready
    (no room): wait until CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS and then stop as
    `abort-stuck` saying what blocks, keep them now, or delete them anyway (capacity drops).
    Recorded as a request the next step takes up, whatever a worker is doing meanwhile."""
    now = now or clock.now()
    if orphans not in AbortChoice.values:
        raise DefragError(f"orphans must be one of {AbortChoice.values}, got {orphans!r}")
    if poll_interval_seconds is not None:
        error = interval_validate(poll_interval_seconds, field="poll_interval_seconds", minimum=POLL_RANGE[0],
                                  maximum=POLL_RANGE[1])
        if error:
            raise DefragError(error)
    with transaction.atomic():
        row = DefragJob.objects.select_for_update().get(pk=job.pk)
        if row.state == JobState.DRAINED:
            raise DefragError(f"job #{row.pk} is drained: there is nothing left to abort")
        if row.state == JobState.ABORTED:
            return row
        asked_before = row.abort_requested_at is not None
        if asked_before and row.state != JobState.ABORT_STUCK and orphans == row.abort_choice:
            return row  # the same request again: already on its way
        requested = now if not row.abort_started_at else max(now, row.abort_started_at + timedelta(microseconds=1))
        changes = dict(abort_requested_at=requested, abort_requested_by=actor, abort_choice=orphans)
        if poll_interval_seconds is not None:
            changes["poll_interval_seconds"] = float(poll_interval_seconds)
        DefragJob.objects.filter(pk=row.pk).update(**changes)
        choice = {AbortChoice.KEEP: " (keep orphans that cannot end)",
                  AbortChoice.DELETE: " (delete the orphans even if capacity drops)"}.get(orphans, "")
        _log_write(row.pk, [f"Abort requested by {actor or 'CLI'}{choice}"])
        _audit(row, now=now, action="abort_request", target=f"Node/{row.node_name}", actor=actor,
               old={"state": row.state}, new={"orphans": orphans or "wait"})
    if enqueue:
        _enqueue(row)
    row.refresh_from_db()
    return row
