"""The control plane's own metrics: `/metrics` in the Prometheus text format.

Four sources, merged at scrape time:

* process counters kept by prometheus-client: Kubernetes API calls and errors by
  cluster, verb and resource (`clusters.kube` counts them on every request), and Celery
  task durations (the `task_prerun`/`task_postrun` signals below);
* `DatabaseCollector`, which reads the database when scraped: defrag jobs by state, prune
  decisions and actions, prune runs, dormancy switches, orgs dormant or active. Those
  facts live in rows written by any process (web, worker, beat), so the database is the
  one place that knows them all; aggregate queries keep a scrape cheap at any size. Each
  app declares the families of its own rows in its `metrics.py` (`capacity/metrics.py`,
  `orgs/metrics.py`, `pruning/metrics.py`) with `@database_metrics`; those modules are
  found the way Django finds `admin.py`, so this module knows no app's models;
* `BrokerCollector`, which asks the Celery broker at scrape time how many messages wait
  in each queue (config/queues.py): one length read per queue, under a short timeout, so
  a broker that hangs costs a scrape at most that long and shows as
  `gpu_capacity_broker_scrape_ok 0`;
* with `PROMETHEUS_MULTIPROC_DIR` set (prometheus-client's multiprocess mode, needed
  for gunicorn workers or a prefork Celery pool), the counters of every process
  sharing that directory.

A Celery worker serves its own process counters on `CELERY_METRICS_PORT` when set.

Access: with `METRICS_TOKEN` set, `/metrics` wants `Authorization: Bearer <token>`;
without it, `/metrics` is open only when DEBUG is on (the demo) and 403 otherwise.
"""
from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from typing import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

# Celery task run time, seconds; buckets from a quick reconcile to a long defrag step.
TASK_DURATION = Histogram(
    "gpu_capacity_task_duration_seconds", "Run time of Celery tasks, by task name and final state.",
    ["task", "state"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
_task_started: dict[str, float] = {}
_task_started_lock = threading.Lock()


# --- Celery signals -----------------------------------------------------------------------
def _task_prerun(task_id=None, task=None, **_) -> None:
    with _task_started_lock:
        _task_started[task_id] = time.perf_counter()


def _task_postrun(task_id=None, task=None, state=None, **_) -> None:
    with _task_started_lock:
        started = _task_started.pop(task_id, None)
    if started is None:
        return
    name = getattr(task, "name", None) or "unknown"
    TASK_DURATION.labels(task=name, state=state or "UNKNOWN").observe(time.perf_counter() - started)


def _worker_metrics_server(**_) -> None:
    """Serve this worker's counters on CELERY_METRICS_PORT (unset: no server)."""
    from django.conf import settings

    port = settings.CELERY_METRICS_PORT  # a port number, checked when the settings load
    if port is None:
        return
    from prometheus_client import start_http_server

    start_http_server(port, addr=settings.CELERY_METRICS_ADDR, registry=_process_registry())
    log.info("worker metrics on port %s", port)


def _worker_process_shutdown(pid=None, **_) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


def connect_celery_signals() -> None:
    """Wire the task-duration histogram and the worker's metrics server (idempotent)."""
    from celery import signals

    signals.task_prerun.connect(_task_prerun, weak=False, dispatch_uid="gpu_capacity_task_prerun")
    signals.task_postrun.connect(_task_postrun, weak=False, dispatch_uid="gpu_capacity_task_postrun")
    signals.worker_ready.connect(_worker_metrics_server, weak=False, dispatch_uid="gpu_capacity_worker_metrics")
    signals.worker_process_shutdown.connect(_worker_process_shutdown, weak=False,
                                            dispatch_uid="gpu_capacity_worker_process_shutdown")


# --- what the database knows --------------------------------------------------------------
MetricsSource = Callable[[], Iterable[Metric]]
# Every app's database families, by the source's dotted name (registering twice is harmless).
_database_sources: dict[str, MetricsSource] = {}
_discovered = False
_discover_lock = threading.Lock()


def database_metrics(source: MetricsSource) -> MetricsSource:
    """Register `source` (used as a decorator in an app's `metrics.py`): a function that
    reads the app's own rows at scrape time and returns its metric families."""
    _database_sources[f"{source.__module__}.{source.__qualname__}"] = source
    return source


def _discover_sources() -> None:
    """Import every installed app's `metrics` module once, which registers its sources."""
    global _discovered
    if _discovered:
        return
    with _discover_lock:
        if not _discovered:
            from django.utils.module_loading import autodiscover_modules

            autodiscover_modules("metrics")
            _discovered = True


class DatabaseCollector:
    """Gauges and counters read from the database at scrape time (no state in the process)."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpu_capacity_database_scrape_ok",
                               "1 when the database answered the metrics queries of this scrape.")
        try:
            _discover_sources()
            families = [family for source in list(_database_sources.values()) for family in source()]
        except Exception as exc:  # noqa: BLE001 - a scrape reports the failure, never 500s
            log.warning("metrics: database queries failed: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families


# --- what the broker holds -----------------------------------------------------------------
# Seconds a scrape waits for the broker (connect, and each read) before reporting it down:
# Prometheus' own scrape timeout is 10 s by default, and the database queries share it.
BROKER_TIMEOUT_SECONDS = 1.0


def queue_lengths(*, timeout: float = BROKER_TIMEOUT_SECONDS) -> dict[str, int]:
    """Messages waiting (not yet taken by a worker) in each queue the product declares.

    kombu's declare answers with the queue's size without writing anything on Redis (all
    priority lanes summed, one round trip per queue); the passive form would refuse a queue
    Redis dropped when it emptied."""
    from config import queues
    from config.celery import app

    options = {**(app.conf.broker_transport_options or {}),
               "socket_timeout": timeout, "socket_connect_timeout": timeout}
    with app.connection_for_read(transport_options=options, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, interval_max=0, timeout=timeout)
        channel = conn.default_channel
        return {name: channel.queue_declare(queue=name).message_count for name in (*queues.ALL, queues.LEGACY)}


class BrokerCollector:
    """Queue lengths read from the broker at scrape time (no state in the process)."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpu_capacity_broker_scrape_ok",
                               "1 when the broker answered the queue-length reads of this scrape.")
        try:
            lengths = queue_lengths()
        except Exception as exc:  # noqa: BLE001 - a scrape reports the failure, never 500s
            log.warning("metrics: broker queue lengths not read: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        family = GaugeMetricFamily("gpu_capacity_queue_messages",
                                   "Messages waiting in each Celery queue, not yet taken by a worker.",
                                   labels=["queue"])
        for name, length in lengths.items():
            family.add_metric([name], length)
        yield family


# --- exposition -----------------------------------------------------------------------------
def _process_registry():
    """This process's counters, or every process's in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


class _Merged:
    def __init__(self, *sources):
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()


def metrics_text() -> bytes:
    """The whole exposition: process (or multiprocess) counters, then the database's and
    the broker's."""
    return generate_latest(_Merged(_process_registry(), DatabaseCollector(), BrokerCollector()))


def bearer_token_ok(request) -> bool:
    """The request carries `Authorization: Bearer <METRICS_TOKEN>` (compared in constant time)."""
    from django.conf import settings

    expected = settings.METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, given = header.partition(" ")
    return bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                               expected.encode())


def metrics_view(request):
    from django.conf import settings
    from django.http import HttpResponse

    if request.method not in ("GET", "HEAD"):
        return HttpResponse("method not allowed\n", status=405, content_type="text/plain")
    if settings.METRICS_TOKEN:
        if not bearer_token_ok(request):
            response = HttpResponse("a valid bearer token is required (METRICS_TOKEN)\n", status=401,
                                    content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    elif not settings.DEBUG:
        return HttpResponse("metrics are disabled: set METRICS_TOKEN (or DJANGO_DEBUG=1 for a demo)\n",
                            status=403, content_type="text/plain")
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
