"""Scheduled campaign proposals: beat fans out one task per cluster; each reads its cluster
once and proposes the best campaign of every GPU pool (capacity/campaigns/services.py).

A transient failure (no answer, 5xx, 429) is retried with back-off; a refusal fails the
task with its reason. Either way the pool's last proposal stays, and the pages say its age."""
from __future__ import annotations

from celery import shared_task

from clusters.fanout import cluster_for_task, clusters_fan_out
from config import clock
from config.retries import RetryTransient

from capacity.campaigns.services import campaign_proposals_compute


@shared_task(name="capacity.campaigns.tasks.campaign_proposals_all")
def campaign_proposals_all() -> int:
    return clusters_fan_out(campaign_proposals_cluster)


@shared_task(name="capacity.campaigns.tasks.campaign_proposals_cluster", base=RetryTransient, retry_backoff=30,
             retry_backoff_max=300, max_retries=3)
def campaign_proposals_cluster(cluster_id: int) -> dict | None:
    cluster = cluster_for_task(cluster_id, job="campaign proposals")
    if cluster is None:
        return None
    rows = campaign_proposals_compute(cluster=cluster, now=clock.now())
    return {row.pool: row.freed for row in rows}
