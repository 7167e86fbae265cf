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
from typing import TYPE_CHECKING, Generic, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max

from clusters import kube
from clusters.selectors import snapshot_take
from clusters.snapshot import gc_paused

from audit.selectors import entries_filter
from capacity.gpumap.planning import (
    FragmentationView,
    GpuSummary,
    fragmentation_pool,
    fragmentation_view,
    gpu_summary,
)
from capacity.selectors import defrag_jobs_live_by_node

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)

CACHE_PREFIX = "capacity:gpu-view:"
T = TypeVar("T")


@dataclass(frozen=True)
class Reading(Generic[T]):
    """What the pages draw from a reading of the cluster, and when it was read (the product's clock)."""

    value: T
    taken_at: datetime

    def age_seconds(self, now: datetime) -> int:
        return max(int((now - self.taken_at).total_seconds()), 0)


def _identity(cluster: Cluster) -> str:
    # The connection as well as the id: a cluster row pointed at another API server is
    # another cluster's data.
    return "|".join(str(v) for v in (cluster.pk, cluster.name, cluster.kubeconfig_path, cluster.kube_context,
                                     cluster.in_cluster))


def _cache_key(identity: str, part: str) -> str:
    return f"{CACHE_PREFIX}{part}:{hashlib.sha256(identity.encode()).hexdigest()}"


def _defrag_state(cluster: Cluster) -> tuple[dict[str, int], int]:
    """What of the database the view depends on: node → live job holding it, and the last
    action any defrag job of the cluster recorded (a cordon, an uncordon, a return)."""
    last = entries_filter(app="defrag", cluster=cluster).aggregate(last=Max("pk"))["last"] or 0
    return defrag_jobs_live_by_node(cluster=cluster), last


def fragmentation_recent(*, cluster: Cluster, now: datetime, pool: str | None = None,
                         gateway: kube.KubeGateway | None = None) -> Reading[FragmentationView]:
    """The GPU map's view of the cluster (one pool's if `pool`), drawn at most
    `CAPACITY_MAP_CACHE_SECONDS` ago. Raises the gateway's errors when the cluster has to
    be read and cannot be."""
    whole = _recent(cluster, now, "view", gateway)
    return Reading(fragmentation_pool(whole.value, pool), whole.taken_at) if pool else whole


def gpu_summary_recent(*, cluster: Cluster, now: datetime,
                       gateway: kube.KubeGateway | None = None) -> Reading[GpuSummary]:
    """The dashboard's totals and best candidates, from the same reading as the GPU map (kept
    apart: a few hundred bytes to load instead of the whole map)."""
    return _recent(cluster, now, "summary", gateway)


def _recent(cluster: Cluster, now: datetime, part: str, gateway: kube.KubeGateway | None) -> Reading:
    ttl = settings.CAPACITY_MAP_CACHE_SECONDS
    identity = _identity(cluster)
    held, last_action = _defrag_state(cluster)
    scoring = settings.CAPACITY_SCHEDULER_SCORING
    drawn_with = {"cluster": identity, "held": held, "last_action": last_action, "scoring": scoring}
    if ttl:
        kept = _cache_get(_cache_key(identity, part))
        if (kept is not None and all(kept.get(k) == v for k, v in drawn_with.items())
                and 0 <= (now - kept["taken_at"]).total_seconds() < ttl):
            return Reading(kept[part], kept["taken_at"])
    with gc_paused():   # decoded JSON, views and map rows: many small objects, none cyclic
        snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now)
        drawn = {"view": fragmentation_view(snapshot, held_nodes=held, scoring=scoring)}
        drawn["summary"] = gpu_summary(drawn["view"])
    if ttl:
        for name, value in drawn.items():
            _cache_set(_cache_key(identity, name), {**drawn_with, "taken_at": now, name: value}, ttl)
    return Reading(drawn[part], now)


def _cache_get(key: str) -> dict | None:
    try:
        with gc_paused():   # unpickling a 5,000-node map is ~100,000 objects, none cyclic
            kept = cache.get(key)
    except Exception as exc:  # noqa: BLE001 - any cache failure: read the cluster instead
        logger.warning("GPU view cache unavailable (%s); reading the cluster", exc)
        return None
    return kept if isinstance(kept, dict) else None


def _cache_set(key: str, value: dict, ttl: int) -> None:
    try:
        cache.set(key, value, timeout=ttl + 5)   # freshness is checked on read
    except Exception as exc:  # noqa: BLE001 - the page is drawn; only the next one reads again
        logger.warning("GPU view cache unavailable (%s); not kept", exc)
