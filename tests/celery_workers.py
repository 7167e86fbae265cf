"""Real Celery worker and beat processes for tests, against the test's PostgreSQL database
and a Redis database number of the test's own as broker.

`celery_processes` (a fixture) starts `celery -A config …` subprocesses, each in its own
session so stopping one never touches anything else; they are always stopped at the end
of the test, on failure too. Time is injected through CLOCK_OFFSET_FILE (`.offset_file`):
writing one number moves the workers' and beat's "now".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings

ROOT = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).with_name("celery")
POLL_LIMIT_S = 60.0


@contextmanager
def redis_database_claimed(redis_url: str, *, ttl_seconds: int):
    """A Redis database number (1-15; db 0 holds the tests' caches) that no one else uses
    right now, claimed for at most `ttl_seconds`, emptied after: yields its URL."""
    base = redis_url.rsplit("/", 1)[0]
    start = os.getpid() % 15
    for step in range(15):
        db = 1 + (start + step) % 15
        client = redis.Redis.from_url(f"{base}/{db}")
        if client.dbsize() == 0 and client.set("capacity-test:claim", os.getpid(), nx=True, ex=ttl_seconds):
            break
        client.close()
    else:
        pytest.fail("no free Redis database number (1-15) for a broker")
    try:
        yield f"{base}/{db}"
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def broker_url(redis_url):
    """The worker's broker: a Redis database number of this test's own."""
    with redis_database_claimed(redis_url, ttl_seconds=600) as url:
        yield url


@pytest.fixture
def workers_broker(broker_url):
    """This process queues to the workers' broker too (as the panel does, on commit), with
    the transport options config/settings.py gives a Redis broker: priority lanes 0..9 and
    the visibility timeout."""
    from config.celery import app

    conf = app.conf
    old = conf.broker_url, conf.broker_transport_options
    conf.broker_url = broker_url
    conf.broker_transport_options = {"priority_steps": list(range(10)), "visibility_timeout": 300}
    _forget_connections(app)
    try:
        yield broker_url
    finally:
        conf.broker_url, conf.broker_transport_options = old
        _forget_connections(app)


def _forget_connections(app) -> None:
    """Celery caches its connection and producer pools: drop them so the next message
    goes to the broker now configured (what Celery itself does after a fork)."""
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def database_url() -> str:
    db = django_settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "the worker test runs on PostgreSQL"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def pool_children(pid: int) -> list[int]:
    """A process's children (a prefork worker's pool processes), read from /proc."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":   # a zombie is dead already, only not reaped
                children.append(int(entry.name))
    return children


class Processes:
    def __init__(self, tmp_path: Path, env: dict):
        self.tmp_path, self.env, self.procs = tmp_path, env, {}

    def start(self, name: str, *args: str) -> None:
        log = open(self.tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[name] = (subprocess.Popen([str(CELERY), "-A", "config", *args], cwd=ROOT, env=self.env,
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log)

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-4000:]}" for name in self.procs)

    def check_alive(self) -> None:
        for name, (proc, _) in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"celery {name} exited with {proc.returncode}\n{self.logs()}")

    def pid(self, name: str) -> int:
        return self.procs[name][0].pid

    def kill(self, name: str) -> list[int]:
        """SIGKILL a whole worker by PID, its pool processes too (as a container runtime
        does): nothing runs a clean shutdown. The PIDs killed."""
        proc, log = self.procs.pop(name)
        children = pool_children(proc.pid)
        for pid in [proc.pid, *children]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        log.close()
        return [proc.pid, *children]

    def stop(self) -> None:
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker and nothing else
                proc.wait(timeout=10)
            log.close()
        self.procs = {}


@pytest.fixture
def celery_processes(tmp_path, broker_url):
    offset_file = tmp_path / "clock-offset"
    offset_file.write_text("0")
    env = {key: value for key, value in os.environ.items() if key not in ("KUBECONFIG", "KUBE_CONTEXT")}
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": broker_url,
        "CELERY_BROKER_URL": broker_url,
        "CLOCK_OFFSET_FILE": str(offset_file),
        "CELERY_BEAT_MAX_INTERVAL": "1",   # seconds: beat looks at the (moved) clock every second
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "KUBE_IN_CLUSTER": "0",
        "KUBE_RETRY_BACKOFF": "0.05",
        "KUBE_RETRY_BACKOFF_MAX": "0.5",
        "VAR_DIR": str(tmp_path / "var"),
        "LOG_LEVEL": "INFO",
        # A prefork pool's processes make their temporary folders (pymp-*) here: a worker
        # the test kills cannot remove its own, and none is left in the machine's /tmp.
        "TMPDIR": str(tmp_path / "tmp"),
    })
    (tmp_path / "tmp").mkdir()
    processes = Processes(tmp_path, env)
    processes.offset_file = offset_file
    try:
        yield processes
    finally:
        processes.stop()


def wait_for(predicate, what: str, processes: Processes, limit_s: float = POLL_LIMIT_S):
    """Bounded polling of the real worker and beat (they run on their own)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        processes.check_alive()
        time.sleep(0.2)
    pytest.fail(f"not within {limit_s:.0f} s: {what}\n{processes.logs()}")
