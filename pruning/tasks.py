"""Scheduled pruning: beat fans out one task per cluster that has a Prometheus."""
from __future__ import annotations

import logging

from celery import shared_task

from clusters.errors import KubeError, PrometheusError

log = logging.getLogger(__name__)


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


@shared_task(name="pruning.tasks.prune_cluster", bind=True, max_retries=3, default_retry_delay=30)
def prune_cluster(self, cluster_id: int) -> int | None:
    """One prune run on one cluster with the settings' parameters (dry run unless
    PRUNER_RUN_MODE=scale-down). Unreachable Prometheus or API server: retried."""
    from clusters.kube import gateway_for
    from clusters.models import Cluster
    from config import clock

    from .services import PruneParams, prometheus_for, prune_run_execute

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        log.warning("prune: cluster %s no longer exists", cluster_id)
        return None
    from django.conf import settings

    params = PruneParams.from_settings(run_mode=getattr(settings, "PRUNER_RUN_MODE", "dry-run"))
    try:
        run = prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=prometheus_for(cluster=cluster),
                                params=params, now=clock.now(), cluster=cluster, actor="")
    except PrometheusError as exc:
        if exc.transient:
            raise self.retry(exc=exc)
        raise
    except KubeError as exc:
        if exc.code in (0, 429) or exc.code >= 500:
            raise self.retry(exc=exc)
        raise
    return run.pk
