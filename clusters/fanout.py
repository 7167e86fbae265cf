"""The shape every periodic job of the product shares: beat fires one task that queues one
task per cluster (so one slow cluster delays no other's), and each per-cluster task finds
its cluster again, which may have been removed or retired in between. Used by the apps' tasks only."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from clusters.selectors import cluster_find, clusters_all

if TYPE_CHECKING:
    from celery import Task

    from clusters.models import Cluster

log = logging.getLogger(__name__)


def clusters_fan_out(task: Task, cluster_ids: Iterable[int] | None = None) -> int:
    """Queue `task(cluster_id)` once per cluster (every cluster in service unless given the
    ids); the number queued."""
    ids = list(clusters_all().values_list("pk", flat=True) if cluster_ids is None else cluster_ids)
    for pk in ids:
        task.delay(pk)
    return len(ids)


def cluster_for_task(cluster_id: int, *, job: str) -> Cluster | None:
    """The cluster a queued per-cluster task is for, or None (logged, naming the job) when it
    was removed or retired after the task was queued."""
    cluster = cluster_find(pk=cluster_id)
    if cluster is None:
        log.warning("%s: cluster %s no longer exists or was retired", job, cluster_id)
    return cluster
