"""The GPU map's background refresh: a page that finds its cluster's kept reading older than
`CAPACITY_MAP_CACHE_SECONDS` serves it (saying how old it is) and queues this task, one at
a time per cluster, so that only a cluster's very first viewer waits for the cluster.

The schedule also keeps each cluster's reading young when no page asks (`gpu_readings_keep`):
the GPUs per pool the product exports on /metrics come from that reading, and the savings
page's history of allocated GPUs would otherwise have gaps wherever no one looked.

No retries: a failed refresh is kept for the pages to show, and the next page view (or the
next scheduled keep) queues the next one."""
from __future__ import annotations

from celery import shared_task

import logging

from clusters.errors import KubeError
from clusters.fanout import cluster_for_task, clusters_fan_out
from clusters.selectors import cluster_find
from config import clock

from capacity.gpumap.selectors import gpu_summary_recent, reading_refresh

log = logging.getLogger(__name__)


@shared_task(name="capacity.gpumap.tasks.gpu_view_refresh")
def gpu_view_refresh(cluster_id: int, identity: str) -> bool:
    """Draw a new reading of the cluster for the GPU map and the dashboard; `identity`
    names the connection the page saw (a row since pointed elsewhere is not read)."""
    cluster = cluster_find(pk=cluster_id)
    return reading_refresh(cluster=cluster, identity=identity, now=clock.now())


@shared_task(name="capacity.gpumap.tasks.gpu_readings_keep")
def gpu_readings_keep() -> int:
    """Every minute (config/schedule.py): one task per cluster that keeps its reading young."""
    return clusters_fan_out(gpu_reading_keep)


@shared_task(name="capacity.gpumap.tasks.gpu_reading_keep")
def gpu_reading_keep(cluster_id: int) -> bool:
    """The cluster's reading as a page would get it: nothing is read when a page (or the last
    keep) read it less than `CAPACITY_MAP_CACHE_SECONDS` ago; else it is read now. False when
    the cluster could not be read (the pages show that failure, and /metrics exports nothing
    for the cluster rather than a stale or false value)."""
    cluster = cluster_for_task(cluster_id, job="GPU reading keep")
    if cluster is None:
        return False
    try:
        gpu_summary_recent(cluster=cluster, now=clock.now())
    except KubeError as exc:
        log.warning("GPU reading of cluster %s not kept: %s", cluster.name, exc)
        return False
    return True
