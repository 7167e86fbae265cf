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
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from typing import TYPE_CHECKING, NamedTuple

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from audit.selectors import entries_of_subject
from audit.services import audit
from clusters import kube
from clusters.errors import AlreadyExists, Conflict, Invalid, KubeError, NotFound, TooManyRequests
from clusters.labels import REVISION_LABEL, TEMPLATE_HASH_LABEL
from clusters.selectors import snapshot_take
from clusters.services import cluster_lock
from clusters.snapshot import NodeView, PodView
from config import clock
from config.schedule import SCHEDULES
from config.actors import acting_as, actor_label_current
from config.celery import task_send

from capacity.defrag.models import (
    LIVE_STATES,
    RUNNING_STATES,
    AbortChoice,
    DefragJob,
    DefragLogLine,
    DefragOrphan,
    DefragRevision,
    JobState,
    OrphanEnd,
    OrphanState,
)
from capacity.defrag.planning import (
    DefragPlan,
    EndSettle,
    Step,
    abort_recheck_counts_line,
    abort_recheck_line,
    abort_stuck_message,
    abort_terminating_message,
    asleep_line,
    defrag_step_decide,
    interval_validate,
    log_lines_to_drop,
    RevisionScale,
    Role,
    blockers_remaining,
    defrag_plan,
    orphan_end_settle,
    orphan_patch,
    pod_classify,
    progress_line,
    replicaset_ready_pods,
    revision_asleep,
    revision_satisfied,
    seconds_text,
)

if TYPE_CHECKING:
    from clusters.models import Cluster

log = logging.getLogger(__name__)

# The step task's registered name (capacity/defrag/tasks.py registers it under it). It
# keeps its historical `capacity.tasks.` prefix: queued messages and the beat name it so.
DEFRAG_JOB_RUN_TASK = "capacity.tasks.defrag_job_run"

SAFE_MESSAGE = "Safe to defrag/remove node"
# kubectl drain waits this long before retrying an eviction a PodDisruptionBudget refused.
EVICTION_RETRY_SECONDS = 5.0
# Backoff after an API failure inside a step, seconds (the gateway already retried).
ERROR_RETRY_SECONDS = 5.0
# A worker owns a job through a lease this long (seconds). The step task renews it every
# HEARTBEAT_SECONDS (capacity/defrag/tasks.py), so a live worker never loses it, and a
# killed worker's job is free again within 30 s, and with the 10 s resume beat
# (config/schedule.py) it is stepped again within 40 s, well inside a minute.
LEASE_SECONDS = 30.0
# How soon the resume beat hands a due job no worker holds to a worker (config/schedule.py).
RESUME_SECONDS = next(p.every_seconds for p in SCHEDULES if p.task == "capacity.tasks.defrag_jobs_resume")
RESUME_PROMISE = f"{RESUME_SECONDS} s"
# Bounds of what an operator may ask for (seconds): a poll below 0.1 s only loads the API
# server; a day is longer than any defrag is worth waiting for.
POLL_RANGE = (0.1, 3600.0)
TIMEOUT_RANGE = (1, 86400)


class DefragError(Exception):
    """A defrag request that cannot be carried out as asked; the message says why."""


class ReturnUnconfirmed(DefragError):
    """A return to service's uncordon was sent and its answer lost: it may have taken effect.
    Its intent stays on the job, and whoever next finds it records what happened."""


class StaleJob(Exception):
    """The job changed in the database since this step loaded it (another step, or a lost
    race): nothing of this step was recorded; re-read and decide again."""


# ---- small helpers -----------------------------------------------------------------------

def _gateway(job_or_cluster, gateway: kube.KubeGateway | None) -> kube.KubeGateway:
    if gateway is not None:
        return gateway
    cluster = job_or_cluster.cluster if isinstance(job_or_cluster, DefragJob) else job_or_cluster
    return kube.gateway_for(cluster)


def _scale(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _desired_scale(pa: dict) -> int | None:
    """The PodAutoscaler's `status.desiredScale`, None while it reports none."""
    value = (pa.get("status") or {}).get("desiredScale")
    return None if value is None else _scale(value)


def _revision_asleep(gateway: kube.KubeGateway, revision: DefragRevision, *, replicas: int) -> bool:
    """Whether the revision, its ReplicaSet at `replicas`, is scaled to zero now (read from its
    PodAutoscaler; a gone one says nothing)."""
    if replicas:
        return False
    try:
        pa = gateway.get(kube.PODAUTOSCALERS, revision.revision, namespace=revision.namespace)
    except NotFound:
        return False
    return revision_asleep(desired_scale=_desired_scale(pa), current_replicas=replicas)


def _orphan_names(revision: DefragRevision) -> list[str]:
    """ns/name of the revision's orphans the job still tracks."""
    return [f"{o.namespace}/{o.pod_name}" for o in revision.orphans.filter(
        state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).order_by("pod_name")]


def _append_log(job: DefragJob, *lines: str) -> None:
    """Queue progress lines; `_commit` writes them with the step's record."""
    job.__dict__.setdefault("_pending_log", []).extend(lines)


def _log_drop(job: DefragJob) -> None:
    """Forget the progress lines queued since the step began (they say nothing new)."""
    job.__dict__["_pending_log"] = []


def _log_write(job_id: int, lines: list[str]) -> None:
    """Append numbered lines and drop the middle beyond the kept head and tail. Call inside
    a transaction: the row lock on the job serialises writers, so numbers never repeat."""
    if not lines:
        return
    seq = DefragJob.objects.select_for_update().filter(pk=job_id).values_list("log_seq", flat=True).get()
    DefragLogLine.objects.bulk_create(
        [DefragLogLine(job_id=job_id, seq=seq + i, text=line) for i, line in enumerate(lines, start=1)])
    seq += len(lines)
    DefragJob.objects.filter(pk=job_id).update(log_seq=seq)
    dropped = log_lines_to_drop(log_seq=seq)
    if dropped:
        DefragLogLine.objects.filter(job_id=job_id, seq__gte=dropped[0], seq__lte=dropped[1]).delete()


def defrag_job_log_after(*, job: DefragJob, seq: int) -> list[tuple[int, str]]:
    """(seq, line) of the kept lines after `seq`, oldest first: how a follower (the CLI)
    reads on from where it stopped, and sees from a jump in the numbers what it missed."""
    return list(DefragLogLine.objects.filter(job=job, seq__gt=seq).order_by("seq").values_list("seq", "text"))


def _audit(job: DefragJob, *, now: datetime, action: str, target: str, old=None, new=None, actor=None,
           cause: str = "") -> None:
    """One step of the job in the audit trail, under the job (subject defrag_job)."""
    actor = actor or job.operator
    # A worker acts for whoever asked: with no panel user, the command that confirmed the job.
    label = None if actor is not None else (actor_label_current() or job.requested_by_label)
    audit(app="defrag", action=action, at=now, actor=actor, cause=cause or f"defrag job #{job.pk} ({job.state})",
          target=target, cluster_id=job.cluster_id, subject=("defrag_job", job.pk), old=old, new=new,
          actor_label=label)


def _loaded(job: DefragJob) -> DefragJob:
    """Remember what the step decides from (the compare of compare-and-set): the state, the
    version and the operator's abort request as the step saw it."""
    job.__dict__["_cas"] = (job.state, job.version, job.abort_requested_at)
    job.__dict__["_pending_log"] = []
    return job


def _commit(job: DefragJob, *, fields: Iterable[str] = (), orphans: Iterable[DefragOrphan] = (),
            audits: Iterable[dict] = (), now: datetime) -> None:
    """Record, in one transaction, what a step did. IMPORTANT: called only after the side
    effect succeeded: a crash before it makes the next worker redo the (re-checked) step.

    One conditional UPDATE: it applies only if the row still has the state and version
    this step loaded; otherwise nothing is written (audits and orphan records included)
    and `StaleJob` is raised, so two runners never record one side effect twice. An abort
    asked for after the step loaded the job also fails the compare: the step decides again,
    with the abort in view, so nothing (a job_safe, a drain) is recorded over it."""
    state, version, abort_asked = job.__dict__.get("_cas") or (job.state, job.version, job.abort_requested_at)
    names = set(fields) | {"error", "next_check_at"}
    values = {name: getattr(job, name) for name in names}
    with transaction.atomic():
        updated = DefragJob.objects.filter(pk=job.pk, state=state, version=version,
                                           abort_requested_at=abort_asked).update(
            version=version + 1, updated_at=timezone.now(), **values)
        if not updated:
            raise StaleJob(f"defrag job {job.pk} changed since it was loaded ({state}, v{version})")
        for orphan in orphans:
            orphan.save()
        for entry in audits:
            _audit(job, **{"now": now, **entry})   # an entry may carry its own time (when it was done)
        _log_write(job.pk, job.__dict__.get("_pending_log") or [])
    job.version = version + 1
    _loaded(job)


def _event(gateway: kube.KubeGateway, job: DefragJob, involved: dict, *, reason: str, message: str,
           now: datetime, event_type: str = "Normal") -> None:
    """A Kubernetes Event about the node or a pod. Its name is derived from the job and the
    action, so a step redone after a crash does not post it twice (409 AlreadyExists)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha256(f"{job.pk}/{reason}/{meta.get('uid')}/{message}".encode()).hexdigest()[:16]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.defrag-{digest}", "namespace": namespace},
        "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                           "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "reason": reason, "message": message, "type": event_type,
        "source": {"component": "gpu-capacity-defrag"}, "reportingComponent": "gpu-capacity-defrag",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
    try:
        gateway.create(kube.EVENTS, event, namespace=namespace)
    except AlreadyExists:
        pass
    except KubeError as exc:  # an Event is a courtesy: its failure must not stop the job
        log.warning("defrag job %s: could not record event %s: %s", job.pk, reason, exc)


def _node_ref(job: DefragJob, node: dict | None = None) -> dict:
    meta = (node or {}).get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": job.node_name, "uid": meta.get("uid")}}


def _pod_ref(orphan: DefragOrphan) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": orphan.pod_name, "namespace": orphan.namespace, "uid": orphan.uid}}


def _pod_named(gateway: kube.KubeGateway, orphan: DefragOrphan) -> dict | None:
    """The pod now under the orphan's name (perhaps a new one), or None when there is none."""
    try:
        return gateway.get(kube.PODS, orphan.pod_name, namespace=orphan.namespace)
    except NotFound:
        return None


def _get_pod(gateway: kube.KubeGateway, orphan: DefragOrphan) -> dict | None:
    """The orphan's pod, or None when it is gone (a new pod with the same name is not it)."""
    pod = _pod_named(gateway, orphan)
    return pod if pod is not None and (pod.get("metadata") or {}).get("uid") == orphan.uid else None


def _is_orphaned(pod: dict) -> bool:
    meta = pod.get("metadata") or {}
    return not meta.get("ownerReferences") and TEMPLATE_HASH_LABEL not in (meta.get("labels") or {})


# ---- step 1: discovery ---------------------------------------------------------------------

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
                     now: datetime | None = None, enqueue: bool = True) -> DefragJob:
    """Create the confirmed job (the operator saw `plan`) and hand it to a worker."""
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
                                  f"abort or drain it first")
            running = DefragJob.objects.filter(cluster=cluster, state__in=RUNNING_STATES).count()
            if running >= limit:
                raise DefragError(f"cluster {cluster.name!r} already runs {running} defrag job(s); "
                                  f"the limit is {limit} (CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
            job = DefragJob.objects.create(
                cluster=cluster, node_name=node_name, report=plan.to_dict(), timeout_seconds=int(timeout_seconds),
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


def _take_up_abort(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """An abort wins over whatever the job was doing: from here on the job undoes."""
    old = job.state
    deadline = settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS
    job.state, job.operator_id, job.next_check_at, job.error = (
        JobState.ABORTING, job.abort_requested_by_id, None, "")
    job.abort_started_at = max(now, job.abort_requested_at)
    job.abort_deadline_at = job.abort_started_at + timedelta(seconds=deadline)
    choice = {AbortChoice.KEEP: "; orphans that cannot end are kept (operator's choice)",
              AbortChoice.DELETE: "; orphans are deleted even if their revision is not back to scale "
                                  "(operator's choice)"}.get(job.abort_choice, "")
    _append_log(job, f"Abort taken up (the job was {old}){choice}; replacements have {deadline}s to become "
                     f"ready")
    _commit(job, fields=["state", "operator", "abort_started_at", "abort_deadline_at"], now=now)


def _take_up_drain(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """A drain applies to a safe job only (`defrag_step_decide`); an abort requested since wins."""
    job.state, job.operator_id, job.next_check_at = JobState.DRAINING, job.drain_requested_by_id, None
    _append_log(job, "Drain taken up" + (" (the Node will be deleted)" if job.delete_node else ""))
    _commit(job, fields=["state", "operator"], now=now)


def _timed_out(job: DefragJob, now: datetime) -> bool:
    """The time limit counts from the first side effect, or from confirmation for a job
    that never made one (its reads kept failing)."""
    began = job.started_at or job.created_at
    return began is not None and now >= began + timedelta(seconds=job.timeout_seconds)


def _step_record(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 2: record per revision the initial KPA scale, RS replicas and m, read afresh."""
    report = job.report
    with transaction.atomic():
        for entry in report.get("revisions", []):
            try:
                pa = gateway.get(kube.PODAUTOSCALERS, entry["revision"], namespace=entry["namespace"])
                rs = gateway.get(kube.REPLICASETS, entry["replicaset"], namespace=entry["namespace"])
            except NotFound as exc:
                # The model was deleted after the report: its pods go with it, none to move.
                _append_log(job, f"Revision {entry['namespace']}/{entry['revision']} gone before the job started "
                                 f"({exc}): its pods are not moved")
                continue
            revision, _ = DefragRevision.objects.update_or_create(
                job=job, namespace=entry["namespace"], revision=entry["revision"],
                defaults=dict(replicaset=entry["replicaset"],
                              initial_kpa_scale=_scale((pa.get("status") or {}).get("actualScale")),
                              initial_replicas=_scale((rs.get("spec") or {}).get("replicas")),
                              overprovision=len(entry["pods"])))
            for pod in report["pods"]:
                if pod["role"] == Role.MODEL and pod["revision"] == entry["revision"] \
                        and pod["namespace"] == entry["namespace"]:
                    DefragOrphan.objects.get_or_create(job=job, uid=pod["uid"], defaults=dict(
                        revision=revision, namespace=pod["namespace"], pod_name=pod["name"], gpus=pod["gpus"]))
        job.state = JobState.RECORDED
        job.started_at = job.started_at or now
        _commit(job, fields=["state", "started_at"], now=now, audits=[dict(
            action="scales_record", target=f"Node/{job.node_name}",
            new={r.revision: {"initial_kpa_scale": r.initial_kpa_scale, "initial_replicas": r.initial_replicas,
                              "m": r.overprovision} for r in job.revisions.all()})])


def _step_cordon(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 3, as `kubectl cordon` does it."""
    if _timed_out(job, now):
        return _fail(job, gateway, now)
    try:
        node = gateway.get(kube.NODES, job.node_name)
    except NotFound:
        return _fail(job, gateway, now, gone=True)
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    if not cordoned:
        if job.cordon_intent_at is None:
            # IMPORTANT: the intent is recorded before the patch, so a worker dying right after
            # it leaves a record that the cordon is the job's (abort must undo it).
            job.cordon_intent_at = now
            _commit(job, fields=["cordon_intent_at"], now=now)
        node = gateway.patch(kube.NODES, job.node_name, {"spec": {"unschedulable": True}}, patch_type="strategic")
        job.cordoned_by_job = True
    elif job.cordon_intent_at is not None and not job.report.get("unschedulable"):
        job.cordoned_by_job = True  # our patch went out before a worker died: it is the job's cordon
    if job.cordoned_by_job:
        message = f"Node {job.node_name} has been cordoned (marked unschedulable)."
        audit = dict(action="node_cordon", target=f"Node/{job.node_name}", old={"unschedulable": False},
                     new={"unschedulable": True})
    else:
        message = (f"Node {job.node_name} was already cordoned before this job; left cordoned "
                   f"(an abort will not uncordon it).")
        audit = dict(action="node_already_cordoned", target=f"Node/{job.node_name}", old={"unschedulable": True},
                     new={"unschedulable": True})
    _event(gateway, job, _node_ref(job, node), reason="DefragCordon", message=message, now=now)
    job.state = JobState.CORDONED
    job.error = ""
    _append_log(job, message)
    _commit(job, fields=["state", "cordoned_by_job"], now=now, audits=[audit])


def _step_orphan(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 4: orphan each planned pod with one race-guarded JSON patch, recording each."""
    if _timed_out(job, now):
        return _fail(job, gateway, now)
    for orphan in job.orphans.filter(state=OrphanState.PLANNED).select_related("revision"):
        pod = _get_pod(gateway, orphan)
        if pod is None:
            orphan.state, orphan.gone_at = OrphanState.SKIPPED, now
            _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} gone before orphaning: skipped")
            _commit(job, orphans=[orphan], now=now, audits=[dict(
                action="pod_skip", target=f"Pod/{orphan.namespace}/{orphan.pod_name}", new={"reason": "gone"})])
            continue
        meta = pod.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        labels = meta.get("labels") or {}
        if not _is_orphaned(pod):
            controller = next((o for o in owners if o.get("controller")), None)
            if controller is None or controller.get("kind") != "ReplicaSet" \
                    or controller.get("name") != orphan.revision.replicaset:
                orphan.state = OrphanState.SKIPPED
                _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} changed owner: not orphaned")
                _commit(job, orphans=[orphan], now=now, audits=[dict(
                    action="pod_skip", target=f"Pod/{orphan.namespace}/{orphan.pod_name}",
                    new={"reason": "owner changed", "owners": owners})])
                continue
            try:
                gateway.patch(kube.PODS, orphan.pod_name, orphan_patch(
                    uid=orphan.uid, owner_references=owners, has_template_hash=TEMPLATE_HASH_LABEL in labels),
                    namespace=orphan.namespace, patch_type="json")
            except (Conflict, Invalid) as exc:
                # A `test` failed: the pod changed between our read and the patch. Re-read next step.
                job.error = f"pod {orphan.namespace}/{orphan.pod_name} changed while orphaning ({exc}); retrying"
                job.next_check_at = now
                _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} changed while orphaning: retrying")
                _commit(job, now=now)
                return
            orphan.owner_references = owners
            orphan.template_hash = labels.get(TEMPLATE_HASH_LABEL, "")
        # Else the patch was applied before a crash: record it now, do not patch again.
        orphan.state, orphan.orphaned_at = OrphanState.ORPHANED, now
        _event(gateway, job, _pod_ref(orphan), reason="DefragOrphan", now=now,
               message=f"Orphaned by defrag job #{job.pk} of node {job.node_name}: ReplicaSet "
                       f"{orphan.revision.replicaset} no longer counts it and creates a replacement; it keeps "
                       f"serving until the job ends it")
        _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} orphaned")
        _commit(job, orphans=[orphan], now=now, audits=[dict(
            action="pod_orphan", target=f"Pod/{orphan.namespace}/{orphan.pod_name}",
            old={"ownerReferences": orphan.owner_references, TEMPLATE_HASH_LABEL: orphan.template_hash},
            new={"ownerReferences": [], TEMPLATE_HASH_LABEL: None})])
    job.state = JobState.WAITING
    job.error = ""
    _commit(job, fields=["state"], now=now)


def _step_wait(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 5: one check of every revision: 2 API calls per revision, however many pods."""
    lines = ["---"]
    revisions = list(job.revisions.all())
    all_ok = True
    for revision in revisions:
        # m counts the pods actually orphaned: one gone before its patch serves nothing to wait for.
        m = revision.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).count()
        try:
            pa = gateway.get(kube.PODAUTOSCALERS, revision.revision, namespace=revision.namespace)
            rs = gateway.get(kube.REPLICASETS, revision.replicaset, namespace=revision.namespace)
        except NotFound:
            revision.satisfied = True  # the model was deleted: nothing left to keep serving
            lines.append(f"Revision {revision.revision} - gone: nothing to wait for")
            revision.save(update_fields=["satisfied"])
            continue
        revision.current_kpa_scale = _scale((pa.get("status") or {}).get("actualScale"))
        revision.current_replicas = _scale((rs.get("spec") or {}).get("replicas"))
        if revision_asleep(desired_scale=_desired_scale(pa), current_replicas=revision.current_replicas):
            # Scaled to zero by whoever may (its owner, an org's dormancy, the pruner): its orphans
            # are capacity it no longer needs, whether they count in actualScale or not (one
            # still loading does not), so there is nothing to wait for.
            revision.satisfied = True
            lines.append(asleep_line(revision=revision.revision, during_wait=revision.initial_replicas > 0,
                                     orphans=_orphan_names(revision)))
        else:
            revision.satisfied = revision_satisfied(current_kpa_scale=revision.current_kpa_scale,
                                                    current_replicas=revision.current_replicas,
                                                    initial_replicas=revision.initial_replicas, overprovision=m)
            lines.append(progress_line(revision=revision.revision, overprovision=m,
                                       current_kpa_scale=revision.current_kpa_scale,
                                       current_replicas=revision.current_replicas,
                                       initial_kpa_scale=revision.initial_kpa_scale))
        all_ok &= revision.satisfied
        revision.save(update_fields=["current_kpa_scale", "current_replicas", "satisfied"])
    _append_log(job, *lines)
    job.error = ""
    if all_ok:
        return _finish_safe(job, gateway, now)
    if _timed_out(job, now):
        return _fail(job, gateway, now)
    job.next_check_at = now + timedelta(seconds=job.poll_interval_seconds)
    _commit(job, now=now)


def _finish_safe(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Every revision is over-provisioned enough. Safe, unless other pods still block the node."""
    pods = [PodView.from_object(p) for p in gateway.list(kube.PODS, field_selector=f"spec.nodeName={job.node_name}")]
    own = set(job.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).values_list("uid", flat=True))
    blockers = blockers_remaining(pods, node=job.node_name, own_orphans=own)
    job.safe_at = now
    job.next_check_at = None
    if blockers:
        job.state = JobState.BLOCKED
        message = f"Model pods are covered, but the node is not safe: blockers remain: {', '.join(blockers)}"
    else:
        job.state = JobState.SAFE
        message = SAFE_MESSAGE
    _append_log(job, message)
    _commit(job, fields=["state", "safe_at"], now=now,
            audits=[dict(action="job_safe" if not blockers else "job_blocked", target=f"Node/{job.node_name}",
                         new={"blockers": blockers})])
    # After the record: an abort that won the race must not leave a "safe" Event behind.
    _event(gateway, job, _node_ref(job), reason="DefragSafe" if not blockers else "DefragBlocked",
           message=message, now=now, event_type="Normal" if not blockers else "Warning")


def _fail(job: DefragJob, gateway: kube.KubeGateway, now: datetime, *, gone: bool = False,
          last_error: KubeError | None = None) -> None:
    """Stop the job where it is, saying what is left as it was. `gone`: the node was deleted
    before the job cordoned it; `last_error`: the time ran out while the API kept failing."""
    waiting = [f"{r.namespace}/{r.revision} (scale {r.current_kpa_scale}, needs "
               f"{min(r.initial_replicas, r.current_replicas or r.initial_replicas) + r.overprovision})"
               for r in job.revisions.filter(satisfied=False)]
    orphans = job.orphans.filter(state=OrphanState.ORPHANED).count()
    cordoned = job.state not in (JobState.CONFIRMED, JobState.RECORDED) or bool(job.report.get("unschedulable"))
    left = [f"the node stays {'cordoned' if cordoned else 'schedulable (never cordoned)'}"]
    if orphans:
        left.append(f"its {orphans} orphan(s) keep serving")
    if gone:
        message = (f"Failed: node {job.node_name} is gone from the cluster (deleted outside this job) before the "
                   f"job cordoned it; no pod was orphaned.")
    elif last_error is not None:
        message = (f"Timed out after {job.timeout_seconds}s: the Kubernetes API kept failing ({last_error}). "
                   f"{' and '.join(left).capitalize()} until an operator aborts.")
    else:
        message = (f"Timed out after {job.timeout_seconds}s: not safe. Still waiting for: "
                   f"{', '.join(waiting) or 'orphaning to finish'}. {' and '.join(left).capitalize()} "
                   f"until an operator aborts.")
    job.state = JobState.FAILED
    job.error = message
    job.next_check_at = None
    _append_log(job, message)
    _commit(job, fields=["state"], now=now, audits=[dict(action="job_fail", target=f"Node/{job.node_name}",
                                                         new={"waiting": waiting, "reason": message})])
    if not gone:
        _event(gateway, job, _node_ref(job), reason="DefragTimeout", message=message, now=now, event_type="Warning")


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


# ---- drain and abort -------------------------------------------------------------------------

def drain_refusal(job: DefragJob, *, delete_node: bool | None = None) -> str | None:
    """Why a drain of `job` would be refused now, or None. `delete_node` None: whichever the
    operator picks (the drain page, before it is picked)."""
    if job.state == JobState.DRAINING or (job.drain_requested_at and job.state == JobState.SAFE):
        if delete_node is not None and job.delete_node != delete_node:
            return (f"job #{job.pk} already has a drain requested {'that deletes' if job.delete_node else 'that keeps'}"
                    f" the Node: it is not changed (abort the job to stop the drain)")
        return None
    if job.state != JobState.SAFE:
        return f"job #{job.pk} is {job.state}: only a job that reported the node safe may drain it"
    if job.abort_pending:
        return f"job #{job.pk} has an abort request pending: it will not be drained"
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


def _settle_planned(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Planned pods at drain/abort time: one found orphaned was patched before a crash, so it
    is ours to end; the others were never touched."""
    for orphan in job.orphans.filter(state=OrphanState.PLANNED):
        pod = _get_pod(gateway, orphan)
        orphan.state = OrphanState.ORPHANED if pod is not None and _is_orphaned(pod) else OrphanState.SKIPPED
        _commit(job, orphans=[orphan], now=now)


NODE_UNCORDONING = "uncordoning"  # written before the patch: a restarted worker knows the patch is its own
NODE_OUTCOMES = {
    "uncordoned": "uncordoned",
    "already schedulable": "was already schedulable (uncordoned outside this job)",
    "left cordoned": "left cordoned (it was cordoned before the job, not by it)",
    "gone": "is gone (deleted by someone else)",
    "deleted by the drain": "was deleted by this job's drain (asked for before the abort)",
    "never cordoned": "was never cordoned by this job; left as it was",
    "returned to service": "was returned to service by an operator (uncordoned before this abort)",
}
# The outcome an operator's return to service records on the job it asks to abort: the
# abort then knows the node's uncordon was that operator's, not someone else's.
NODE_RETURNED = "returned to service"


def _abort_node(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Undo the job's cordon, and only the job's: say what was really done."""
    owns = job.cordoned_by_job or (job.cordon_intent_at is not None and not job.report.get("unschedulable"))
    try:
        node = gateway.get(kube.NODES, job.node_name)
    except NotFound:
        node = None
    cordoned = bool(((node or {}).get("spec") or {}).get("unschedulable"))
    audits = []
    if node is None and job.node_delete_intent_at is not None:
        outcome = "deleted by the drain"
        audits.append(dict(action="node_delete", target=f"Node/{job.node_name}",
                           new={"already_gone": True, "by_this_job": True}))
    elif node is None:
        outcome = "gone"
    elif not cordoned and job.return_intent_at is not None and job.abort_node_outcome != NODE_UNCORDONING:
        # A return to service uncordoned it and its process stopped before recording it:
        # the node is the operator's doing (its audit entry is written by whoever settles it).
        outcome = NODE_RETURNED
    elif not owns:
        if cordoned:
            outcome = "left cordoned"
        else:
            outcome = "already schedulable" if job.report.get("unschedulable") else "never cordoned"
    elif cordoned:
        if job.abort_node_outcome != NODE_UNCORDONING:
            job.abort_node_outcome = NODE_UNCORDONING
            _commit(job, fields=["abort_node_outcome"], now=now)
        gateway.patch(kube.NODES, job.node_name, {"spec": {"unschedulable": False}}, patch_type="strategic")
        outcome = "uncordoned"
    else:
        # Schedulable: our own patch went out before a worker died, or someone else uncordoned it.
        outcome = "uncordoned" if job.abort_node_outcome == NODE_UNCORDONING else "already schedulable"
    if outcome == "uncordoned":
        audits.append(dict(action="node_uncordon", target=f"Node/{job.node_name}", old={"unschedulable": True},
                           new={"unschedulable": False}))
    message = f"Node {job.node_name} {NODE_OUTCOMES[outcome]}"
    if node is not None:
        _event(gateway, job, _node_ref(job, node), reason="DefragAbort", message=message, now=now)
    job.abort_node_outcome, job.uncordoned = outcome, outcome == "uncordoned"
    _append_log(job, message)
    _commit(job, fields=["abort_node_outcome", "uncordoned"], now=now, audits=audits)


def _step_abort(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    if job.abort_node_outcome in ("", NODE_UNCORDONING):
        _abort_node(job, gateway, now)
    _settle_planned(job, gateway, now)
    waiting, kept, _ = _end_orphans(job, gateway, now, evict=False, force=job.abort_choice == AbortChoice.DELETE)
    if waiting:
        past_deadline = job.abort_deadline_at is not None and now >= job.abort_deadline_at
        if kept and (job.abort_choice == AbortChoice.KEEP or past_deadline):
            return _abort_stuck(job, gateway, now, kept)
        if past_deadline:
            return _abort_stuck(job, gateway, now, [])
        job.next_check_at = now + timedelta(seconds=job.poll_interval_seconds)
        _commit(job, now=now)
        return
    _aborted(job, now)


def _aborted(job: DefragJob, now: datetime) -> None:
    """Every orphan is gone (or none was made): the abort is done."""
    job.state, job.finished_at, job.next_check_at, job.error = JobState.ABORTED, now, None, ""
    orphaned = job.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING, OrphanState.GONE]).exists()
    _append_log(job, f"Aborted: node {job.node_name} {NODE_OUTCOMES.get(job.abort_node_outcome, 'untouched')}; "
                     + ("every orphan gone" if orphaned else "no pod was orphaned"))
    _commit(job, fields=["state", "finished_at"], now=now,
            audits=[dict(action="job_abort", target=f"Node/{job.node_name}")])


def abort_recheck_seconds(job: DefragJob) -> float:
    """Seconds until an abort-stuck job is checked again: CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS,
    or, while an orphan it deleted is still terminating, its poll interval (no sooner than
    the resume beat that hands it to a worker): such a pod goes within its grace period."""
    if job.orphans.filter(state=OrphanState.DELETING).exists():
        return float(max(job.poll_interval_seconds, RESUME_SECONDS))
    return float(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS)


_TRACKED = (OrphanState.ORPHANED, OrphanState.DELETING)


def _step_recheck(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """An abort-stuck job looked at again, on its own: its orphans may end now (their revision
    was scaled to zero since, or room freed and their replacements are ready; one deleted has
    finished terminating). Each is ended as the abort ends it, each deletion audited; the job
    ends `aborted` once none is left. An operator's "keep" keeps only orphans that cannot end.

    Nothing changed: only the next check is recorded (no log line, Event or audit entry per
    check). A worker killed between a deletion and its record leaves the deletion's intent on
    the orphan: the next check records that deletion then, once, whether the pod is still
    terminating or already gone (`_end_intent_settle`)."""
    before = dict(job.orphans.filter(state__in=_TRACKED).values_list("pk", "state"))
    ending = _end_orphans(job, gateway, now, evict=False, checked_again=True)
    if dict(job.orphans.filter(state__in=_TRACKED).values_list("pk", "state")) == before:
        said, counts = _stuck_counts_said(job), _stuck_counts(ending.kept)
        changed = [(revision, said[revision], now_) for revision, now_ in counts.items()
                   if revision in said and said[revision] != now_]
        if changed:
            # Nothing ended, but the stuck message's ready counts are no longer true: it is
            # written again (with what holds the room now); the "kept" lines stay, they say why.
            _append_log(job, abort_recheck_counts_line(changed=changed))
            return _abort_stuck(job, gateway, now, ending.kept)
        _log_drop(job)   # this pass's "kept" lines: the stuck message says it already
        job.next_check_at = now + timedelta(seconds=abort_recheck_seconds(job))
        _commit(job, now=now)
        return
    _append_log(job, abort_recheck_line(ended=ending.ended, left=ending.waiting,
                                        chosen_keep=job.abort_choice == AbortChoice.KEEP))
    if not ending.waiting:
        return _aborted(job, now)
    _abort_stuck(job, gateway, now, ending.kept)


def _revision_name(orphan: DefragOrphan) -> str:
    """ns/name of an orphan's revision, as the stuck message and its audit record name it (and
    as `_stuck_counts` compares them)."""
    return f"{orphan.namespace}/{orphan.revision.revision}"


def _stuck_counts(kept: list) -> dict[str, tuple[int, int]]:
    """Per revision (ns/name) of the orphans kept: (ready without them, wanted)."""
    return {_revision_name(orphan): (ready, wanted) for orphan, ready, wanted in kept}


def _stuck_counts_said(job: DefragJob) -> dict[str, tuple[int, int]]:
    """The ready counts the job's stuck message gives: those its last `job_abort_stuck`
    entry recorded with it."""
    entry = entries_of_subject(subject_type="defrag_job", subject_id=job.pk).filter(action="job_abort_stuck").first()
    kept = ((entry.new or {}).get("kept") or ()) if entry is not None else ()
    return {k["revision"]: (k["ready"], k["wanted"]) for k in kept}


def _abort_stuck(job: DefragJob, gateway: kube.KubeGateway, now: datetime, kept: list) -> None:
    """Stop waiting: say which orphans are left and why, name what holds the room, and
    leave the choice to the operator. The job stays live: it still tracks its orphans."""
    snapshot = snapshot_take(gateway, now=now)
    by_revision: dict[int, dict] = {}
    for orphan, ready, wanted in kept:
        entry = by_revision.setdefault(orphan.revision_id, {
            "revision": _revision_name(orphan), "ready": ready, "wanted": wanted,
            "orphans": [], "gpus": 0, "pending": []})
        entry["orphans"].append(f"{orphan.namespace}/{orphan.pod_name}")
        entry["gpus"] += orphan.gpus
        if len(entry["orphans"]) == 1:  # once per revision: its replacements, and why they are not ready
            for pod in gateway.list(kube.PODS, namespace=orphan.namespace,
                                    label_selector=f"{REVISION_LABEL}={orphan.revision.revision}"):
                meta, status = pod.get("metadata") or {}, pod.get("status") or {}
                owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
                if owner is None or owner.get("name") != orphan.revision.replicaset or meta.get("deletionTimestamp"):
                    continue
                conditions = status.get("conditions") or ()
                if status.get("phase") == "Running" and any(
                        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                    continue
                why = next((c.get("message") or c.get("reason") or "" for c in conditions
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
                entry["pending"].append((f"{orphan.namespace}/{meta.get('name')}", why))
    holders = dict(DefragJob.objects.filter(cluster=job.cluster, state__in=LIVE_STATES).exclude(pk=job.pk)
                   .values_list("node_name", "pk"))
    states = dict(DefragJob.objects.filter(pk__in=holders.values()).values_list("pk", "state"))
    cordoned = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if not node.unschedulable or node.name == job.node_name:
            continue
        used = sum(p.gpus for p in snapshot.pods_on(node.name) if p.phase in ("Pending", "Running")
                   and not p.terminating)
        free = max(node.gpus_allocatable - used, 0)
        if free <= 0:
            continue
        holder = (f"defrag job #{holders[node.name]} ({states[holders[node.name]]})" if node.name in holders
                  else "an operator (no defrag job holds it)")
        cordoned.append({"node": node.name, "free": free, "holder": holder})
    waited = (now - job.abort_started_at).total_seconds()
    recheck = abort_recheck_seconds(job)
    if kept:
        message = abort_stuck_message(node=job.node_name, waited_seconds=waited, kept=list(by_revision.values()),
                                      cordoned=cordoned, chosen_keep=job.abort_choice == AbortChoice.KEEP,
                                      recheck_seconds=float(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS))
    else:
        message = abort_terminating_message(
            waited_seconds=waited, recheck_seconds=recheck,
            terminating=[f"{o.namespace}/{o.pod_name}" for o in job.orphans.filter(state=OrphanState.DELETING)])
    # It rests, and is looked at again when due (`_step_recheck`): its orphans may end later.
    job.state, job.error, job.next_check_at = JobState.ABORT_STUCK, message, now + timedelta(seconds=recheck)
    _append_log(job, message)
    _event(gateway, job, _node_ref(job), reason="DefragAbortStuck", message=message[:1000], now=now,
           event_type="Warning")
    _commit(job, fields=["state"], now=now, audits=[dict(
        action="job_abort_stuck", target=f"Node/{job.node_name}",
        new={"kept": list(by_revision.values()), "cordoned": cordoned, "choice": job.abort_choice or "wait"})])


def _step_drain(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    _settle_planned(job, gateway, now)
    waiting, _, _ = _end_orphans(job, gateway, now, evict=True)
    if waiting:
        job.next_check_at = now + timedelta(seconds=eviction_retry_seconds(job))
        _commit(job, now=now)
        return
    # IMPORTANT: the node is looked at again right before it is deleted: a job may rest as
    # safe for hours, and pods may have come since (a pod bound by name past the cordon, or
    # anything after someone uncordoned the node).
    try:
        node = gateway.get(kube.NODES, job.node_name)
    except NotFound:
        node = None
    staying: list[str] = []
    if node is not None:
        pods = [PodView.from_object(p) for p in gateway.list(kube.PODS, field_selector=f"spec.nodeName={job.node_name}")]
        staying = blockers_remaining(pods, node=job.node_name, own_orphans=())
        if not (node.get("spec") or {}).get("unschedulable"):
            staying.append("the node is schedulable again (uncordoned since the job cordoned it)")
    if job.delete_node and staying:
        return _drain_stopped(job, gateway, now, staying)
    audits = []
    lines = []
    if job.delete_node:
        if node is not None:
            if job.node_delete_intent_at is None:
                # IMPORTANT: the intent is recorded before the delete, so a worker dying right
                # after it (or an abort landing before the record) knows the deletion was ours.
                job.node_delete_intent_at = now
                _commit(job, fields=["node_delete_intent_at"], now=now)
            try:
                gateway.delete(kube.NODES, job.node_name)
                lines.append(f"Node {job.node_name} deleted")
                audits.append(dict(action="node_delete", target=f"Node/{job.node_name}"))
            except NotFound:
                node = None
        if node is None:
            ours = job.node_delete_intent_at is not None
            lines.append(f"Node {job.node_name} is gone" + (" (deleted by this job before a worker stopped)"
                                                            if ours else " (deleted outside this job)"))
            audits.append(dict(action="node_delete", target=f"Node/{job.node_name}",
                               new={"already_gone": True, "by_this_job": ours}))
    elif staying:
        lines.append(f"Still on node {job.node_name}, not this job's to move: {', '.join(staying)}")
    job.state, job.finished_at, job.next_check_at = JobState.DRAINED, now, None
    _append_log(job, *lines, f"Node {job.node_name} drained: every orphan is gone")
    # IMPORTANT: the node deletion and the final state in one record: a worker dying between
    # two records would redo the (harmless, NotFound) delete and audit it twice.
    _commit(job, fields=["state", "finished_at"], now=now,
            audits=audits + [dict(action="job_drain", target=f"Node/{job.node_name}")])
    _event(gateway, job, _node_ref(job), reason="DefragDrained", message=f"Node {job.node_name} drained", now=now)


def _drain_stopped(job: DefragJob, gateway: kube.KubeGateway, now: datetime, staying: list[str]) -> None:
    """The orphans are evicted, but the node is not the job's to delete any more."""
    message = (f"Orphans evicted, but node {job.node_name} was not deleted: {'; '.join(staying)}. "
               f"Return it to service, or delete it yourself once that is settled.")
    job.state, job.next_check_at, job.error = JobState.BLOCKED, None, message
    _append_log(job, message)
    _commit(job, fields=["state"], now=now, audits=[dict(action="job_blocked", target=f"Node/{job.node_name}",
                                                         new={"blockers": staying, "at": "drain"})])
    _event(gateway, job, _node_ref(job), reason="DefragBlocked", message=message, now=now, event_type="Warning")


EVICTION_REFUSED = "Eviction refused by a PodDisruptionBudget: "


def eviction_retry_seconds(job: DefragJob) -> float:
    """Seconds until a refused eviction is tried again: kubectl's 5 s, or the job's poll
    interval when that is shorter (what the log line must say)."""
    return min(job.poll_interval_seconds, EVICTION_RETRY_SECONDS)


class _Ending(NamedTuple):
    """What one pass over the orphans left: how many are not gone yet, the (orphan, ready,
    wanted) an abort keeps because its revision needs it still, and (ns/name, what became
    of it) for each orphan this pass deleted, evicted or saw gone."""
    waiting: int
    kept: list
    ended: list


# An eviction or deletion whose answer was lost (the connection dropped after it was sent),
# and the gateway's try again found the pod gone: the first one went out, and the pod is gone
# after it. Recorded as the job's, as a killed worker's request is (`_end_intent_settle`):
# taken for a pod that went by itself, the job's own end of it would go unaudited.
ANSWER_LOST_GONE = "its answer was lost; asked again, the pod was gone"

# What the cause of an orphan's eviction or deletion starts with when a later pass records
# it: first and short, so the audit trail's 200 characters never cut it off.
END_INTERRUPTED = "recorded after an interruption"


def _end_words(end: str) -> tuple[str, str, str]:
    """(audit action, what was done, the request) for an orphan's end."""
    if end == OrphanEnd.EVICT:
        return "pod_evict", "evicted", "eviction"
    return "pod_delete", "deleted", "deletion"


def _end_event_message(job: DefragJob, end: str, cause: str) -> str:
    """The Event an orphan's end posts: the same text whoever records it, so an Event posted
    before a worker died is not posted twice (its name is derived from it)."""
    return f"Evicted by defrag job #{job.pk} (drain of {job.node_name})" if end == OrphanEnd.EVICT else cause


def _end_intent_clear(orphan: DefragOrphan) -> None:
    orphan.end_intent, orphan.end_intent_at, orphan.end_intent_by, orphan.end_intent_cause = "", None, None, ""


def _end_intent_settle(job: DefragJob, gateway: kube.KubeGateway, now: datetime, orphan: DefragOrphan,
                       named: dict | None) -> tuple[str, str]:
    """Record what became of an eviction or deletion a worker announced on `orphan` and
    stopped before recording (`named`: the pod now under its name, None when none is).

    Gone or terminating: the request went out; it is audited now, once (the intent is cleared
    in the same record), dated when it was sent, under the operator it was sent for. Another
    pod under the name: that one is not the job's, and the end of the old one is not recorded
    as the job's doing. Still serving: it never took effect; the caller decides again.
    Returns (EndSettle outcome, what became of the pod for the abort-stuck check's line)."""
    meta = (named or {}).get("metadata") or {}
    outcome = orphan_end_settle(orphan_uid=orphan.uid, pod_uid=meta.get("uid") if named is not None else None,
                                terminating=bool(meta.get("deletionTimestamp")))
    if outcome == EndSettle.NOT_SENT:
        return outcome, ""
    key = f"{orphan.namespace}/{orphan.pod_name}"
    action, done, request = _end_words(orphan.end_intent)
    audits: list[dict] = []
    if outcome == EndSettle.REPLACED:
        what = f"gone (replaced by a new pod of the same name, not this job's; its {request} is not recorded)"
        _append_log(job, f"Pod {key} is gone; the pod now under its name (uid {meta.get('uid')}) is a new one, not "
                         f"this job's: left alone. This job's interrupted {request} of the old pod is not recorded "
                         f"as done (the old pod may have gone before it).")
    else:
        what = f"{done} before its worker stopped; " + ("gone" if outcome == EndSettle.GONE else "is terminating")
        audits.append(dict(action=action, target=f"Pod/{key}", now=orphan.end_intent_at,
                           actor=orphan.end_intent_by, new={"pod": outcome, "recorded_after_interruption": True},
                           cause=f"{END_INTERRUPTED}: {orphan.end_intent_cause}"))
        _event(gateway, job, _pod_ref(orphan), reason="DefragEvict" if action == "pod_evict" else "DefragDelete",
               message=_end_event_message(job, orphan.end_intent, orphan.end_intent_cause), now=now)
        _append_log(job, f"Pod {key} {done} by this job (sent at {_stamp(orphan.end_intent_at)}); its worker "
                         f"stopped before recording it: recorded now")
    _end_intent_clear(orphan)
    if outcome == EndSettle.TERMINATING:
        orphan.state = OrphanState.DELETING
    else:
        orphan.state, orphan.gone_at = OrphanState.GONE, now
        _append_log(job, f"Pod {key} gone")
        audits.append(dict(action="pod_gone", target=f"Pod/{key}",
                           new={"replaced_by_uid": meta.get("uid")} if outcome == EndSettle.REPLACED else None))
    _commit(job, orphans=[orphan], now=now, audits=audits)
    return outcome, what


def _end_orphans(job: DefragJob, gateway: kube.KubeGateway, now: datetime, *, evict: bool,
                 force: bool = False, checked_again: bool = False) -> _Ending:
    """Evict (drain) or delete (abort) the orphans. `checked_again`: a check of an abort-stuck
    job (`_step_recheck`), said in each deletion's audit cause.

    Each request is announced on its orphan (`end_intent`, committed) before it is sent, and
    recorded with the intent cleared after: a worker killed in between leaves the intent,
    and the next pass records that end from what the pod shows (`_end_intent_settle`)."""
    waiting = 0
    refused = False
    kept: list = []
    ended: list[tuple[str, str]] = []
    back: dict[int, tuple[int, int]] = {}  # revision id -> (ready without orphans, wanted), read once per pass
    deleted_models: set[int] = set()        # revision ids whose ReplicaSet is gone
    asleep_models: set[int] = set()         # revision ids scaled to zero (`revision_asleep`)
    end = OrphanEnd.EVICT if evict else OrphanEnd.DELETE
    for orphan in job.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).select_related(
            "revision"):
        target = f"Pod/{orphan.namespace}/{orphan.pod_name}"
        named = _pod_named(gateway, orphan)
        if orphan.end_intent:
            outcome, what = _end_intent_settle(job, gateway, now, orphan, named)
            if outcome != EndSettle.NOT_SENT:
                ended.append((f"{orphan.namespace}/{orphan.pod_name}", what))
                waiting += outcome == EndSettle.TERMINATING
                continue
        pod = named if named is not None and (named.get("metadata") or {}).get("uid") == orphan.uid else None
        if pod is None:
            ended.append((f"{orphan.namespace}/{orphan.pod_name}",
                          "gone (its deletion finished)" if orphan.state == OrphanState.DELETING else "gone"))
            orphan.state, orphan.gone_at = OrphanState.GONE, now
            _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} gone")
            _commit(job, orphans=[orphan], now=now, audits=[dict(action="pod_gone", target=target)])
            continue
        waiting += 1
        if orphan.state == OrphanState.DELETING:
            continue  # terminating: wait for its grace period
        pod_key = f"{orphan.namespace}/{orphan.pod_name}"
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            # Terminating, and no intent says the job asked for it: someone else deleted it.
            # It is waited for like the job's own; its deletion is not audited as the job's.
            orphan.state = OrphanState.DELETING
            _end_intent_clear(orphan)
            ended.append((pod_key, "is terminating (deleted outside this job)"))
            _append_log(job, f"Pod {pod_key} is terminating: deleted outside this job")
            _commit(job, orphans=[orphan], now=now)
            continue
        new: dict = {}
        action, done, _ = _end_words(end)
        line = f"Pod {pod_key} {done}"
        if evict:
            cause = f"defrag job #{job.pk} ({job.state})"
            _end_intent_write(job, orphan, end=end, cause=cause, now=now)
            try:
                gateway.evict(orphan.pod_name, namespace=orphan.namespace)
            except TooManyRequests as exc:
                _append_log(job, f"Eviction of {pod_key} refused (PodDisruptionBudget): retrying in "
                                 f"{eviction_retry_seconds(job):g}s")
                job.error, refused = f"{EVICTION_REFUSED}{exc}", True
                _end_intent_refused(job, orphan, now)
                continue
            except NotFound as exc:
                if not exc.after_unanswered_write:
                    _end_intent_refused(job, orphan, now)
                    continue  # gone meanwhile: seen as gone on the next pass
                line, new = f"{line} ({ANSWER_LOST_GONE})", {"answer_lost": True}
        else:
            if orphan.revision_id not in back:
                try:
                    rs = gateway.get(kube.REPLICASETS, orphan.revision.replicaset, namespace=orphan.namespace)
                except NotFound:
                    # The model was deleted: it wants no pod, and an orphan has no owner for the
                    # garbage collector to follow, so ending it is the abort's to do.
                    rs = {"spec": {"replicas": 0}}
                    deleted_models.add(orphan.revision_id)
                    _append_log(job, f"ReplicaSet {orphan.namespace}/{orphan.revision.replicaset} is gone "
                                     f"(its model was deleted): its orphans are deleted")
                pods = gateway.list(kube.PODS, namespace=orphan.namespace,
                                    label_selector=f"{REVISION_LABEL}={orphan.revision.revision}")
                back[orphan.revision_id] = (replicaset_ready_pods(pods, replicaset=orphan.revision.replicaset),
                                            _scale((rs.get("spec") or {}).get("replicas")))
                if orphan.revision_id not in deleted_models \
                        and _revision_asleep(gateway, orphan.revision, replicas=back[orphan.revision_id][1]):
                    asleep_models.add(orphan.revision_id)
                    _append_log(job, asleep_line(revision=orphan.revision.revision, during_wait=False,
                                                 orphans=_orphan_names(orphan.revision)))
            ready, wanted = back[orphan.revision_id]
            # Why the abort may end it: the Event's message and the audit entry's cause say it.
            if orphan.revision_id in deleted_models:
                why = "its model was deleted"
            elif orphan.revision_id in asleep_models:
                # Nothing is kept or brought back for it: it sleeps as whoever scaled it chose.
                why = f"revision {orphan.revision.revision} is scaled to zero, no replacement needed"
            else:
                why = "its revision is back to scale"
            context = "abort-stuck, checked again" if checked_again else "abort"
            if ready < wanted:
                if not force:
                    _append_log(job, f"Pod {pod_key} kept: revision {orphan.revision.revision} has "
                                     f"{ready}/{wanted} ready without it")
                    kept.append((orphan, ready, wanted))
                    if orphan.end_intent:
                        _end_intent_refused(job, orphan, now)  # an earlier request never took effect
                    continue
                context, why = "abort, operator chose to delete anyway", \
                    f"its revision has {ready}/{wanted} ready without it"
                line = (f"Pod {pod_key} deleted as the operator chose: revision {orphan.revision.revision} has "
                        f"{ready}/{wanted} ready without it (capacity drops)")
                new = {"forced": True, "ready": ready, "wanted": wanted}
            cause = f"Deleted by defrag job #{job.pk} ({context}): {why}"
            _end_intent_write(job, orphan, end=end, cause=cause, now=now)
            try:
                gateway.delete(kube.PODS, orphan.pod_name, namespace=orphan.namespace, uid=orphan.uid)
            except NotFound as exc:
                if not exc.after_unanswered_write:
                    _end_intent_refused(job, orphan, now)
                    continue  # gone meanwhile: seen as gone on the next pass
                line, new = f"{line} ({ANSWER_LOST_GONE})", {**new, "answer_lost": True}
            except Conflict:
                # The uid precondition failed: the name holds a new pod, which is not this job's.
                _append_log(job, f"Pod {pod_key} was replaced by a new pod of the same name before its "
                                 f"deletion: the new one is not this job's and is left alone")
                _end_intent_refused(job, orphan, now)
                continue
            ended.append((pod_key, f"deleted: {why}"))
        orphan.state = OrphanState.DELETING
        _end_intent_clear(orphan)
        _event(gateway, job, _pod_ref(orphan), reason="DefragEvict" if evict else "DefragDelete",
               message=_end_event_message(job, end, cause), now=now)
        _append_log(job, line)
        _commit(job, orphans=[orphan], now=now, audits=[dict(action=action, target=f"Pod/{pod_key}", new=new,
                                                             cause=cause)])
    if not refused and job.error.startswith(EVICTION_REFUSED):
        job.error = ""  # no budget refused this pass: the job must not go on showing an old 429
    return _Ending(waiting=waiting, kept=kept, ended=ended)


def _end_intent_write(job: DefragJob, orphan: DefragOrphan, *, end: str, cause: str, now: datetime) -> None:
    """IMPORTANT: committed before the eviction or deletion is sent, so a worker dying right
    after it leaves a record that the pod's end is the job's (and why, and for whom)."""
    orphan.end_intent, orphan.end_intent_at, orphan.end_intent_cause = end, now, cause
    orphan.end_intent_by_id = job.operator_id
    _commit(job, orphans=[orphan], now=now)


def _end_intent_refused(job: DefragJob, orphan: DefragOrphan, now: datetime) -> None:
    """The request was refused (a PodDisruptionBudget, the pod gone or replaced before it):
    nothing was ended, so nothing is left to be recorded as ended later."""
    _end_intent_clear(orphan)
    _commit(job, orphans=[orphan], now=now)


# ---- leases: which worker steps a job -------------------------------------------------------

def defrag_job_lease_acquire(*, job_id: int, owner: str, now: datetime) -> bool:
    """Take the job for `owner` unless another worker's lease is still running. One
    conditional UPDATE: two workers asking at once cannot both get it."""
    free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    return DefragJob.objects.filter(Q(pk=job_id) & free).update(
        lease_owner=owner, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS), heartbeat_at=now) == 1


def defrag_job_lease_renew(*, job_id: int, owner: str, now: datetime) -> bool:
    """Heartbeat: extend the lease; False when it was lost (expired and taken by another)."""
    return DefragJob.objects.filter(pk=job_id, lease_owner=owner).update(
        lease_expires_at=now + timedelta(seconds=LEASE_SECONDS), heartbeat_at=now) == 1


def defrag_job_lease_release(*, job_id: int, owner: str) -> None:
    DefragJob.objects.filter(pk=job_id, lease_owner=owner).update(lease_owner="", lease_expires_at=None)


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


# ---- return to service ------------------------------------------------------------------------

# A job resting here has no worker acting on the node, and no longer needs it cordoned: the
# node may take pods again. A job in any other live state is emptying the node (or undoing
# its own work): uncordoning under it would let replacements land back where it is moving
# pods from.
RETURNABLE_STATES = (JobState.SAFE, JobState.BLOCKED, JobState.FAILED, JobState.DRAINED, JobState.ABORTED,
                     JobState.ABORT_STUCK)
# Resting jobs that still track orphans serving on the node and have no abort under way:
# returning the node to service also asks for the abort that ends them (each one only once
# its revision is back to scale), so no orphan holds a GPU forever and no drain can follow
# on a node that takes new pods again.
ENDED_BY_RETURN = (JobState.SAFE, JobState.BLOCKED, JobState.FAILED)


@dataclass(frozen=True)
class ReturnToService:
    """What `node_return_to_service` did, in the words the panel and the CLI print."""

    node: str
    job_id: int
    uncordoned: bool
    abort_requested: bool
    message: str


def defrag_job_holding_reason(job: DefragJob) -> str:
    """Why this job does not let the node go now, or "" when it does."""
    if job.state not in RETURNABLE_STATES:
        return f"defrag job #{job.pk} is {job.state}: a worker is acting on the node"
    if job.abort_pending:
        return f"defrag job #{job.pk} has an abort request not yet taken up"
    if job.state == JobState.SAFE and job.drain_requested_at is not None:
        return f"defrag job #{job.pk} has a drain requested"
    return ""


# A return to service announces itself on the job before its patch (`return_intent_*`,
# committed), and clears that with its audit entry. An intent found left behind on a node
# still cordoned means its patch never went out, or a newer return took over: the resume
# beat lets it lapse only after this long (seconds; a live return to service passes from
# its announcement to its patch in well under a second, and at worst waits out a few
# gateway retries of KUBE_REQUEST_TIMEOUT, 30 s, each). Ten minutes: far above both.
RETURN_INTENT_LAPSE_SECONDS = 600.0


@dataclass(frozen=True)
class _IntentSettled:
    """What became of a return to service's intent left behind, in the operator's words."""

    message: str
    recorded: bool          # its uncordon was found done and audited now
    abort_requested: bool   # the abort that return would have asked for is asked now


def _who(user, label: str) -> str:
    return str(user) if user is not None else (label or "CLI")


def _stamp(at: datetime) -> str:
    return at.astimezone(dt_timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _return_intent_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _return_intent_clear(row: DefragJob) -> None:
    DefragJob.objects.filter(pk=row.pk).update(return_intent_at=None, return_intent_by=None, return_intent_label="",
                                               return_intent_cause="", return_intent_owner="")
    row.return_intent_at, row.return_intent_by, row.return_intent_label = None, None, ""
    row.return_intent_cause, row.return_intent_owner = "", ""


def _abort_asked_text(row: DefragJob, orphans: int) -> str:
    if orphans:
        return (f" Abort of defrag job #{row.pk} requested: its {orphans} orphan(s) are deleted, each once its "
                f"revision is back to scale.")
    return f" Abort of defrag job #{row.pk} requested: it has no orphan left to end."


def _live_orphans(row: DefragJob) -> int:
    return row.orphans.filter(state__in=[OrphanState.PLANNED, OrphanState.ORPHANED, OrphanState.DELETING]).count()


def _return_intent_settle(row: DefragJob, *, current: dict | None, gateway: kube.KubeGateway, now: datetime,
                          by: str, enqueue: bool) -> _IntentSettled | None:
    """Say and record what became of a return to service that stopped between its intent
    and its record (its process was killed, or its patch's answer was lost).

    Call inside a transaction, with the job's row locked (`select_for_update`) and the node
    (`current`, None when gone) read under that lock: a return to service holds the same
    lock from its patch to its record, so an intent seen here is not one under way past
    its patch. A schedulable node was uncordoned by it: its audit entry is written now,
    once (the intent is cleared with it), under its own operator and cause, with the
    abort it would have asked for. A cordoned node was not: the intent lapses, nothing is
    audited as changed. `by` names who records it (for the log)."""
    if row.return_intent_at is None:
        return None
    node, user, label, at = row.node_name, row.return_intent_by, row.return_intent_label, row.return_intent_at
    earlier = f"an earlier return to service (by {_who(user, label)} at {_stamp(at)})"
    cordoned = bool(((current or {}).get("spec") or {}).get("unschedulable"))
    if current is None:
        message = (f"Node {node} is gone: {earlier} stopped before it was recorded, and whether it uncordoned the "
                   f"node first is not known; nothing is recorded as changed.")
    elif cordoned:
        message = (f"{earlier[0].upper()}{earlier[1:]} had not uncordoned node {node}: nothing was changed by it "
                   f"(it stopped before its uncordon, or a newer one took it over).")
    else:
        message = f"Node {node} was uncordoned by {earlier} that was interrupted before it was recorded; recorded now."
        asks_abort = row.state in ENDED_BY_RETURN and not defrag_job_holding_reason(row)
        if asks_abort:
            message += _abort_asked_text(row, _live_orphans(row))
        # The entry is dated when the uncordon was asked for (and sent), and written under
        # whoever asked, as that return to service would have written it.
        with acting_as(label):
            _audit(row, now=at, actor=user, action="node_return_to_service", target=f"Node/{node}",
                   cause=f"{row.return_intent_cause}; recorded after an interruption (its process stopped before "
                         f"recording it)", old={"unschedulable": True}, new={"unschedulable": False})
        _log_write(row.pk, [f"{message} (recorded by {by})"])
        _event(gateway, row, _node_ref(row, current), reason="DefragReturnToService", message=message, now=now)
        _return_intent_clear(row)
        if asks_abort:
            DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome=NODE_RETURNED)
            with acting_as(label):
                defrag_job_abort(job=row, actor=user, now=now, enqueue=enqueue)
        return _IntentSettled(message=message, recorded=True, abort_requested=asks_abort)
    _log_write(row.pk, [message])
    _return_intent_clear(row)
    return _IntentSettled(message=message, recorded=False, abort_requested=False)


def defrag_return_intents_settle(*, now: datetime, gateway: kube.KubeGateway | None = None,
                                 enqueue: bool = True) -> list[int]:
    """The resume beat's part in returns to service: settle each intent one left behind
    (`_return_intent_settle`) without waiting for the operator's next return to service,
    so its audit entry is written and the abort it asked for ends the orphans. An intent on
    a node still cordoned is left to its own process for RETURN_INTENT_LAPSE_SECONDS first.
    Returns the ids of the jobs settled. A job a return to service holds now is skipped
    (its row is locked): the next beat looks again."""
    settled = []
    for job_id in DefragJob.objects.filter(return_intent_at__isnull=False).order_by("pk").values_list("pk", flat=True):
        try:
            with transaction.atomic():
                row = (DefragJob.objects.select_for_update(skip_locked=True)
                       .filter(pk=job_id, return_intent_at__isnull=False).first())
                if row is None:
                    continue
                cluster_gateway = _gateway(row, gateway)
                try:
                    current = cluster_gateway.get(kube.NODES, row.node_name)
                except NotFound:
                    current = None
                cordoned = bool(((current or {}).get("spec") or {}).get("unschedulable"))
                if cordoned and now < row.return_intent_at + timedelta(seconds=RETURN_INTENT_LAPSE_SECONDS):
                    continue
                _return_intent_settle(row, current=current, gateway=cluster_gateway, now=now, by="the resume beat",
                                      enqueue=enqueue)
                settled.append(row.pk)
        except KubeError as exc:
            log.warning("defrag job %s: return to service intent not settled now (%s); the next beat tries again",
                        job_id, exc)
    return settled


def _already_schedulable(row: DefragJob, *, node: str, actor, now: datetime, enqueue: bool,
                         settled: _IntentSettled | None) -> ReturnToService:
    """The node takes pods already: by kubectl, or by an earlier return to service (then
    `settled` says so and has asked its abort). Its orphans must still end, or they hold
    their GPUs for good."""
    if settled is not None and settled.recorded:
        return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=settled.abort_requested,
                               message=settled.message)
    orphans = _live_orphans(row)
    message = f"Node {node} was already schedulable; nothing to uncordon."
    if defrag_job_holding_reason(row) or not (row.state in ENDED_BY_RETURN and orphans):
        return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=False,
                               message=message + " Nothing changed.")
    message += _abort_asked_text(row, orphans)
    _log_write(row.pk, [f"{message} (by {_who(actor, actor_label_current())})"])
    DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome="already schedulable")
    defrag_job_abort(job=row, actor=actor, now=now, enqueue=enqueue)
    return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=True, message=message)


def node_return_to_service(*, cluster: Cluster, node: str, actor, job: DefragJob | None = None,
                           gateway: kube.KubeGateway | None = None, now: datetime | None = None,
                           enqueue: bool = True) -> ReturnToService:
    """Uncordon a node a defrag job has held, once no job is acting on it.

    The job is `job`, else the node's live job, else its newest. Refused, changing
    nothing, when a live job is still acting on the node (or has a request pending), when
    no defrag job ever held it (the product does not undo a cordon it never had a part
    in), or when the node is gone. A node already schedulable is left alone (idempotent).
    A safe, blocked or failed job still tracking orphans is asked to abort as well. Needs
    `capacity.return_to_service_defragjob` when `actor` is a user.

    Durable in two transactions, both under the job's row lock: the first decides and
    commits the intent (who, when, the cause); the second re-reads the node, patches it,
    and writes the audit entry, log, Event and abort request with the intent cleared. A
    process killed between the patch and that record leaves the intent: the next return to
    service of the node, or the resume beat, records the uncordon then, once.
    """
    now = now or clock.now()
    if actor is not None and not actor.has_perm("capacity.return_to_service_defragjob"):
        raise DefragError(f"user {actor} may not return nodes to service (needs "
                          f"capacity.return_to_service_defragjob)")
    if job is not None and (job.cluster_id != cluster.pk or job.node_name != node):
        raise DefragError(f"defrag job #{job.pk} is for node {job.node_name!r} of cluster {job.cluster.name!r}, "
                          f"not {node!r} of {cluster.name!r}")
    gateway = _gateway(cluster, gateway)
    who = _who(actor, actor_label_current())
    gone = f"node {node!r} is gone from cluster {cluster.name!r}: nothing to return to service"
    owner = _return_intent_owner()
    with transaction.atomic():
        live = DefragJob.objects.select_for_update().filter(cluster=cluster, node_name=node,
                                                            state__in=LIVE_STATES).first()
        if live is not None and job is not None and live.pk != job.pk:
            raise DefragError(f"node {node!r} is now held by defrag job #{live.pk} ({live.state}): return it to "
                              f"service from that job")
        row = live or (DefragJob.objects.select_for_update().get(pk=job.pk) if job is not None else
                       DefragJob.objects.filter(cluster=cluster, node_name=node).order_by("-created_at", "-pk")
                       .select_for_update().first())
        try:
            current = gateway.get(kube.NODES, node)
        except NotFound:
            raise DefragError(gone) from None
        cordoned = bool((current.get("spec") or {}).get("unschedulable"))
        if row is None:
            if not cordoned:
                raise DefragError(f"node {node!r} is schedulable and no defrag job has held it on cluster "
                                  f"{cluster.name!r}: nothing to return to service")
            raise DefragError(f"no defrag job has held node {node!r} on cluster {cluster.name!r}: its cordon is not "
                              f"the product's to undo (kubectl uncordon {node}, if it is meant)")
        if not cordoned:
            settled = _return_intent_settle(row, current=current, gateway=gateway, now=now, by=who, enqueue=enqueue)
            return _already_schedulable(row, node=node, actor=actor, now=now, enqueue=enqueue, settled=settled)
        holding = defrag_job_holding_reason(row)
        if holding:
            raise DefragError(f"node {node!r} is not returned to service: {holding}. Wait until the job rests "
                              f"(safe, failed, drained, aborted) and try again")
        # An intent left on a cordoned node did nothing: it lapses (logged), and ours replaces it.
        lapsed = _return_intent_settle(row, current=current, gateway=gateway, now=now, by=who, enqueue=enqueue)
        # IMPORTANT: the intent is committed before the patch, so a process killed right after
        # the patch leaves a record of whose uncordon it was.
        DefragJob.objects.filter(pk=row.pk).update(
            return_intent_at=now, return_intent_by=actor, return_intent_label="" if actor else actor_label_current(),
            return_intent_cause=f"returned to service by an operator; defrag job #{row.pk} was {row.state}",
            return_intent_owner=owner)
    refusal = ""
    with transaction.atomic():
        row = DefragJob.objects.select_for_update().get(pk=row.pk)
        if row.return_intent_owner != owner:
            # Settled or taken over meanwhile: the patch is not this call's to send any more.
            if row.return_intent_at is not None:
                message = (f"Nothing was done by this return to service of node {node}: a newer one (by "
                           f"{_who(row.return_intent_by, row.return_intent_label)} at {_stamp(row.return_intent_at)}) "
                           f"took it over.")
            else:
                message = (f"Nothing was done by this return to service of node {node}: it was settled by another "
                           f"meanwhile (see defrag job #{row.pk}'s log).")
            return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=False, message=message)
        # IMPORTANT: the node is re-read under the job's row lock, right before the patch.
        try:
            current = gateway.get(kube.NODES, node)
        except NotFound:
            current = None
        holding = defrag_job_holding_reason(row)
        if current is None or holding or not (current.get("spec") or {}).get("unschedulable"):
            _return_intent_clear(row)
            if current is not None and not holding:
                return _already_schedulable(row, node=node, actor=actor, now=now, enqueue=enqueue, settled=None)
            refusal = gone if current is None else (
                f"node {node!r} is not returned to service: {holding} (since this return to service was asked). "
                f"Wait until the job rests (safe, failed, drained, aborted) and try again")
        else:
            try:
                gateway.patch(kube.NODES, node, {"spec": {"unschedulable": False}}, patch_type="strategic")
            except NotFound:
                _return_intent_clear(row)
                refusal = gone
            except KubeError as exc:
                # The answer is lost, not necessarily the patch: the intent stays (this
                # transaction writes nothing), and whoever next finds it records what happened.
                raise ReturnUnconfirmed(
                    f"the uncordon of node {node!r} was sent, but its outcome is not known ({exc}). If it took "
                    f"effect, the resume beat records it within {RESUME_PROMISE} (or the next return to service "
                    f"does); if not, the node stays cordoned: return it to service again") from None
            else:
                return _uncordon_record(row, node=node, current=current, actor=actor, who=who, gateway=gateway,
                                        now=now, enqueue=enqueue, lapsed=lapsed)
    raise DefragError(refusal)


def _uncordon_record(row: DefragJob, *, node: str, current: dict, actor, who: str, gateway: kube.KubeGateway,
                     now: datetime, enqueue: bool, lapsed: _IntentSettled | None) -> ReturnToService:
    """What a return to service did, recorded in the transaction of its patch, with its
    intent cleared: the audit entry, the log, an Event, the abort it asks for."""
    orphans = _live_orphans(row)
    asks_abort = row.state in ENDED_BY_RETURN
    _audit(row, now=now, actor=actor, action="node_return_to_service", target=f"Node/{node}",
           cause=row.return_intent_cause, old={"unschedulable": True}, new={"unschedulable": False})
    message = f"Node {node} uncordoned: it takes new pods again."
    if row.state == JobState.ABORT_STUCK and orphans:
        message += (f" Defrag job #{row.pk} still keeps {orphans} orphan(s) serving on it and checks them again "
                    f"every {seconds_text(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS)}: each ends once its "
                    f"revision is scaled to zero or its replacements are ready.")
    elif asks_abort:
        message += _abort_asked_text(row, orphans)
    if lapsed is not None:
        message += f" {lapsed.message}"
    _log_write(row.pk, [f"{message} (by {who})"])
    _event(gateway, row, _node_ref(row, current), reason="DefragReturnToService", message=message, now=now)
    _return_intent_clear(row)
    if asks_abort:
        DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome=NODE_RETURNED)
        defrag_job_abort(job=row, actor=actor, now=now, enqueue=enqueue)
    return ReturnToService(node=node, job_id=row.pk, uncordoned=True, abort_requested=asks_abort, message=message)
