"""Undoing a job: the node's cordon (the job's own only), its orphans once their revisions
are back to scale, the abort that cannot finish (abort-stuck) and its later checks."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from clusters import kube
from clusters.errors import NotFound
from clusters.labels import REVISION_LABEL
from clusters.selectors import snapshot_take

from capacity.defrag.models import AbortChoice, DefragJob, DefragOrphan, JobState, OrphanState
from capacity.defrag.planning import (
    abort_recheck_counts_line,
    abort_recheck_line,
    abort_stuck_message,
    abort_terminating_message,
    pod_serving,
)
from capacity.defrag.selectors import defrag_job_stuck_counts_said, defrag_jobs_holding_nodes
from capacity.defrag.services.orphans import _end_orphans, _settle_planned
from capacity.defrag.services.record import RESUME_SECONDS, _append_log, _commit, _event, _log_drop, _node_ref


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
        said, counts = defrag_job_stuck_counts_said(job=job), _stuck_counts(ending.kept)
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
                if pod_serving(pod):
                    continue
                why = next((c.get("message") or c.get("reason") or "" for c in status.get("conditions") or ()
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
                entry["pending"].append((f"{orphan.namespace}/{meta.get('name')}", why))
    holders = defrag_jobs_holding_nodes(job=job)
    cordoned = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if not node.unschedulable or node.name == job.node_name:
            continue
        used = sum(p.gpus for p in snapshot.pods_on(node.name) if p.phase in ("Pending", "Running")
                   and not p.terminating)
        free = max(node.gpus_allocatable - used, 0)
        if free <= 0:
            continue
        holder = (f"defrag job #{holders[node.name][0]} ({holders[node.name][1]})" if node.name in holders
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
