"""The orgs app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py)."""
from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
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
