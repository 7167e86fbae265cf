"""Scheduled pruning: beat fans out one task per cluster that has a Prometheus, completes
runs whose worker died, and expires old skip rows."""
from __future__ import annotations

import logging

from celery import shared_task

from config.retries import RetryTransient

log = logging.getLogger(__name__)


@shared_task(name="pruning.tasks.prune_all_clusters")
def prune_all_clusters() -> int:
    """Enqueue `prune_cluster` for every cluster with a Prometheus URL (or the default one)."""
    from django.conf import settings

    from clusters.selectors import clusters_all

    ids = [c.pk for c in clusters_all()
           if c.prometheus_url or (settings.PROMETHEUS_URL and c.name == settings.DEFAULT_CLUSTER_NAME)]
    for pk in ids:
        prune_cluster.delay(pk)
    return len(ids)


@shared_task(name="pruning.tasks.prune_cluster", base=RetryTransient, retry_backoff=30, retry_backoff_max=600,
             max_retries=3)
def prune_cluster(cluster_id: int) -> int | None:
    """One prune run on one cluster with the settings' parameters (dry run unless
    PRUNER_RUN_MODE=scale-down). A transient failure (no answer, timeout, 5xx, 429) is
    retried with back-off; a refusal (403, 404, 422, a bad query) fails with its reason
    (config.retries); each attempt's run records which it was."""
    from django.conf import settings

    from clusters.kube import gateway_for
    from clusters.selectors import cluster_find
    from config import clock

    from .services import PruneParams, prometheus_for, prune_run_execute

    from .models import PruneRun

    cluster = cluster_find(pk=cluster_id)
    if cluster is None:
        log.warning("prune: cluster %s no longer exists", cluster_id)
        return None
    # One run acts on a cluster at a time. A run still `running` holds its lease, or lost its
    # worker and waits for the reconcile to settle what it was doing (an `acting` scale-down
    # is settled from the cluster): a second run now could scale the same owner down again
    # and have both counted. This pass is skipped; the next scheduled one runs.
    busy = (PruneRun.objects.filter(cluster=cluster, status=PruneRun.Status.RUNNING)
            .values_list("pk", flat=True).first())
    if busy is not None:
        log.warning("prune: cluster %s: run %s is still running or being completed; this pass is skipped",
                    cluster.name, busy)
        return None
    params = PruneParams.from_settings(run_mode=getattr(settings, "PRUNER_RUN_MODE", "dry-run"))
    run = prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=prometheus_for(cluster=cluster),
                            params=params, now=clock.now(), cluster=cluster, actor="")
    return run.pk


@shared_task(name="pruning.tasks.prune_runs_reconcile")
def prune_runs_reconcile() -> dict:
    """Complete runs whose worker died (lease lapsed) from the cluster's real state."""
    from config import clock

    from .services import prune_runs_reconcile as reconcile

    report = reconcile(now=clock.now())
    return {"completed": report.runs_completed, "failed": report.runs_failed,
            "pending": report.runs_pending, "settled": report.decisions_settled}


@shared_task(name="pruning.tasks.prune_skip_rows_expire")
def prune_skip_rows_expire() -> int:
    """Delete skip rows older than PRUNER_SKIP_RETENTION_DAYS (runs keep their counts)."""
    from datetime import timedelta

    from django.conf import settings

    from config import clock

    from .services import prune_skip_rows_expire as expire

    return expire(now=clock.now(), retention=timedelta(days=settings.PRUNER_SKIP_RETENTION_DAYS))
