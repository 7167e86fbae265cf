"""Scheduled registry sync: one task per cluster. It first settles the runbook actions a
dead process left `acting` past their lease, from what the cluster shows, then syncs.

A transient failure (no answer, 5xx, 429) is retried with back-off; a refusal (403, 404,
422) fails the task with its reason (config.retries)."""
from __future__ import annotations

from celery import shared_task

from capacity.runbook.services import registry_sync, runbook_actions_settle
from capacity.selectors import clusters_with_lapsed_runbook_actions
from clusters.fanout import cluster_for_task, clusters_fan_out
from config import clock
from config.retries import RetryTransient


@shared_task(name="capacity.runbook.tasks.registry_sync_all_clusters")
def registry_sync_all_clusters() -> int:
    return clusters_fan_out(registry_sync_cluster)


@shared_task(name="capacity.runbook.tasks.registry_sync_cluster", base=RetryTransient, retry_backoff=30,
             retry_backoff_max=600, max_retries=3)
def registry_sync_cluster(cluster_id: int) -> int | None:
    cluster = cluster_for_task(cluster_id, job="registry sync")
    if cluster is None:
        return None
    # IMPORTANT: settle before the sync, so a model a settled delete removed is seen gone.
    runbook_actions_settle(cluster=cluster)
    return len(registry_sync(cluster=cluster))


@shared_task(name="capacity.runbook.tasks.runbook_actions_settle_all")
def runbook_actions_settle_all() -> int:
    """Queue a settle for each cluster holding a runbook action whose process died (its
    `acting` lease lapsed); one indexed query when there is none."""
    return clusters_fan_out(runbook_actions_settle_cluster,
                            clusters_with_lapsed_runbook_actions(now=clock.now()))


@shared_task(name="capacity.runbook.tasks.runbook_actions_settle_cluster", base=RetryTransient, retry_backoff=10,
             retry_backoff_max=120, max_retries=3)
def runbook_actions_settle_cluster(cluster_id: int) -> int | None:
    cluster = cluster_for_task(cluster_id, job="runbook settle")
    if cluster is None:
        return None
    return len(runbook_actions_settle(cluster=cluster))
