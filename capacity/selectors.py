"""Reads for defrag jobs and runbook actions (the GPU map reads through capacity/gpumap/selectors.py)."""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from audit.selectors import entries_filter

from capacity.defrag.models import LIVE_STATES, DefragJob
from capacity.runbook.models import RunbookAction

if TYPE_CHECKING:
    from clusters.models import Cluster


def node_without_gpus(*, cluster: Cluster, node_name: str) -> str:
    """Why `node_name` is no node to defrag when it has no GPU (no allocatable
    nvidia.com/gpu): a CPU node's pods hold no GPU, and its report would list them as
    "0x unknown GPUs". "" for a GPU node, or one that cannot be read (the defrag report
    says why then)."""
    from clusters import kube
    from clusters.errors import KubeError
    from clusters.snapshot import NodeView

    try:
        node = NodeView.from_object(kube.gateway_for(cluster).get(kube.NODES, node_name))
    except KubeError:
        return ""
    if node.gpus_allocatable > 0:
        return ""
    return (f"node {node_name!r} has no GPUs (no allocatable nvidia.com/gpu): defrag empties GPU nodes, "
            f"so there is nothing to defrag on it; nothing was done")


def defrag_jobs_live_by_node(*, cluster: Cluster) -> dict[str, int]:
    """node name → id of the live job holding it."""
    return dict(DefragJob.objects.filter(cluster=cluster, state__in=LIVE_STATES).values_list("node_name", "pk"))


def defrag_job_live_for_node(*, cluster: Cluster, node_name: str) -> DefragJob | None:
    return DefragJob.objects.filter(cluster=cluster, node_name=node_name, state__in=LIVE_STATES).first()


def defrag_jobs_newest_by_node(*, cluster: Cluster) -> dict[str, DefragJob]:
    """node name → the newest defrag job that touched it (live or finished): who holds, or
    last held, a cordoned node."""
    newest: dict[str, DefragJob] = {}
    for job in DefragJob.objects.filter(cluster=cluster).order_by("node_name", "-created_at", "-pk"):
        newest.setdefault(job.node_name, job)
    return newest


def defrag_job_progress(*, job: DefragJob) -> dict:
    """What the admin page polls while the job runs."""
    return {
        "id": job.pk,
        "cluster": job.cluster.name,
        "node": job.node_name,
        "state": job.state,
        "state_display": job.get_state_display(),
        "live": job.is_live,
        "error": job.error,
        "log": job.log,
        "log_seq": job.log_seq,
        "abort_requested": job.abort_requested_at is not None,
        "abort_pending": job.abort_pending,
        "drain_pending": bool(job.drain_requested_at) and job.state == "safe",
        "abort_choice": job.abort_choice or "wait",
        "abort_deadline_at": job.abort_deadline_at.isoformat() if job.abort_deadline_at else None,
        # When a worker looks at the job next (an abort-stuck job's next check of its orphans).
        "next_check_at": job.next_check_at.isoformat() if job.next_check_at else None,
        "lease_owner": job.lease_owner,
        "heartbeat_at": job.heartbeat_at.isoformat() if job.heartbeat_at else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "safe_at": job.safe_at.isoformat() if job.safe_at else None,
        "revisions": [{"namespace": r.namespace, "revision": r.revision, "initial_kpa_scale": r.initial_kpa_scale,
                       "initial_replicas": r.initial_replicas, "m": r.overprovision,
                       "current_kpa_scale": r.current_kpa_scale, "current_replicas": r.current_replicas,
                       "satisfied": r.satisfied} for r in job.revisions.all()],
        "orphans": [{"namespace": o.namespace, "pod": o.pod_name, "uid": o.uid, "state": o.state, "gpus": o.gpus}
                    for o in job.orphans.all()],
    }


def defrag_drains(*, cluster: Cluster, until: datetime) -> list[dict]:
    """Nodes defrag jobs drained, oldest first: node, job_id, drained_at, returned_at (the first
    return to service recorded on any job of the node after the drain, else None) and
    gpus_moved (GPUs of the pods the job found on the node)."""
    from capacity.defrag.models import JobState

    returns: dict[str, list[datetime]] = {}
    for target, at in (entries_filter(app="defrag", cluster=cluster, action="node_return_to_service", at__lte=until)
                       .values_list("target", "at")):
        returns.setdefault(target.removeprefix("Node/"), []).append(at)
    drains = []
    for job in (DefragJob.objects.filter(cluster=cluster, state=JobState.DRAINED, finished_at__isnull=False,
                                         finished_at__lte=until).order_by("finished_at", "pk")):
        returned = next((at for at in returns.get(job.node_name, ()) if at >= job.finished_at), None)
        moved = sum(int(p.get("gpus") or 0) for p in (job.report or {}).get("pods", ()))
        drains.append({"node": job.node_name, "job_id": job.pk, "drained_at": job.finished_at,
                       "returned_at": returned, "gpus_moved": moved})
    return drains


def clusters_with_lapsed_runbook_actions(*, now: datetime) -> list[int]:
    """Ids of clusters holding a runbook action left `acting` past its lease (its process died)."""
    return list(RunbookAction.objects.filter(state=RunbookAction.State.ACTING, acting_expires_at__lt=now)
                .order_by().values_list("cluster_id", flat=True).distinct())
