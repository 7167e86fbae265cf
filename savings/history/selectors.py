"""The GPU history's read: the only place it asks Prometheus, two range queries per page
(allocated per pool, used per pool) through the cluster's Prometheus gateway."""
from __future__ import annotations

from datetime import datetime

from clusters.prometheus import PrometheusGateway

from savings.history.planning import GpuHistory, HistoryWindow, allocated_promql, history_shape, used_promql


def gpu_history(*, prometheus: PrometheusGateway, cluster: str, window: HistoryWindow, now: datetime,
                idle_threshold: float) -> GpuHistory:
    """Per pool of `cluster` (its name in the control plane's metrics), GPUs allocated, used
    and idle on each step of `window` up to `now`. Raises `PrometheusError` when Prometheus
    does not answer or answers something else than series, `HistoryInputError` for a
    threshold that is no fraction."""
    start, end = window.bounds(now)
    step = f"{window.step_seconds}s"
    used_query = used_promql(cluster=cluster, step_seconds=window.step_seconds, idle_threshold=idle_threshold)
    allocated = prometheus.query_range(allocated_promql(cluster=cluster, step_seconds=window.step_seconds),
                                       start=start, end=end, step=step)
    used = prometheus.query_range(used_query, start=start, end=end, step=step)
    return history_shape(cluster=cluster, window=window, start=start, end=end, allocated=allocated, used=used,
                         source=prometheus.url)
