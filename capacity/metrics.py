"""The capacity app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py)."""
from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from clusters.selectors import cluster_names
from config.observability import database_metrics

from capacity.defrag.models import DefragJob, JobState


@database_metrics
def defrag_job_metrics() -> Iterator[Metric]:
    jobs = GaugeMetricFamily("gpu_capacity_defrag_jobs", "Defrag jobs by cluster and state.",
                             labels=["cluster", "state"])
    counts = {(row["cluster__name"], row["state"]): row["n"]
              for row in DefragJob.objects.values("cluster__name", "state").annotate(n=Count("id"))}
    for cluster in cluster_names():  # every state of every cluster, zeros included, so rates work
        for state in JobState.values:
            jobs.add_metric([cluster, state], counts.get((cluster, state), 0))
    yield jobs
