"""The orgs app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py)."""
from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clusters.selectors import cluster_names
from config.observability import database_metrics

from orgs.models import DormancySwitch, Org


@database_metrics
def dormancy_metrics() -> Iterator[Metric]:
    switches = CounterMetricFamily("gpu_capacity_dormancy_switches",
                                   "Org dormancy switches by cluster, direction and cause.",
                                   labels=["cluster", "direction", "cause"])
    for row in (DormancySwitch.objects.values("org__cluster__name", "direction", "cause")
                .annotate(n=Count("id"))):
        switches.add_metric([row["org__cluster__name"], row["direction"], row["cause"]], row["n"])
    yield switches

    orgs = GaugeMetricFamily("gpu_capacity_orgs", "Orgs by cluster and dormancy.", labels=["cluster", "state"])
    counts = {(row["cluster__name"], row["dormant"]): row["n"]
              for row in Org.objects.values("cluster__name", "dormant").annotate(n=Count("id"))}
    for cluster in cluster_names():  # both states of every cluster, zeros included
        orgs.add_metric([cluster, "dormant"], counts.get((cluster, True), 0))
        orgs.add_metric([cluster, "active"], counts.get((cluster, False), 0))
    yield orgs


@database_metrics
def scale_to_zero_metrics() -> Iterator[Metric]:
    """Partial applies: orgs whose workloads did not all take the wanted setting. The retry
    (config/schedule.py) applies them again every minute; one that stays partial needs a look."""
    partial = GaugeMetricFamily("gpu_capacity_scale_to_zero_partial_orgs",
                                "Orgs whose last scale-to-zero apply was partial, by cluster.", labels=["cluster"])
    oldest = GaugeMetricFamily(
        "gpu_capacity_scale_to_zero_partial_since_timestamp_seconds",
        "Per cluster, when the oldest partial scale-to-zero apply still partial began.", labels=["cluster"])
    rows = {row["cluster__name"]: row for row in (Org.objects.exclude(pending=[]).values("cluster__name")
                                                  .annotate(n=Count("id"), since=Min("pending_since")).order_by())}
    for cluster in cluster_names():  # zeros included, so "none partial" is a value, not an absence
        row = rows.get(cluster)
        partial.add_metric([cluster], row["n"] if row else 0)
        if row and row["since"] is not None:
            oldest.add_metric([cluster], row["since"].timestamp())
    yield partial
    yield oldest
