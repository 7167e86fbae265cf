"""The capacity app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py). One aggregate query per family."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Case, Count, DateTimeField, DurationField, ExpressionWrapper, F, Func, Min, When
from django.db.models.functions import Coalesce, Greatest
from prometheus_client.core import GaugeMetricFamily, Metric

from clusters.selectors import cluster_names, clusters_all
from config.observability import database_metrics

from capacity.binpack.models import BinpackRun
from capacity.defrag.models import RUNNING_STATES, DefragJob, JobState
from capacity.gpumap.selectors import pool_gpus_kept
from capacity.runbook.models import RunbookAction

class _Seconds(Func):
    """A whole number of seconds as a duration: an interval on PostgreSQL, microseconds on
    SQLite (how Django stores a duration there), so that a datetime plus it compares."""
    output_field = DurationField()
    template = "(%(expressions)s * INTERVAL '1 second')"

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="(%(expressions)s * 1000000)", **extra)


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


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

    # When each acting job should have left its state at the latest: a job confirmed to
    # waiting fails at its time limit (counted from its first side effect, or from its
    # confirmation: services._timed_out); an abort turns abort-stuck at its deadline. A drain
    # has no limit of its own (it retries evictions a PodDisruptionBudget refuses, as kubectl
    # drain does): one still draining the job's time limit after the operator asked is
    # counted as overdue, since a human must look at that budget. A step runs at the job's
    # next check, so a check due after the limit moves the limit there.
    began = Coalesce(F("started_at"), F("created_at"))
    limit = _Seconds("timeout_seconds")
    deadline = Case(
        When(state__in=(JobState.CONFIRMED, JobState.RECORDED, JobState.CORDONED, JobState.WAITING),
             then=ExpressionWrapper(began + limit, output_field=DateTimeField())),
        When(state=JobState.ABORTING, then=Coalesce(F("abort_deadline_at"), F("abort_requested_at"))),
        When(state=JobState.DRAINING,
             then=ExpressionWrapper(Coalesce(F("drain_requested_at"), began) + limit, output_field=DateTimeField())),
        output_field=DateTimeField())
    overdue = GaugeMetricFamily(
        "gpu_capacity_defrag_job_overdue_since_timestamp_seconds",
        "Per cluster, the earliest time an acting defrag job (confirmed to waiting, draining, aborting) should "
        "have left its state by: its time limit, the abort deadline, or its next check when later. A time long "
        "past means a job no worker is stepping.",
        labels=["cluster"])
    rows = (DefragJob.objects.filter(state__in=RUNNING_STATES)
            .annotate(due=Greatest(deadline, Coalesce(F("next_check_at"), deadline)))
            .values("cluster__name").annotate(oldest=Min("due")).order_by())
    for row in rows:
        if row["oldest"] is not None:
            overdue.add_metric([row["cluster__name"]], _epoch(row["oldest"]))
    yield overdue


@database_metrics
def lease_metrics() -> Iterator[Metric]:
    """Leases a process holds while it writes to a cluster (docs/architecture.md, "Writes
    that survive a killed process"): per kind and cluster, the earliest time one of them
    became free for a takeover. Past it, the beat that settles that kind takes it within its
    interval; a time long past means the holder died and nothing took its work over."""
    family = GaugeMetricFamily(
        "gpu_capacity_lease_takeover_due_timestamp_seconds",
        "Per kind (defrag_job, binpack_run, runbook_action) and cluster, the earliest time a held lease lapsed "
        "and its work became due for a takeover (for a defrag job: its lease's end or its next check, "
        "whichever is later).",
        labels=["kind", "cluster"])
    lapsed = Coalesce(F("lease_expires_at"), F("updated_at"))
    defrag = (DefragJob.objects.filter(state__in=RUNNING_STATES).exclude(lease_owner="")
              .annotate(due=Greatest(lapsed, Coalesce(F("next_check_at"), lapsed)))
              .values("cluster__name").annotate(oldest=Min("due")).order_by())
    binpack = (BinpackRun.objects.filter(state=BinpackRun.State.WRITING)
               .annotate(due=Coalesce(F("lease_expires_at"), F("started_at")))
               .values("cluster__name").annotate(oldest=Min("due")).order_by())
    runbook = (RunbookAction.objects.filter(state=RunbookAction.State.ACTING)
               .annotate(due=Coalesce(F("acting_expires_at"), F("at")))
               .values("cluster__name").annotate(oldest=Min("due")).order_by())
    for kind, rows in (("defrag_job", defrag), ("binpack_run", binpack), ("runbook_action", runbook)):
        for row in rows:
            if row["oldest"] is not None:
                family.add_metric([kind, row["cluster__name"] or ""], _epoch(row["oldest"]))
    yield family


@database_metrics
def pool_gpu_metrics() -> Iterator[Metric]:
    """GPUs per node pool from the reading the dashboard and the GPU map keep of each cluster
    (capacity/gpumap/selectors.py), never from a read of the cluster: a scrape every few
    seconds must not list every pod. A cluster with no kept reading exports nothing (no
    series, not a 0 it does not know); the GPU history and the Grafana panel show the gap."""
    gpus = GaugeMetricFamily(
        "gpu_capacity_pool_gpus",
        "GPUs per cluster, node pool and GPU product: allocatable (the nodes' nvidia.com/gpu) and allocated "
        "(requested by the live pods bound to them), from the control plane's last reading of the cluster.",
        labels=["cluster", "pool", "gpu_product", "state"])
    nodes = GaugeMetricFamily(
        "gpu_capacity_node_pool_info",
        "1 for each GPU node of the last reading, naming its node pool (joins per-node series such as DCGM's, "
        "by node name, to pools).",
        labels=["cluster", "node", "pool"])
    taken = GaugeMetricFamily(
        "gpu_capacity_gpu_reading_timestamp_seconds",
        "When the reading behind gpu_capacity_pool_gpus and gpu_capacity_node_pool_info was taken.",
        labels=["cluster"])
    for cluster in clusters_all():
        reading = pool_gpus_kept(cluster=cluster)
        if reading is None:
            continue
        taken.add_metric([cluster.name], reading.taken_at.timestamp())
        for (pool, product), (allocatable, allocated) in reading.value.gpus.items():
            gpus.add_metric([cluster.name, pool, product, "allocatable"], allocatable)
            gpus.add_metric([cluster.name, pool, product, "allocated"], allocated)
        for node, pool in reading.value.node_pools.items():
            nodes.add_metric([cluster.name, node, pool], 1)
    yield gpus
    yield nodes
    yield taken
