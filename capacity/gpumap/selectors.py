"""The GPU map's read: a cluster's fragmentation view, kept a few seconds per cluster.

At 5,000 nodes and 50,000 pods drawing the view means reading the whole cluster (about a
second over the API, most of it decoding JSON), and the dashboard reloads itself every few
seconds for everyone who has it open. A person reading where the GPUs are accepts data a
few seconds old when the page says how old it is, so one drawing serves every page of that
cluster for `CAPACITY_MAP_CACHE_SECONDS` (Django's cache: Redis in production, so all web
processes share it).

A kept view is used only for the cluster it was drawn from (the key and the stored value
both carry the cluster's id and connection), only while the live defrag jobs of the cluster
and their last recorded action are the ones it was drawn with (an operator's own cordon,
job start or return to service shows at once), and only while younger than the setting by
the product's clock. The views' permission check runs before any of this.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max

from clusters import kube
from clusters.selectors import snapshot_take
from clusters.snapshot import gc_paused

from audit.selectors import entries_filter
from capacity.gpumap.planning import FragmentationView, fragmentation_pool, fragmentation_view
from capacity.selectors import defrag_jobs_live_by_node

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)

CACHE_PREFIX = "capacity:gpu-view:"


@dataclass(frozen=True)
class ClusterView:
    """A fragmentation view and when the cluster was read for it (the product's clock)."""

    view: FragmentationView
    taken_at: datetime

    def age_seconds(self, now: datetime) -> int:
        return max(int((now - self.taken_at).total_seconds()), 0)


def _identity(cluster: Cluster) -> str:
    # The connection as well as the id: a cluster row pointed at another API server is
    # another cluster's data.
    return "|".join(str(v) for v in (cluster.pk, cluster.name, cluster.kubeconfig_path, cluster.kube_context,
                                     cluster.in_cluster))


def _cache_key(identity: str) -> str:
    return CACHE_PREFIX + hashlib.sha256(identity.encode()).hexdigest()


def _defrag_state(cluster: Cluster) -> tuple[dict[str, int], int]:
    """What of the database the view depends on: node → live job holding it, and the last
    action any defrag job of the cluster recorded (a cordon, an uncordon, a return)."""
    last = entries_filter(app="defrag", cluster=cluster).aggregate(last=Max("pk"))["last"] or 0
    return defrag_jobs_live_by_node(cluster=cluster), last


def fragmentation_recent(*, cluster: Cluster, now: datetime, pool: str | None = None,
                         gateway: kube.KubeGateway | None = None) -> ClusterView:
    """The cluster's fragmentation view (one pool's if `pool`), drawn at most
    `CAPACITY_MAP_CACHE_SECONDS` ago, with the time it was drawn. Raises the gateway's
    errors when the cluster has to be read and cannot be."""
    ttl = settings.CAPACITY_MAP_CACHE_SECONDS
    identity = _identity(cluster)
    held, last_action = _defrag_state(cluster)
    kept = _cache_get(identity) if ttl else None
    if (kept is not None and kept.get("cluster") == identity and kept.get("held") == held
            and kept.get("last_action") == last_action and 0 <= (now - kept["taken_at"]).total_seconds() < ttl):
        whole = ClusterView(view=kept["view"], taken_at=kept["taken_at"])
    else:
        with gc_paused():   # decoded JSON, views and map rows: many small objects, none cyclic
            snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now)
            whole = ClusterView(view=fragmentation_view(snapshot, held_nodes=held, scoring=settings.CAPACITY_SCHEDULER_SCORING),
                                taken_at=now)
        if ttl:
            _cache_set(identity, {"cluster": identity, "held": held, "last_action": last_action,
                                  "taken_at": now, "view": whole.view}, ttl)
    if pool:
        return ClusterView(view=fragmentation_pool(whole.view, pool), taken_at=whole.taken_at)
    return whole


def _cache_get(identity: str) -> dict | None:
    try:
        kept = cache.get(_cache_key(identity))
    except Exception as exc:  # noqa: BLE001 - any cache failure: read the cluster instead
        logger.warning("GPU view cache unavailable (%s); reading the cluster", exc)
        return None
    return kept if isinstance(kept, dict) else None


def _cache_set(identity: str, value: dict, ttl: int) -> None:
    try:
        cache.set(_cache_key(identity), value, timeout=ttl + 5)   # freshness is checked on read
    except Exception as exc:  # noqa: BLE001 - the page is drawn; only the next one reads again
        logger.warning("GPU view cache unavailable (%s); not kept", exc)
