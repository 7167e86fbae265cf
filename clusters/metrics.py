"""The clusters app's families on /metrics, read from its rows at scrape time
(registered with config/observability.py): whether each cluster's API answered, and when
each periodic schedule (config/schedule.py, installed by this app) last ran."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from config.observability import database_metrics

from clusters.models import Cluster

# django-celery-beat's IntervalSchedule periods, in seconds.
_PERIOD_SECONDS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "microseconds": 1e-6}


@database_metrics
def cluster_api_metrics() -> Iterator[Metric]:
    """API discovery (clusters/discovery.py) reads every cluster's API every few minutes and
    records the last success and the last failure on its row: that record is the fleet's
    reachability, whichever process read it."""
    reachable = GaugeMetricFamily(
        "gpu_capacity_cluster_api_reachable",
        "1 when the last read of the cluster's API discovery succeeded, 0 when it failed or never succeeded.",
        labels=["cluster"])
    seen = GaugeMetricFamily("gpu_capacity_cluster_api_last_success_timestamp_seconds",
                             "When the cluster's API discovery was last read successfully.", labels=["cluster"])
    for name, seen_at, error in Cluster.objects.order_by("name").values_list("name", "api_groups_seen_at",
                                                                             "api_groups_error"):
        reachable.add_metric([name], 1 if seen_at is not None and not error else 0)
        if seen_at is not None:
            seen.add_metric([name], seen_at.timestamp())
    yield reachable
    yield seen


@database_metrics
def periodic_task_metrics() -> Iterator[Metric]:
    """Every enabled interval schedule: when beat last sent it (`PeriodicTask.last_run_at`,
    written as each is sent: CELERY_BEAT_SYNC_EVERY) and its interval, so that a rule can
    ask for a job that has not run within twice its interval. A schedule never sent yet
    counts from its installation (`date_changed`), as django-celery-beat's scheduler does."""
    from django_celery_beat.models import PeriodicTask

    last_run = GaugeMetricFamily(
        "gpu_capacity_periodic_task_last_run_timestamp_seconds",
        "When beat last sent the schedule's task (its installation time if never).", labels=["schedule", "task"])
    interval = GaugeMetricFamily("gpu_capacity_periodic_task_interval_seconds",
                                 "The schedule's interval, as installed or retuned in the admin.",
                                 labels=["schedule", "task"])
    for name, task, ran, changed, every, period in (
            PeriodicTask.objects.filter(enabled=True, interval__isnull=False).order_by("name")
            .values_list("name", "task", "last_run_at", "date_changed", "interval__every", "interval__period")):
        last_run.add_metric([name, task], (ran or changed).timestamp())
        interval.add_metric([name, task], every * _PERIOD_SECONDS.get(period, 1))
    yield last_run
    yield interval
