"""The drain of a safe node: its orphans evicted (PodDisruptionBudgets honoured), then the
Node deleted if the operator asked and nothing else is left on it."""
from __future__ import annotations

from datetime import datetime, timedelta

from clusters import kube
from clusters.errors import NotFound
from clusters.snapshot import PodView

from capacity.defrag.models import DefragJob, JobState
from capacity.defrag.planning import blockers_remaining
from capacity.defrag.services.orphans import _end_orphans, _settle_planned, eviction_retry_seconds
from capacity.defrag.services.record import _append_log, _commit, _event, _node_ref


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
