"""The GPU map's read: a cluster's fragmentation view, kept a few seconds per cluster.

At 5,000 nodes and 50,000 pods drawing the view means reading the whole cluster (about a
second over the API, most of it decoding JSON; only the GPU nodes and the pods bound to them
are made into views, the rest is let go with its page), and the dashboard reloads itself every few
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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db.models import Max

from clusters import kube
from clusters.errors import KubeError
from clusters.selectors import snapshot_take
from clusters.snapshot import gc_paused

from audit.selectors import entries_filter
from capacity.gpumap.planning import (
    FragmentationView,
    GpuSummary,
    PoolGpus,
    fragmentation_pool,
    fragmentation_view,
    gpu_summary,
    pool_gpus,
)
from capacity.selectors import defrag_jobs_live_by_node

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)

CACHE_PREFIX = "capacity:gpu-view:"
# How much older than CAPACITY_MAP_CACHE_SECONDS a kept reading may still serve the pages
# while its refresh runs in the background. A 5,000-node cluster reads in a few seconds; a
# refresh queued behind other work on its queue may wait longer, but past this the page
# stops waiting for it and reads the cluster itself.
REFRESH_WAIT_SECONDS = 60
T = TypeVar("T")


@dataclass(frozen=True)
class Reading(Generic[T]):
    """What the pages draw from a reading of the cluster, and when it was read (the product's
    clock); for a reading older than the setting, when its refresh was asked for and how the
    last refresh failed (at, error), if it did."""

    value: T
    taken_at: datetime
    refresh_asked_at: datetime | None = None
    refresh_failed: dict | None = None

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
    `CAPACITY_MAP_CACHE_SECONDS` ago, or at most `REFRESH_WAIT_SECONDS` more while a newer
    one is being drawn (see `_recent`). Raises the gateway's errors when the cluster has to
    be read and cannot be."""
    whole = _recent(cluster, now, "view", gateway)
    return replace(whole, value=fragmentation_pool(whole.value, pool)) if pool else whole


def gpu_summary_recent(*, cluster: Cluster, now: datetime,
                       gateway: kube.KubeGateway | None = None) -> Reading[GpuSummary]:
    """The dashboard's totals and best candidates, from the same reading as the GPU map (kept
    apart: a few hundred bytes to load instead of the whole map)."""
    return _recent(cluster, now, "summary", gateway)


def pool_gpus_kept(*, cluster: Cluster) -> Reading[PoolGpus] | None:
    """The GPUs per pool of the cluster's kept reading, whatever its age (it is kept
    `CAPACITY_MAP_CACHE_SECONDS` + `REFRESH_WAIT_SECONDS` at most), or None when none is kept:
    never a read of the cluster (/metrics asks on every scrape)."""
    identity = _identity(cluster)
    kept = _cache_get(_cache_key(identity, "pools"))
    if kept is None or kept.get("cluster") != identity or not isinstance(kept.get("pools"), PoolGpus):
        return None
    return Reading(kept["pools"], kept["taken_at"])


def _drawn_with(cluster: Cluster, identity: str) -> dict:
    """What a reading depends on besides the cluster's API: a kept reading whose values
    differ is not used."""
    held, last_action = _defrag_state(cluster)
    return {"cluster": identity, "held": held, "last_action": last_action,
            "scoring": settings.CAPACITY_SCHEDULER_SCORING}


def _recent(cluster: Cluster, now: datetime, part: str, gateway: kube.KubeGateway | None) -> Reading:
    """A kept reading younger than the setting; else, when the cache is shared with the
    workers, a kept reading up to `REFRESH_WAIT_SECONDS` older than that while one refresh
    of the cluster runs in the background (queued here unless one already is); else the
    cluster read now, by this request."""
    ttl = settings.CAPACITY_MAP_CACHE_SECONDS
    identity = _identity(cluster)
    drawn_with = _drawn_with(cluster, identity)
    if ttl:
        kept = _cache_get(_cache_key(identity, part))
        if kept is not None and all(kept.get(k) == v for k, v in drawn_with.items()):
            age = (now - kept["taken_at"]).total_seconds()
            if 0 <= age < ttl:
                return Reading(kept[part], kept["taken_at"])
            if ttl <= age < ttl + REFRESH_WAIT_SECONDS and read_shared():
                queued_at = _refresh_queue(cluster, identity, now)
                if queued_at is not None:
                    return Reading(kept[part], kept["taken_at"], refresh_asked_at=queued_at,
                                   refresh_failed=_refresh_failure(identity, since=kept["taken_at"]))
    drawn = _draw(cluster, identity, drawn_with, now, gateway)
    return Reading(drawn[part], now)


def _draw(cluster: Cluster, identity: str, drawn_with: dict, now: datetime,
          gateway: kube.KubeGateway | None) -> dict:
    """Read the cluster, draw the map and the totals, keep both; raises the gateway's errors."""
    ttl = settings.CAPACITY_MAP_CACHE_SECONDS
    with gc_paused():   # decoded JSON, views and map rows: many small objects, none cyclic
        snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now, gpu_nodes_only=True)
        drawn = {"view": fragmentation_view(snapshot, held_nodes=drawn_with["held"],
                                            scoring=drawn_with["scoring"])}
        del snapshot
        drawn["summary"] = gpu_summary(drawn["view"])
        drawn["pools"] = pool_gpus(drawn["view"])
        if ttl:
            # Kept past its serving time so that it can serve while the next one is drawn.
            for name, value in drawn.items():
                _cache_set(_cache_key(identity, name), {**drawn_with, "taken_at": now, name: value},
                           ttl + REFRESH_WAIT_SECONDS)
    return drawn


def reading_refresh(*, cluster: Cluster | None, identity: str, now: datetime) -> bool:
    """Draw a new reading of `cluster` for the pages (the background refresh they queued).
    A failure to read the cluster is kept for the pages to show, and the reading they
    serve stays as it was. Lets the next refresh be queued either way. True when drawn."""
    try:
        if cluster is None or _identity(cluster) != identity:
            return False   # the row now points at another API server: its pages read it themselves
        try:
            _draw(cluster, identity, _drawn_with(cluster, identity), now, None)
        except KubeError as exc:
            logger.warning("GPU view of cluster %s not refreshed: %s", cluster.name, exc)
            _cache_set(_cache_key(identity, "failed"), {"at": now, "error": str(exc)},
                       settings.CAPACITY_MAP_CACHE_SECONDS + REFRESH_WAIT_SECONDS)
            return False
        _cache_delete(_cache_key(identity, "failed"))
        return True
    finally:
        _cache_delete(_cache_key(identity, "refresh"))


def read_shared() -> bool:
    """Are readings shared with the workers, so that one drawn in the background serves
    the pages? Not with a process-local cache (no REDIS_URL): the pages read themselves."""
    return not isinstance(caches["default"], (LocMemCache, DummyCache))


def _refresh_queue(cluster: Cluster, identity: str, now: datetime) -> datetime | None:
    """When the refresh of this cluster's reading was asked for: now, queued by this call,
    or earlier by another page (one at a time per cluster). None when it cannot be queued
    (the page reads the cluster itself)."""
    key = _cache_key(identity, "refresh")
    try:
        if cache.add(key, now, timeout=REFRESH_WAIT_SECONDS):
            from capacity.gpumap.tasks import gpu_view_refresh   # tasks import this module

            try:
                gpu_view_refresh.delay(cluster.pk, identity)
            except Exception:
                cache.delete(key)
                raise
            return now
        asked = cache.get(key)
    except Exception as exc:  # noqa: BLE001 - no cache or no broker: read the cluster instead
        logger.warning("GPU view refresh not queued (%s); reading the cluster", exc)
        return None
    return asked if isinstance(asked, datetime) else None


def readings_forget(*, cluster: Cluster) -> None:
    """Drop what is kept of the cluster for its pages (readings, a queued refresh's mark, a
    failure): the next page reads the cluster itself."""
    identity = _identity(cluster)
    for part in ("view", "summary", "pools", "refresh", "failed"):
        _cache_delete(_cache_key(identity, part))


def refresh_forget(*, cluster: Cluster) -> None:
    """Forget that a refresh of the cluster's reading was queued: the next page that finds
    its reading old queues one again."""
    _cache_delete(_cache_key(_identity(cluster), "refresh"))


def _refresh_failure(identity: str, *, since: datetime) -> dict | None:
    """How the last refresh failed, if it did after the reading shown was taken: a failure
    before it (a page has read the cluster itself since) is not the last reading's."""
    failed = _cache_get(_cache_key(identity, "failed"))
    if not failed or not {"at", "error"} <= failed.keys():
        return None
    return failed if isinstance(failed["at"], datetime) and failed["at"] >= since else None


def _cache_delete(key: str) -> None:
    try:
        cache.delete(key)
    except Exception as exc:  # noqa: BLE001 - the lock expires on its own
        logger.warning("GPU view cache unavailable (%s)", exc)


def _cache_get(key: str) -> dict | None:
    try:
        with gc_paused():   # unpickling a 5,000-node map is ~100,000 objects, none cyclic
            kept = cache.get(key)
    except Exception as exc:  # noqa: BLE001 - any cache failure: read the cluster instead
        logger.warning("GPU view cache unavailable (%s); reading the cluster", exc)
        return None
    return kept if isinstance(kept, dict) else None


def _cache_set(key: str, value: dict, timeout: int) -> None:
    try:
        cache.set(key, value, timeout=timeout)   # freshness is checked on read
    except Exception as exc:  # noqa: BLE001 - the page is drawn; only the next one reads again
        logger.warning("GPU view cache unavailable (%s); not kept", exc)
