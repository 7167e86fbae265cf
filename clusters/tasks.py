"""Celery tasks of the cluster registry: thin calls into services."""
from __future__ import annotations

from celery import shared_task

from clusters import discovery
from clusters.selectors import cluster_find, clusters_all
from config import clock


@shared_task
def discovery_refresh_all() -> int:
    """Every 5 minutes: one discovery task per cluster (queue `sweep`), so a cluster that
    answers slowly delays no other's. The number of clusters queued."""
    ids = list(clusters_all().values_list("pk", flat=True))
    for pk in ids:
        discovery_refresh_cluster.delay(pk)
    return len(ids)


@shared_task
def discovery_refresh_cluster(cluster_id: int) -> list[str] | None:
    """Read which of the product's API groups the cluster serves (see clusters.discovery):
    the groups, or None when they could not be read (the row records why)."""
    cluster = cluster_find(pk=cluster_id)
    if cluster is None:
        return None
    served = discovery.cluster_discovery_refresh(cluster=cluster, now=clock.now())
    return sorted(served.groups) if served.known else None
