"""The job's forward steps: take up a request, record the scales, cordon, orphan the model
pods, wait until each revision serves enough without them, then safe, blocked or failed."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.errors import Conflict, Invalid, KubeError, NotFound
from clusters.labels import TEMPLATE_HASH_LABEL
from clusters.snapshot import PodView

from capacity.defrag.models import AbortChoice, DefragJob, DefragOrphan, DefragRevision, JobState, OrphanState
from capacity.defrag.planning import (
    Role,
    asleep_line,
    blockers_remaining,
    orphan_patch,
    progress_line,
    revision_asleep,
    revision_satisfied,
)
from capacity.defrag.selectors import defrag_revision_orphan_names
from capacity.defrag.services.record import (
    _append_log,
    _commit,
    _desired_scale,
    _event,
    _get_pod,
    _is_orphaned,
    _node_ref,
    _pod_ref,
    _scale,
)


SAFE_MESSAGE = "Safe to defrag/remove node"


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
                                     orphans=defrag_revision_orphan_names(revision=revision)))
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
