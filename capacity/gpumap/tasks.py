"""The GPU map's background refresh: a page that finds its cluster's kept reading older than
`CAPACITY_MAP_CACHE_SECONDS` serves it (saying how old it is) and queues this task, one at
a time per cluster, so that only a cluster's very first viewer waits for the cluster.

No retries: a failed refresh is kept for the pages to show, and the next page view queues
the next one."""
from __future__ import annotations

from celery import shared_task

from clusters.selectors import cluster_find
from config import clock

from capacity.gpumap.selectors import reading_refresh


@shared_task(name="capacity.gpumap.tasks.gpu_view_refresh")
def gpu_view_refresh(cluster_id: int, identity: str) -> bool:
    """Draw a new reading of the cluster for the GPU map and the dashboard; `identity`
    names the connection the page saw (a row since pointed elsewhere is not read)."""
    cluster = cluster_find(pk=cluster_id)
    return reading_refresh(cluster=cluster, identity=identity, now=clock.now())
