"""Scheduled pruning: beat fans out one task per cluster that has a Prometheus, completes
runs whose worker died, and expires old skip rows."""
from __future__ import annotations

import logging
import random

from celery import shared_task

from clusters.errors import KubeError, PrometheusError, is_transient

log = logging.getLogger(__name__)

RETRY_BASE_SECONDS = 30   # first retry of a transient failure; doubles per attempt
RETRY_MAX_SECONDS = 600   # never wait longer than this between attempts


def retry_countdown(retries: int) -> float:
    """Capped exponential back-off with full jitter, so retrying workers do not march in step."""
    return random.uniform(0, min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** retries))


@shared_task(name="pruning.tasks.prune_all_clusters")
def prune_all_clusters() -> int:
    """Enqueue `prune_cluster` for every cluster with a Prometheus URL (or the default one)."""
    from django.conf import settings

    from clusters.models import Cluster

    ids = [c.pk for c in Cluster.objects.all()
           if c.prometheus_url or (settings.PROMETHEUS_URL and c.name == settings.DEFAULT_CLUSTER_NAME)]
    for pk in ids:
        prune_cluster.delay(pk)
    return len(ids)


@shared_task(name="pruning.tasks.prune_cluster", bind=True, max_retries=3)
def prune_cluster(self, cluster_id: int) -> int | None:
    """One prune run on one cluster with the settings' parameters (dry run unless
    PRUNER_RUN_MODE=scale-down). A transient failure (no answer, timeout, 5xx, 429) is
    retried with back-off; a refusal (403, 404, 422, a bad query) fails with its reason."""
    from django.conf import settings

    from clusters.kube import gateway_for
    from clusters.models import Cluster
    from config import clock

    from .services import PruneParams, prometheus_for, prune_run_execute

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        log.warning("prune: cluster %s no longer exists", cluster_id)
        return None
    params = PruneParams.from_settings(run_mode=getattr(settings, "PRUNER_RUN_MODE", "dry-run"))
    try:
        run = prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=prometheus_for(cluster=cluster),
                                params=params, now=clock.now(), cluster=cluster, actor="")
    except (PrometheusError, KubeError) as exc:
        if is_transient(exc):
            raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from None
        log.error("prune of cluster %s refused, not retried: %s", cluster.name, exc)
        raise
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
