"""Celery tasks of the cluster registry: thin calls into services."""
from __future__ import annotations

from celery import shared_task

from clusters import discovery
from clusters.models import Cluster
from config import clock


@shared_task
def discovery_refresh_all() -> dict:
    """Read which of the product's API groups each cluster serves (see clusters.discovery)."""
    now = clock.now()
    found = {}
    for cluster in Cluster.objects.all():
        served = discovery.cluster_discovery_refresh(cluster=cluster, now=now)
        found[cluster.name] = sorted(served.groups) if served.known else None
    return found
