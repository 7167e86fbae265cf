"""Reads for defrag jobs and the GPU map."""
from __future__ import annotations

from datetime import datetime

from clusters import kube
from clusters.models import Cluster
from clusters.snapshot import snapshot_take

from capacity.models import LIVE_STATES, DefragJob
from capacity.planning import FragmentationView, fragmentation_view


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


def fragmentation_for(*, cluster: Cluster, now: datetime, pool: str | None = None,
                      gateway: kube.KubeGateway | None = None) -> FragmentationView:
    """The GPU map of a cluster: 2 API calls (nodes, pods) however big the cluster."""
    snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now)
    return fragmentation_view(snapshot, held_nodes=defrag_jobs_live_by_node(cluster=cluster), pool=pool)


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
