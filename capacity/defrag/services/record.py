"""What every step shares: its record (one compare-and-set UPDATE with its log lines and
audit entries), the Kubernetes Events it posts, and the errors a request or a step raises."""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from datetime import datetime, timezone as dt_timezone

from django.db import transaction
from django.utils import timezone

from audit.services import audit
from clusters import kube
from clusters.errors import AlreadyExists, KubeError, NotFound
from clusters.labels import TEMPLATE_HASH_LABEL
from config.actors import actor_label_current
from config.schedule import SCHEDULES

from capacity.defrag.models import DefragJob, DefragLogLine, DefragOrphan, DefragRevision
from capacity.defrag.planning import log_lines_to_drop, revision_asleep

log = logging.getLogger(__name__)


# How soon the resume beat hands a due job no worker holds to a worker (config/schedule.py).
RESUME_SECONDS = next(p.every_seconds for p in SCHEDULES if p.task == "capacity.tasks.defrag_jobs_resume")
RESUME_PROMISE = f"{RESUME_SECONDS} s"


class DefragError(Exception):
    """A defrag request that cannot be carried out as asked; the message says why."""


class ReturnUnconfirmed(DefragError):
    """A return to service's uncordon was sent and its answer lost: it may have taken effect.
    Its intent stays on the job, and whoever next finds it records what happened."""


class StaleJob(Exception):
    """The job changed in the database since this step loaded it (another step, or a lost
    race): nothing of this step was recorded; re-read and decide again."""


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


def _cause(job: DefragJob) -> str:
    """The cause of the job's acts in the audit trail: the job, its state, and what started it
    when not an operator's own confirmation ("… of campaign #7")."""
    of = f" of {job.report['on_behalf_of']}" if (job.report or {}).get("on_behalf_of") else ""
    return f"defrag job #{job.pk} ({job.state}){of}"


def _audit(job: DefragJob, *, now: datetime, action: str, target: str, old=None, new=None, actor=None,
           cause: str = "") -> None:
    """One step of the job in the audit trail, under the job (subject defrag_job)."""
    actor = actor or job.operator
    # A worker acts for whoever asked: with no panel user, the command that confirmed the job.
    label = None if actor is not None else (actor_label_current() or job.requested_by_label)
    audit(app="defrag", action=action, at=now, actor=actor, cause=cause or _cause(job),
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


def _who(user, label: str) -> str:
    return str(user) if user is not None else (label or "CLI")


def _stamp(at: datetime) -> str:
    return at.astimezone(dt_timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
