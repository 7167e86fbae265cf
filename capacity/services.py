"""Defrag jobs: discovery, start, one step at a time, drain and abort (seed 000).

A job advances by `defrag_job_step`, which does at most one kind of side effect and then
records it (`_commit`) before returning. The Celery task loops over it; tests call it
directly and move the simulated clock in between. Crash safety comes from the order:
each step re-reads what it is about to change, skips what is already done (a crash
between the side effect and `_commit` leaves the effect in the cluster and the step in
the database), and only then writes.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from clusters import kube
from clusters.errors import AlreadyExists, Conflict, Invalid, KubeError, NotFound, TooManyRequests
from clusters.models import Cluster
from clusters.snapshot import NodeView, PodView
from config import clock

from capacity.models import (
    LIVE_STATES,
    RUNNING_STATES,
    DefragAudit,
    DefragJob,
    DefragOrphan,
    DefragRevision,
    JobState,
    OrphanState,
)
from capacity.planning import (
    REVISION_LABEL,
    TEMPLATE_HASH_LABEL,
    DefragPlan,
    RevisionScale,
    Role,
    blockers_remaining,
    defrag_plan,
    orphan_patch,
    pod_classify,
    progress_line,
    replicaset_ready_pods,
    revision_satisfied,
)

log = logging.getLogger(__name__)

SAFE_MESSAGE = "Safe to defrag/remove node"
# kubectl drain waits this long before retrying an eviction a PodDisruptionBudget refused.
EVICTION_RETRY_SECONDS = 5.0
# Backoff after an API failure inside a step, seconds (the gateway already retried).
ERROR_RETRY_SECONDS = 5.0
# Progress lines kept on the job (the newest); a 30-minute wait at 1 s polls stays small.
LOG_LIMIT = 500


class DefragError(Exception):
    """A defrag request that cannot be carried out as asked; the message says why."""


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


def _append_log(job: DefragJob, *lines: str) -> None:
    job.log = (list(job.log) + list(lines))[-LOG_LIMIT:]


def _audit(job: DefragJob, *, now: datetime, action: str, target: str, old=None, new=None, actor=None) -> None:
    DefragAudit.objects.create(job=job, at=now, actor=actor or job.operator, action=action, target=target,
                               old=old or {}, new=new or {})


def _commit(job: DefragJob, *, fields: Iterable[str] = (), orphans: Iterable[DefragOrphan] = (),
            audits: Iterable[dict] = (), now: datetime) -> None:
    """Record, in one transaction, what a step did. IMPORTANT: called only after the side
    effect succeeded: a crash before it makes the next worker redo the (re-checked) step."""
    with transaction.atomic():
        for orphan in orphans:
            orphan.save()
        for entry in audits:
            _audit(job, now=now, **entry)
        job.save(update_fields=sorted(set(fields) | {"log", "error", "next_check_at", "updated_at"}))


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


def _get_pod(gateway: kube.KubeGateway, orphan: DefragOrphan) -> dict | None:
    """The orphan's pod, or None when it is gone (a new pod with the same name is not it)."""
    try:
        pod = gateway.get(kube.PODS, orphan.pod_name, namespace=orphan.namespace)
    except NotFound:
        return None
    return pod if (pod.get("metadata") or {}).get("uid") == orphan.uid else None


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
        key = (pod.namespace, pod.labels["serving.knative.dev/revision"])
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
        raise DefragError(str(exc)) from None


# ---- start ----------------------------------------------------------------------------------

def defrag_job_start(*, cluster: Cluster, node_name: str, plan: DefragPlan, actor=None,
                     timeout_seconds: int | None = None, poll_interval_seconds: float | None = None,
                     now: datetime | None = None, enqueue: bool = True) -> DefragJob:
    """Create the confirmed job (the operator saw `plan`) and hand it to a worker."""
    now = now or clock.now()
    timeout_seconds = settings.CAPACITY_DEFRAG_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    poll = settings.CAPACITY_DEFRAG_POLL_SECONDS if poll_interval_seconds is None else poll_interval_seconds
    if not isinstance(timeout_seconds, int) or timeout_seconds <= 0:
        raise DefragError(f"timeout must be a whole number of seconds > 0, got {timeout_seconds!r}")
    if not isinstance(poll, (int, float)) or poll <= 0:
        raise DefragError(f"poll interval must be a number of seconds > 0, got {poll!r}")
    if plan.node != node_name:
        raise DefragError(f"the report is for node {plan.node!r}, not {node_name!r}")
    limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
    try:
        with transaction.atomic():
            # Lock the cluster row so two operators cannot both pass the limit check.
            Cluster.objects.select_for_update().get(pk=cluster.pk)
            live = DefragJob.objects.filter(cluster=cluster, node_name=node_name, state__in=LIVE_STATES).first()
            if live is not None:
                raise DefragError(f"node {node_name!r} already has a live defrag job #{live.pk} ({live.state}); "
                                  f"abort or drain it first")
            running = DefragJob.objects.filter(cluster=cluster, state__in=RUNNING_STATES).count()
            if running >= limit:
                raise DefragError(f"cluster {cluster.name!r} already runs {running} defrag job(s); "
                                  f"the limit is {limit} (CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
            job = DefragJob.objects.create(
                cluster=cluster, node_name=node_name, report=plan.to_dict(), timeout_seconds=timeout_seconds,
                poll_interval_seconds=float(poll), requested_by=actor, operator=actor, created_at=now,
                log=plan.report_lines() + ["Proceed with defrag? (y/n): y"])
            _audit(job, now=now, action="job_confirm", target=f"Node/{node_name}",
                   new={"pods": [p.key for p in plan.model_pods], "blockers": [p.key for p in plan.blockers]})
    except IntegrityError:
        raise DefragError(f"node {node_name!r} already has a live defrag job") from None
    if enqueue:
        _enqueue(job)
    return job


def _enqueue(job: DefragJob) -> None:
    from capacity.tasks import defrag_job_run

    transaction.on_commit(lambda: defrag_job_run.delay(job.pk))


# ---- one step --------------------------------------------------------------------------------

def defrag_job_step(*, job: DefragJob, gateway: kube.KubeGateway | None = None,
                    now: datetime | None = None) -> DefragJob:
    """Advance the job by one step from its recorded state; returns the job (saved).

    API failures are recorded on the job and retried on a later step; the time limit
    turns a job that never gets there into `failed`.
    """
    now = now or clock.now()
    gateway = _gateway(job, gateway)
    handler = _HANDLERS.get(job.state)
    if handler is None:
        return job
    try:
        handler(job, gateway, now)
    except KubeError as exc:
        job.error = f"{exc} (retrying)"
        job.next_check_at = now + timedelta(seconds=ERROR_RETRY_SECONDS)
        _append_log(job, f"API error, will retry: {exc}")
        job.save(update_fields=["error", "next_check_at", "log", "updated_at"])
    return job


def _timed_out(job: DefragJob, now: datetime) -> bool:
    return job.started_at is not None and now >= job.started_at + timedelta(seconds=job.timeout_seconds)


def _step_record(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 2: record per revision the initial KPA scale, RS replicas and m, read afresh."""
    report = job.report
    with transaction.atomic():
        for entry in report.get("revisions", []):
            pa = gateway.get(kube.PODAUTOSCALERS, entry["revision"], namespace=entry["namespace"])
            rs = gateway.get(kube.REPLICASETS, entry["replicaset"], namespace=entry["namespace"])
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
        _audit(job, now=now, action="scales_record", target=f"Node/{job.node_name}",
               new={r.revision: {"initial_kpa_scale": r.initial_kpa_scale, "initial_replicas": r.initial_replicas,
                                 "m": r.overprovision} for r in job.revisions.all()})
        job.save(update_fields=["state", "started_at", "updated_at"])


def _step_cordon(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Step 3, as `kubectl cordon` does it."""
    if _timed_out(job, now):
        return _fail(job, gateway, now)
    node = gateway.get(kube.NODES, job.node_name)
    if not (node.get("spec") or {}).get("unschedulable"):
        node = gateway.patch(kube.NODES, job.node_name, {"spec": {"unschedulable": True}}, patch_type="strategic")
        job.cordoned_by_job = True
    elif not job.report.get("unschedulable"):
        job.cordoned_by_job = True  # schedulable at discovery: this job cordoned it before a crash
    message = f"Node {job.node_name} has been cordoned (marked unschedulable)."
    _event(gateway, job, _node_ref(job, node), reason="DefragCordon", message=message, now=now)
    job.state = JobState.CORDONED
    job.error = ""
    _append_log(job, message)
    _commit(job, fields=["state", "cordoned_by_job"], now=now,
            audits=[dict(action="node_cordon", target=f"Node/{job.node_name}",
                         old={"unschedulable": bool(job.report.get("unschedulable"))},
                         new={"unschedulable": True})])


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
               message=f"Orphaned by defrag job #{job.pk} of node {job.node_name}: "
                       f"ReplicaSet {orphan.revision.replicaset} replaces it elsewhere; it keeps serving")
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
    if job.next_check_at and now < job.next_check_at:
        return
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
        revision.satisfied = revision_satisfied(current_kpa_scale=revision.current_kpa_scale,
                                                current_replicas=revision.current_replicas,
                                                initial_replicas=revision.initial_replicas, overprovision=m)
        all_ok &= revision.satisfied
        lines.append(progress_line(revision=revision.revision, overprovision=m,
                                   current_kpa_scale=revision.current_kpa_scale,
                                   current_replicas=revision.current_replicas,
                                   initial_kpa_scale=revision.initial_kpa_scale))
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
    _event(gateway, job, _node_ref(job), reason="DefragSafe" if not blockers else "DefragBlocked",
           message=message, now=now, event_type="Normal" if not blockers else "Warning")
    _commit(job, fields=["state", "safe_at"], now=now,
            audits=[dict(action="job_safe" if not blockers else "job_blocked", target=f"Node/{job.node_name}",
                         new={"blockers": blockers})])


def _fail(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    waiting = [f"{r.namespace}/{r.revision} (scale {r.current_kpa_scale}, needs "
               f"{min(r.initial_replicas, r.current_replicas or r.initial_replicas) + r.overprovision})"
               for r in job.revisions.filter(satisfied=False)]
    message = (f"Timed out after {job.timeout_seconds}s: not safe. Still waiting for: "
               f"{', '.join(waiting) or 'orphaning to finish'}. The node stays cordoned and the orphans keep "
               f"serving until an operator aborts or drains.")
    job.state = JobState.FAILED
    job.error = message
    job.next_check_at = None
    _append_log(job, message)
    _event(gateway, job, _node_ref(job), reason="DefragTimeout", message=message, now=now, event_type="Warning")
    _commit(job, fields=["state"], now=now, audits=[dict(action="job_fail", target=f"Node/{job.node_name}",
                                                         new={"waiting": waiting})])


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

def defrag_job_drain(*, job: DefragJob, actor, delete_node: bool = False, now: datetime | None = None,
                     enqueue: bool = True) -> DefragJob:
    """Ask for the drain of a safe node: its orphans are evicted (PDBs honoured), and
    the Node deleted if asked. Needs the `capacity.drain_defragjob` permission."""
    now = now or clock.now()
    if actor is not None and not actor.has_perm("capacity.drain_defragjob"):
        raise DefragError(f"user {actor} may not drain nodes (needs capacity.drain_defragjob)")
    if job.state == JobState.DRAINING:
        return job
    if job.state != JobState.SAFE:
        raise DefragError(f"job #{job.pk} is {job.state}: only a job that reported the node safe may drain it")
    with transaction.atomic():
        job.state, job.operator, job.delete_node = JobState.DRAINING, actor, delete_node
        _append_log(job, f"Drain requested by {actor or 'CLI'}" + (" (the Node will be deleted)" if delete_node else ""))
        _commit(job, fields=["state", "operator", "delete_node"], now=now, audits=[dict(
            action="drain_request", target=f"Node/{job.node_name}", actor=actor, new={"delete_node": delete_node})])
    if enqueue:
        _enqueue(job)
    return job


def defrag_job_abort(*, job: DefragJob, actor, now: datetime | None = None, enqueue: bool = True) -> DefragJob:
    """Ask for an abort: uncordon, then delete each orphan once its revision is back to its
    wanted scale without it."""
    now = now or clock.now()
    if job.state in (JobState.ABORTING, JobState.ABORTED):
        return job
    if job.state == JobState.DRAINED:
        raise DefragError(f"job #{job.pk} is drained: there is nothing left to abort")
    with transaction.atomic():
        old = job.state
        job.state, job.operator, job.next_check_at = JobState.ABORTING, actor, None
        _append_log(job, f"Abort requested by {actor or 'CLI'}")
        _commit(job, fields=["state", "operator"], now=now, audits=[dict(
            action="abort_request", target=f"Node/{job.node_name}", actor=actor, old={"state": old})])
    if enqueue:
        _enqueue(job)
    return job


def _settle_planned(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Planned pods at drain/abort time: one found orphaned was patched before a crash, so it
    is ours to end; the others were never touched."""
    for orphan in job.orphans.filter(state=OrphanState.PLANNED):
        pod = _get_pod(gateway, orphan)
        orphan.state = OrphanState.ORPHANED if pod is not None and _is_orphaned(pod) else OrphanState.SKIPPED
        _commit(job, orphans=[orphan], now=now)


def _step_abort(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    if job.next_check_at and now < job.next_check_at:
        return
    if job.cordoned_by_job and not job.uncordoned:
        node = gateway.get(kube.NODES, job.node_name)
        if (node.get("spec") or {}).get("unschedulable"):
            gateway.patch(kube.NODES, job.node_name, {"spec": {"unschedulable": False}}, patch_type="strategic")
        job.uncordoned = True
        message = f"Node {job.node_name} uncordoned"
        _event(gateway, job, _node_ref(job, node), reason="DefragAbort", message=message, now=now)
        _append_log(job, message)
        _commit(job, fields=["uncordoned"], now=now, audits=[dict(
            action="node_uncordon", target=f"Node/{job.node_name}", old={"unschedulable": True},
            new={"unschedulable": False})])
    _settle_planned(job, gateway, now)
    waiting = _end_orphans(job, gateway, now, evict=False)
    if waiting:
        job.next_check_at = now + timedelta(seconds=job.poll_interval_seconds)
        _commit(job, now=now)
        return
    job.state, job.finished_at, job.next_check_at = JobState.ABORTED, now, None
    _append_log(job, "Aborted: node uncordoned, every orphan gone")
    _commit(job, fields=["state", "finished_at"], now=now,
            audits=[dict(action="job_abort", target=f"Node/{job.node_name}")])


def _step_drain(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    if job.next_check_at and now < job.next_check_at:
        return
    _settle_planned(job, gateway, now)
    waiting = _end_orphans(job, gateway, now, evict=True)
    if waiting:
        job.next_check_at = now + timedelta(seconds=min(job.poll_interval_seconds, EVICTION_RETRY_SECONDS))
        _commit(job, now=now)
        return
    audits = []
    if job.delete_node:
        try:
            gateway.delete(kube.NODES, job.node_name)
        except NotFound:
            pass  # deleted before a crash, or by someone else: the outcome wanted
        _append_log(job, f"Node {job.node_name} deleted")
        audits.append(dict(action="node_delete", target=f"Node/{job.node_name}"))
    job.state, job.finished_at, job.next_check_at = JobState.DRAINED, now, None
    _append_log(job, f"Node {job.node_name} drained")
    _event(gateway, job, _node_ref(job), reason="DefragDrained", message=f"Node {job.node_name} drained", now=now)
    # IMPORTANT: the node deletion and the final state in one record: a worker dying between
    # two records would redo the (harmless, NotFound) delete and audit it twice.
    _commit(job, fields=["state", "finished_at"], now=now,
            audits=audits + [dict(action="job_drain", target=f"Node/{job.node_name}")])


def _end_orphans(job: DefragJob, gateway: kube.KubeGateway, now: datetime, *, evict: bool) -> int:
    """Evict (drain) or delete (abort) the orphans; returns how many are not gone yet."""
    waiting = 0
    back: dict[int, tuple[int, int]] = {}  # revision id -> (ready without orphans, wanted), read once per pass
    for orphan in job.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).select_related(
            "revision"):
        target = f"Pod/{orphan.namespace}/{orphan.pod_name}"
        pod = _get_pod(gateway, orphan)
        if pod is None:
            orphan.state, orphan.gone_at = OrphanState.GONE, now
            _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} gone")
            _commit(job, orphans=[orphan], now=now, audits=[dict(action="pod_gone", target=target)])
            continue
        waiting += 1
        if orphan.state == OrphanState.DELETING:
            continue  # terminating: wait for its grace period
        if evict:
            message = f"Evicted by defrag job #{job.pk} (drain of {job.node_name})"
        else:
            message = f"Deleted by defrag job #{job.pk} (abort): its revision is back to scale"
        action = "pod_evict" if evict else "pod_delete"
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            # Already terminating: our request went out before a worker died (or someone else
            # deleted it). Record it now; asking again would repeat the side effect.
            pass
        elif evict:
            try:
                gateway.evict(orphan.pod_name, namespace=orphan.namespace)
            except TooManyRequests as exc:
                _append_log(job, f"Eviction of {orphan.namespace}/{orphan.pod_name} refused "
                                 f"(PodDisruptionBudget): retrying in {EVICTION_RETRY_SECONDS:g}s")
                job.error = str(exc)
                continue
            except NotFound:
                continue  # gone meanwhile: seen as gone on the next pass
        else:
            if orphan.revision_id not in back:
                rs = gateway.get(kube.REPLICASETS, orphan.revision.replicaset, namespace=orphan.namespace)
                pods = gateway.list(kube.PODS, namespace=orphan.namespace,
                                    label_selector=f"{REVISION_LABEL}={orphan.revision.revision}")
                back[orphan.revision_id] = (replicaset_ready_pods(pods, replicaset=orphan.revision.replicaset),
                                            _scale((rs.get("spec") or {}).get("replicas")))
            ready, wanted = back[orphan.revision_id]
            if ready < wanted:
                _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} kept: revision "
                                 f"{orphan.revision.revision} has {ready}/{wanted} ready without it")
                continue
            try:
                gateway.delete(kube.PODS, orphan.pod_name, namespace=orphan.namespace, uid=orphan.uid)
            except (NotFound, Conflict):
                continue  # gone (or replaced under the same name) meanwhile
        orphan.state = OrphanState.DELETING
        _event(gateway, job, _pod_ref(orphan), reason="DefragEvict" if evict else "DefragDelete",
               message=message, now=now)
        _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} {'evicted' if evict else 'deleted'}")
        _commit(job, orphans=[orphan], now=now, audits=[dict(action=action, target=target)])
    return waiting


_HANDLERS = {
    JobState.CONFIRMED: _step_record,
    JobState.RECORDED: _step_cordon,
    JobState.CORDONED: _step_orphan,
    JobState.WAITING: _step_wait,
    JobState.DRAINING: _step_drain,
    JobState.ABORTING: _step_abort,
}
