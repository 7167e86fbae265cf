"""Scheduled binpack: beat fans out one task per cluster; each task runs one service (the
cost writes, and the check of the nodes they marked that savings counts).

A transient failure (no answer, 5xx, 429) is retried with back-off; a refusal (403, 404,
422) fails the task with its reason, recorded on the run (config.retries)."""
from __future__ import annotations

from celery import shared_task

from capacity.binpack.freed_services import binpack_freed_nodes_check
from capacity.binpack.services import pod_deletion_costs_apply
from clusters.fanout import cluster_for_task, clusters_fan_out
from config.retries import RetryTransient


@shared_task(name="capacity.binpack.tasks.binpack_all_clusters")
def binpack_all_clusters() -> int:
    return clusters_fan_out(binpack_cluster)


@shared_task(name="capacity.binpack.tasks.binpack_cluster", base=RetryTransient, retry_backoff=30,
             retry_backoff_max=300, max_retries=3)
def binpack_cluster(cluster_id: int) -> dict | None:
    cluster = cluster_for_task(cluster_id, job="binpack")
    if cluster is None:
        return None
    # The service first settles the cluster's runs interrupted mid-write (their process died)
    # and the writes of earlier runs whose answer was lost.
    run, _ = pod_deletion_costs_apply(cluster=cluster, actor=None)
    return {"run": run.pk, "settled": [r.pk for r in run.settled], "planned": run.planned, "written": run.written,
            "stale": run.stale, "unknown": run.unknown, "errors": len(run.errors)}


@shared_task(name="capacity.binpack.tasks.binpack_freed_check_all_clusters")
def binpack_freed_check_all_clusters() -> int:
    return clusters_fan_out(binpack_freed_check_cluster)


@shared_task(name="capacity.binpack.tasks.binpack_freed_check_cluster", base=RetryTransient, retry_backoff=30,
             retry_backoff_max=300, max_retries=3)
def binpack_freed_check_cluster(cluster_id: int) -> dict | None:
    cluster = cluster_for_task(cluster_id, job="binpack freed nodes check")
    if cluster is None:
        return None
    check = binpack_freed_nodes_check(cluster=cluster)
    if check is None:
        return {"read": False}
    return {"read": True, "freed": [s.mark.node for s in check.start], "ended": len(check.end),
            "still_free": len(check.seen), "waiting": check.waiting}
