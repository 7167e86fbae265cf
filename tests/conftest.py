"""Shared test infrastructure: real PostgreSQL, real Redis, simulated clusters.

- The Django test database is PostgreSQL: `TEST_DATABASE_URL` (default
  postgres://postgres@127.0.0.1:5432/gpu_capacity), else a private server started here
  (`tests/pgserver.py`: its own data directory, as the `postgres` user when run as root). When neither works the run fails with CI=true; outside
  CI it falls back to SQLite with a warning. Each pytest process gets its own test
  database name, so engineers running tests side by side do not collide.
- Redis: `TEST_REDIS_URL` (default redis://127.0.0.1:6379/0), else one started with
  pytest-redis' executor; same CI rule. `redis_cache` points Django's cache at it with a
  key prefix unique to the test.
- `sim_cluster_factory(scenario)` starts a simulated cluster (manual clock) from YAML
  text, a file path or a list of dicts, registers a `Cluster` row for its kubeconfig and
  returns a handle with `.cluster`, `.gateway`, `.url`, `.control` and `.advance(s)`;
  `sim_cluster` is one built from the `scenario` marker or the default scenario below.
"""
from __future__ import annotations

import itertools
import os
import shutil
import socket
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpu_capacity")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unavailable(what: str, why: str) -> None:
    message = f"{what} is not reachable and could not be started: {why}"
    if IN_CI:
        pytest.exit(f"CI=true: {message}", returncode=3)
    warnings.warn(message, stacklevel=2)


# --- PostgreSQL ---------------------------------------------------------------------------------
def _pg_reachable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url.replace("postgres://", "postgresql://", 1), dbname="postgres", connect_timeout=2):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def postgres_url() -> str | None:
    """A reachable PostgreSQL server URL, started here when none runs."""
    if _pg_reachable(PG_URL):
        return PG_URL
    from tests.pgserver import PostgresUnavailable, start_private_postgres

    try:
        server = start_private_postgres(port=_free_port())
    except PostgresUnavailable as exc:
        _unavailable("PostgreSQL", str(exc))
        return None
    pytest.postgres_server = server  # stopped at session end
    return server.url("gpu_capacity")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(postgres_url) -> None:
    """Point the Django test database at PostgreSQL before pytest-django creates it."""
    if not postgres_url:
        return
    import environ
    from django.conf import settings
    from django.db import connections

    config = environ.Env.db_url_config(postgres_url)
    default = settings.DATABASES["default"]
    default.update(config)
    # One test database per pytest process: engineers share this machine's PostgreSQL.
    default.setdefault("TEST", {})["NAME"] = f"test_{config['NAME']}_{os.getpid()}"
    connections.configure_settings(settings.DATABASES)
    try:
        connections["default"].close()
        del connections["default"]
    except Exception:  # noqa: BLE001 - not opened yet
        pass


def pytest_sessionfinish(session, exitstatus) -> None:
    server = getattr(pytest, "postgres_server", None)
    if server is not None:
        server.stop()
    executor = getattr(pytest, "redis_executor", None)
    if executor is not None:
        executor.stop()


# --- Redis ---------------------------------------------------------------------------------------
def _redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    if _redis_reachable(REDIS_URL):
        return REDIS_URL
    server = shutil.which("redis-server")
    if server:
        from pytest_redis.executor import RedisExecutor

        port = _free_port()
        # 16 databases, as Redis ships: the worker tests take their brokers from db 1-15.
        executor = RedisExecutor(executable=server, databases=16, redis_timeout=30, loglevel="warning",
                                 host="127.0.0.1", port=port, startup_timeout=30,
                                 datadir=tmp_path_factory.mktemp("redis"))
        try:
            executor.start()
            pytest.redis_executor = executor
            return f"redis://127.0.0.1:{port}/0"
        except Exception as exc:  # noqa: BLE001
            why = repr(exc)
    else:
        why = "no redis-server found (make test installs it)"
    if IN_CI:
        pytest.exit(f"CI=true: Redis is not reachable and could not be started: {why}", returncode=3)
    pytest.fail(f"Redis is not reachable and could not be started: {why}")


_prefixes = itertools.count()


@pytest.fixture
def redis_cache(settings, redis_url) -> str:
    """Django's cache on the real Redis, with a key prefix of this test's own."""
    prefix = f"t{os.getpid()}-{next(_prefixes)}"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": redis_url, "KEY_PREFIX": prefix,
                                   "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}}
    return prefix


@pytest.fixture(scope="session", autouse=True)
def _celery_in_memory():
    """Tasks queued by in-process tests go to an in-memory broker, never to var/ or Redis
    (the real worker+beat test starts its own processes with their own broker)."""
    from config.celery import app

    app.conf.broker_url = "memory://"
    app.conf.broker_transport_options = {}
    yield


@pytest.fixture
def celery_eager():
    """Run tasks in the caller (with transaction=True tests, on_commit fires at commit)."""
    from config.celery import app

    old = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, False
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = old


# --- simulated clusters ----------------------------------------------------------------------------
DEFAULT_SCENARIO = """
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-1
  labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
status:
  capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
  allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
"""


@dataclass
class SimClusterHandle:
    """A running simulated cluster registered as a `Cluster` row."""

    url: str
    kubeconfig_path: str
    cluster: Any
    control: Any
    server: Any = None

    @property
    def gateway(self):
        from clusters.kube import gateway_for

        return gateway_for(self.cluster)

    def advance(self, seconds: float = 0) -> Any:
        """Move the simulated clock; controllers react (advance(0): react to the last writes)."""
        return self.control.advance(seconds)

    @property
    def sim(self):
        return getattr(self.server, "sim", None)


@pytest.fixture
def sim_cluster_factory(db, tmp_path):
    """`make(scenario, name="default", **options)` → SimClusterHandle; stopped at test end."""
    from clusters.kube import forget_gateways
    from clusters.models import Cluster
    from simcluster.control import SimControl
    from simcluster.testing import ClusterServer

    stack = ExitStack()
    counter = itertools.count()

    def make(scenario: Any = DEFAULT_SCENARIO, *, name: str | None = None, **options) -> SimClusterHandle:
        index = next(counter)
        kubeconfig = tmp_path / f"kubeconfig-{index}"
        server = ClusterServer(scenario, kubeconfig_out=str(kubeconfig), **options)  # manual clock unless speed=
        server.start()
        stack.callback(server.stop)
        url = server.url
        cluster_name = name or ("default" if index == 0 else f"sim-{index}")
        cluster, _ = Cluster.objects.update_or_create(
            name=cluster_name, defaults={"kubeconfig_path": str(kubeconfig), "kube_context": "", "in_cluster": False})
        return SimClusterHandle(url=url, kubeconfig_path=str(kubeconfig), cluster=cluster, control=SimControl(url),
                                server=server)

    yield make
    forget_gateways()
    stack.close()


@pytest.fixture
def sim_cluster(request, sim_cluster_factory) -> SimClusterHandle:
    """A simulated cluster from `@pytest.mark.scenario(yaml_or_path)`, else DEFAULT_SCENARIO."""
    marker = request.node.get_closest_marker("scenario")
    scenario = marker.args[0] if marker else DEFAULT_SCENARIO
    return sim_cluster_factory(scenario)


def pytest_addoption(parser) -> None:
    parser.addoption("--all-tiers", action="store_true", dest="all_tiers",
                     help="also run tests/realcluster and tests/image (root; build the real tier and the "
                          "image first, as make test does)")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "scenario(yaml): the scenario the sim_cluster fixture starts")


@pytest.fixture(autouse=True)
def _fresh_gateway_retry_settings(settings) -> None:
    """Keep gateway backoffs short in tests (failures are injected, not waited out)."""
    settings.KUBE_RETRY_BACKOFF = 0.01
    settings.KUBE_RETRY_BACKOFF_MAX = 0.05
    settings.KUBE_RETRY_ATTEMPTS = 5
    # The environment's KUBECONFIG must not leak a default cluster into tests.
    settings.KUBECONFIG = ""
    settings.KUBE_IN_CLUSTER = False





def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `slow` (a minute or more: real workers killed, the chaos scenarios, the
    demo) go first, so that in a parallel run they start at once instead of being handed to
    a process near the end and keeping the whole run waiting for them alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
