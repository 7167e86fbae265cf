"""Celery tasks of the cluster registry: thin calls into services."""
from __future__ import annotations

from celery import shared_task

from clusters import discovery
from clusters.fanout import cluster_for_task, clusters_fan_out
from config import clock


@shared_task
def discovery_refresh_all() -> int:
    """Every 5 minutes: one discovery task per cluster (queue `sweep`), so a cluster that
    answers slowly delays no other's. The number of clusters queued."""
    return clusters_fan_out(discovery_refresh_cluster)


@shared_task
def discovery_refresh_cluster(cluster_id: int) -> list[str] | None:
    """Read which of the product's API groups the cluster serves (see clusters.discovery):
    the groups, or None when they could not be read (the row records why)."""
    cluster = cluster_for_task(cluster_id, job="discovery")
    if cluster is None:
        return None
    served = discovery.cluster_discovery_refresh(cluster=cluster, now=clock.now())
    return sorted(served.groups) if served.known else None
