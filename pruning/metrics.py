"""The pruning app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py)."""
from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, F, Func, IntegerField, Min, Q, Sum
from django.db.models.functions import Coalesce
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from config.observability import database_metrics

from pruning.models import PruneDecision, PruneRun


class _JSONArrayLength(Func):
    """The length of a JSON array column (PostgreSQL's jsonb, SQLite's json)."""
    function = "jsonb_array_length"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, function="json_array_length", **extra)


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

    # A running run's lease (pruning/services.py): past its end the reconcile beat completes
    # the run within its interval; a time long past means the worker died and nothing did.
    lease = GaugeMetricFamily(
        "gpu_capacity_prune_run_lease_takeover_due_timestamp_seconds",
        "Per cluster, the earliest time the lease of a running prune run lapsed (due for the reconcile).",
        labels=["cluster"])
    for row in (PruneRun.objects.filter(status=PruneRun.Status.RUNNING)
                .annotate(due=Coalesce(F("lease_expires_at"), F("started_at")))
                .values("cluster__name").annotate(oldest=Min("due")).order_by()):
        if row["oldest"] is not None:
            lease.add_metric([row["cluster__name"] or ""], row["oldest"].timestamp())
    yield lease

    # What the pruner keeps freed now: the GPUs seen on pods whose owner it scaled to zero,
    # not restored since (the savings page's GPU-hours start from the same rows).
    freed = GaugeMetricFamily(
        "gpu_capacity_prune_gpus_freed",
        "Per cluster, GPUs of pods whose owners the pruner scaled to zero and no restore brought back.",
        labels=["cluster"])
    kept_down = (Q(decision=PruneDecision.Decision.PRUNE, result=PruneDecision.Result.SUCCEEDED)
                 & ~Q(restore__in=(PruneDecision.Restore.RESTORED, PruneDecision.Restore.CHANGED)))
    for row in (PruneDecision.objects.filter(kept_down).values("run__cluster__name")
                .annotate(gpus=Sum(_JSONArrayLength("gpus"))).order_by()):
        freed.add_metric([row["run__cluster__name"] or ""], row["gpus"] or 0)
    yield freed
