"""The pruning app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py)."""
from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Sum
from prometheus_client.core import CounterMetricFamily, Metric

from config.observability import database_metrics

from pruning.models import PruneDecision, PruneRun


@database_metrics
def prune_metrics() -> Iterator[Metric]:
    runs = CounterMetricFamily("gpu_capacity_prune_runs", "Prune runs by cluster, mode and outcome.",
                               labels=["cluster", "mode", "status"])
    for row in PruneRun.objects.values("cluster__name", "mode", "status").annotate(n=Count("id")):
        runs.add_metric([row["cluster__name"] or "", row["mode"], row["status"]], row["n"])
    yield runs

    decisions = CounterMetricFamily(
        "gpu_capacity_prune_decisions",
        "Prune decisions by cluster, decision (prune/skip) and action result "
        "(none, dry-run, succeeded, failed).",
        labels=["cluster", "decision", "result"])
    # A skip row stands for `count` pods of its run: count pods, not rows.
    for row in (PruneDecision.objects.values("run__cluster__name", "decision", "result")
                .annotate(n=Sum("count"))):
        decisions.add_metric([row["run__cluster__name"] or "", row["decision"], row["result"] or "none"],
                             row["n"])
    yield decisions
