#!/usr/bin/env python
"""Start the whole product on embedded defaults: `make demo`.

0. checks its ports are free (DEMO_WEB_PORT, DEMO_PROMETHEUS_PORT, DEMO_SIMCLUSTER_PORT)
   and that no other demo runs from the same folder, before touching anything;
1. starts from a clean state — the SQLite database, Prometheus data, the clock offset
   and queued Celery messages of an earlier demo are removed — unless DEMO_KEEP=1;
2. the demo simulated cluster (simcluster/scenarios/demo.yaml, or the scenario file
   DEMO_SCENARIO names, e.g. simcluster/scenarios/demo-initial-scale-1.yaml; real-time clock),
   writing var/kubeconfig;
3. migrations on SQLite (var/db.sqlite3), the demo operator account, the orgs of the
   cluster (sync_orgs);
4. Prometheus scraping the simulated cluster's DCGM exporter (`/metrics`) when the
   `prometheus` binary is installed, so the pruner reads real data; said clearly when not;
5. web (Django on http://127.0.0.1:8000/admin/), two Celery workers (long operations on
   their own) and beat — on Redis
   when one answers at REDIS_URL (default redis://127.0.0.1:6379/0), else on kombu's
   filesystem transport under var/;
6. once the web answers: writes var/demo.env, which `manage.py` uses from any shell
   while the demo runs, and prints the panel's URL, login and what runs, last.

What the processes it starts print (Celery's banners and task lines, runserver's requests,
Prometheus and the simulated cluster) goes to one file each under var/log/ (worker.log,
worker-long.log, beat.log, web.log, prometheus.log, simcluster.log), so the terminal ends
with the start-up summary; a process that exits has its log's last lines printed.

Everything lives under VAR_DIR (default var/). Ctrl-C stops everything and removes
var/demo.env. Needs no root and no services.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent


def _queues():
    """config/queues.py by its path: the package `config` would start the Celery app here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_queues", ROOT / "config" / "queues.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


queues = _queues()

VAR = Path(os.environ.get("VAR_DIR") or ROOT / "var").resolve()
DEMO_ENV = VAR / "demo.env"           # read by manage.py (see its docstring)
CLOCK_OFFSET = VAR / "clock-offset"   # CLOCK_OFFSET_FILE: moved by `manage.py demo_clock`
LOGS = VAR / "log"                    # one file per started process (see the docstring)
PY = sys.executable
LOG_TAIL_LINES = 20   # lines of a log printed when its process exits
OPERATOR = ("operator", "operator-demo")
# Scrape as often as dcgm-exporter is usually scraped; the pruner's window is minutes.
SCRAPE_INTERVAL = "15s"
WEB_ANSWER_SECONDS = 120   # how long the web may take to answer its first request
# What an earlier demo leaves behind and a fresh simulated cluster must not meet.
STATE = ("db.sqlite3", "db.sqlite3-journal", "db.sqlite3-wal", "db.sqlite3-shm", "prometheus",
         "clock-offset", "celery-queue", "celery-processed", "celery-control", "prometheus.yml", "kubeconfig",
         "cache")


class DemoError(Exception):
    """Said on one line, and the demo does not start (or stops)."""


def port_setting(name: str, default: int, *, allow_zero: bool = False) -> int:
    raw = os.environ.get(name, str(default)).strip()
    low = 0 if allow_zero else 1
    if not raw.isdigit() or not low <= int(raw) <= 65535:
        raise DemoError(f"{name}={raw!r} is not a port number ({low}-65535)")
    return int(raw)


def port_free(port: int) -> bool:
    """Would a server bind 127.0.0.1:port? (SO_REUSEADDR as runserver and Prometheus set
    it, so a port left in TIME_WAIT by a stopped demo does not count as taken.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ports_check(ports: list[tuple[str, str, int]]) -> None:
    taken = [f"port {port} ({what}) is in use: free it or set {variable} to another port"
             for what, variable, port in ports if port and not port_free(port)]
    if taken:
        raise DemoError("; ".join(taken))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def demo_env_read() -> dict[str, str]:
    try:
        lines = DEMO_ENV.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def other_demo_check() -> None:
    running = demo_env_read()
    raw_pid = running.get("DEMO_PID", "")
    pid = int(raw_pid) if raw_pid.isdigit() else 0
    if pid and pid != os.getpid() and pid_alive(pid):
        raise DemoError(f"a demo already runs from {VAR} (pid {pid}, panel {running.get('DEMO_URL', '?')}): "
                        "stop it first (Ctrl-C in its shell), or give this one its own VAR_DIR and ports")


def state_clean(keep: bool) -> str:
    if keep:
        return f"DEMO_KEEP=1: kept the database, Prometheus data and clock offset under {VAR}"
    removed = []
    for name in STATE:
        path = VAR / name
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(name)
        elif path.exists():
            path.unlink()
            removed.append(name)
    return (f"fresh state: removed {', '.join(removed)} under {VAR} (DEMO_KEEP=1 keeps them)" if removed
            else f"fresh state under {VAR}")


def redis_answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise DemoError(f"the simulated cluster exited with {proc.returncode} before writing {path}")
        if time.monotonic() > deadline:
            raise DemoError(f"the simulated cluster wrote no {path} within {seconds:.0f}s")
        time.sleep(0.2)


def web_wait(url: str, proc: subprocess.Popen, seconds: float) -> None:
    """Until GET /healthz answers 200 from the web we started."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise DemoError(f"the web server exited with {proc.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(url + "healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise DemoError(f"the web server did not answer at {url} within {seconds:.0f}s")
        time.sleep(0.2)


def cluster_url(kubeconfig: Path) -> str:
    import yaml

    config = yaml.safe_load(kubeconfig.read_text())
    return config["clusters"][0]["cluster"]["server"]


def sim_advance(sim_url: str, seconds: float) -> None:
    request = urllib.request.Request(sim_url.rstrip("/") + "/simcluster/v1/advance",
                                     data=json.dumps({"seconds": seconds}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300):
        pass


def prometheus_config(sim_url: str, web_port: int) -> str:
    """A scrape job for the simulated DCGM exporter (honor_labels keeps the exporter's own
    `pod`/`namespace` labels, the scheme the pruner detects by default), and one for the
    control plane's own /metrics (open with DEBUG on): the GPUs allocated per pool and each
    node's pool, which the savings page's history reads."""
    target = urlparse(sim_url).netloc
    return (f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n"
            "scrape_configs:\n"
            "  - job_name: dcgm-exporter\n"
            "    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
            "  - job_name: gpu-capacity\n"
            "    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{web_port}']\n")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "".join(f"    {line}\n" for line in text.splitlines()[-lines:])


def env_file_write(values: dict[str, str]) -> None:
    tmp = DEMO_ENV.with_suffix(".env.tmp")
    tmp.write_text("# Written by `make demo` while it runs; manage.py uses it when DJANGO_SECRET_KEY is unset.\n"
                   + "".join(f"{key}={value}\n" for key, value in values.items()), encoding="utf-8")
    os.replace(tmp, DEMO_ENV)


def env_file_remove() -> None:
    if demo_env_read().get("DEMO_PID") == str(os.getpid()):
        DEMO_ENV.unlink(missing_ok=True)


def main() -> int:
    started = time.monotonic()
    prometheus = shutil.which("prometheus")
    web_port = port_setting("DEMO_WEB_PORT", 8000)
    prometheus_port = port_setting("DEMO_PROMETHEUS_PORT", 9090)
    sim_port = port_setting("DEMO_SIMCLUSTER_PORT", 0, allow_zero=True)
    keep = os.environ.get("DEMO_KEEP", "") not in ("", "0")
    scenario = os.environ.get("DEMO_SCENARIO") or "simcluster/scenarios/demo.yaml"
    if not (ROOT / scenario).is_file():
        raise DemoError(f"DEMO_SCENARIO: no scenario file {scenario!r} (relative to {ROOT}); "
                        "e.g. simcluster/scenarios/demo-initial-scale-1.yaml")
    # IMPORTANT: before anything is removed or started — a second demo must not harm the first.
    ports_check([("web", "DEMO_WEB_PORT", web_port), ("simulated cluster", "DEMO_SIMCLUSTER_PORT", sim_port)]
                + ([("Prometheus", "DEMO_PROMETHEUS_PORT", prometheus_port)] if prometheus else []))
    VAR.mkdir(parents=True, exist_ok=True)
    other_demo_check()
    DEMO_ENV.unlink(missing_ok=True)
    cleaned = state_clean(keep)
    print(cleaned, flush=True)

    kubeconfig = VAR / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    web_url = f"http://127.0.0.1:{web_port}/"
    # The demo's own settings, whatever the shell holds: its database is wiped at start,
    # so it must never be anyone else's, and its cluster is the simulated one.
    demo = {"DEMO_PID": str(os.getpid()), "DEMO_URL": web_url + "admin/", "DEMO_MODE": "1",
            "DJANGO_DEBUG": "1", "VAR_DIR": str(VAR), "DATABASE_URL": f"sqlite:///{VAR / 'db.sqlite3'}",
            "KUBECONFIG": str(kubeconfig), "KUBE_CONTEXT": "", "KUBE_IN_CLUSTER": "0",
            "CLOCK_OFFSET_FILE": str(CLOCK_OFFSET), "PROMETHEUS_URL": ""}
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    if redis_answers(redis_url):
        demo.update(REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url)
        broker = redis_url
    else:
        # The cache in a folder the web, workers and beat share: the GPU reading the schedule
        # keeps every minute is then the one /metrics exports (the savings page's history).
        demo.update(REDIS_URL="", CELERY_BROKER_URL="filesystem://", CACHE_DIR=str(VAR / "cache"))
        broker = f"filesystem:// under {VAR} (no Redis answered at {redis_url})"
        for folder in ("celery-queue", "celery-processed", "celery-control"):
            (VAR / folder).mkdir(exist_ok=True)
    env = {**os.environ, **demo}

    procs: list[tuple[str, subprocess.Popen]] = []

    LOGS.mkdir(exist_ok=True)

    def start(name: str, *args: str) -> subprocess.Popen:
        # A fresh demo starts each log afresh; DEMO_KEEP=1 appends, as it keeps the rest.
        with open(LOGS / f"{name}.log", "a" if keep else "w", encoding="utf-8") as log:
            proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True,
                                    stdout=log, stderr=subprocess.STDOUT)
        procs.append((name, proc))
        return proc

    def exited(name: str, proc: subprocess.Popen) -> None:
        print(f"{name} exited with {proc.returncode}; the end of {LOGS / (name + '.log')}:\n"
              f"{log_tail(LOGS / (name + '.log'))}", end="", flush=True)

    def stop_all(code: int) -> None:
        env_file_remove()
        for _, proc in reversed(procs):
            if proc.poll() is None:
                # The leader only: a Celery worker stops its own pool (warm shutdown).
                proc.terminate()
        for _, proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        procs.clear()
        sys.exit(code)

    def on_signal(*_):
        stop_all(0)

    def run(*args: str) -> None:
        done = subprocess.run(args, cwd=ROOT, env=env)
        if done.returncode:
            raise DemoError(f"`{' '.join(args[1:])}` failed with exit status {done.returncode}")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sim = start("simcluster", PY, "-m", "simcluster", "serve", "--scenario", scenario,
                    "--speed", "1", "--port", str(sim_port), "--kubeconfig-out", str(kubeconfig))
        wait_for(kubeconfig, sim, 60)
        sim_url = cluster_url(kubeconfig)
        try:
            offset = float(CLOCK_OFFSET.read_text().strip() or 0) if keep and CLOCK_OFFSET.exists() else 0.0
        except ValueError:
            raise DemoError(f"{CLOCK_OFFSET} does not hold a number of seconds; remove it or drop DEMO_KEEP") \
                from None
        if offset > 0:
            # The kept product clock is ahead of wall time: the fresh cluster must be too.
            sim_advance(sim_url, offset)
        manage = [PY, "manage.py"]
        run(*manage, "migrate", "--noinput", "-v0")
        run(*manage, "shell", "--no-imports", "-c", (
            "from django.contrib.auth import get_user_model; U = get_user_model(); "
            f"u = U.objects.filter(username='{OPERATOR[0]}').first() or "
            f"U.objects.create_superuser('{OPERATOR[0]}', 'operator@example.com', '{OPERATOR[1]}')"))
        if prometheus:
            config = VAR / "prometheus.yml"
            config.write_text(prometheus_config(sim_url, web_port))
            env["PROMETHEUS_URL"] = demo["PROMETHEUS_URL"] = f"http://127.0.0.1:{prometheus_port}"
            start("prometheus", prometheus, f"--config.file={config}", f"--storage.tsdb.path={VAR / 'prometheus'}",
                  f"--web.listen-address=127.0.0.1:{prometheus_port}")
            metrics = f"Prometheus {env['PROMETHEUS_URL']} scraping the simulated DCGM exporter and the panel's /metrics"
        else:
            metrics = ("OFF: no `prometheus` binary (apt-get install prometheus); the pruner has no GPU "
                       "data and finds nothing idle")
        subprocess.run([*manage, "sync_orgs"], cwd=ROOT, env=env, check=False)
        if broker == redis_url and not keep:
            # Messages an earlier demo left on Redis (a worker killed with its task
            # unacknowledged) name rows of a database that is gone: a fresh demo starts
            # with its queues empty, as the filesystem broker's are.
            run(PY, "-m", "celery", "-A", "config", "purge", "-f", "-Q", ",".join(queues.ALL + (queues.LEGACY,)))
        web = start("web", *manage, "runserver", f"127.0.0.1:{web_port}", "--noreload")
        # Two workers, not one per queue (config/queues.py): the demo is one cluster on a
        # laptop, where four workers would cost ~400 MB and a slower start for no gain. The
        # long operations (defrag steps, prune runs, binpack writes) get a worker of their
        # own, so they never hold up the sweeps, fan-outs and wakes the other one runs.
        start("worker", PY, "-m", "celery", "-A", "config", "worker", "-l", "info", "--concurrency", "2",
              "-Q", f"{queues.BEAT},{queues.SWEEP},{queues.APPLY},{queues.LEGACY}", "-n", "demo@%h")
        start("worker-long", PY, "-m", "celery", "-A", "config", "worker", "-l", "info", "--concurrency", "1",
              "-Q", queues.LONG, "-n", "demo-long@%h")
        start("beat", PY, "-m", "celery", "-A", "config", "beat", "-l", "info")
        web_wait(web_url, web, WEB_ANSWER_SECONDS)
        env_file_write(demo)
        # Printed last: what runs, where its output goes, and then the URL and login, so the
        # bottom of the terminal holds what the operator needs first.
        print(f"""
  GPU capacity control plane is up (in {time.monotonic() - started:.1f} s).
    running:  {', '.join(name for name, _ in procs)}
    logs:     {LOGS}/<name>.log  (tail -f {LOGS / 'worker.log'})
    cluster:  simulated at {sim_url} (kubectl --kubeconfig {kubeconfig} get pods -A)
    broker:   {broker}
    metrics:  {metrics}
    CLIs:     from any shell: .venv/bin/python manage.py <command>  (uses {DEMO_ENV} while the demo runs)
    controls: manage.py demo_clock advance 25h   manage.py demo_load acme/llama-3-8b busy|idle
    admin:    {web_url}admin/   user {OPERATOR[0]!r}  password {OPERATOR[1]!r}
  Ctrl-C stops everything.
""", flush=True)
        while True:
            for name, proc in procs:
                if proc.poll() is not None:
                    exited(name, proc)
                    print("stopping the rest", flush=True)
                    stop_all(1)
            time.sleep(1)
    except DemoError as exc:
        for name, proc in procs:
            if proc.poll() is not None:
                exited(name, proc)
        print(f"make demo: {exc}", file=sys.stderr, flush=True)
        stop_all(1)
    finally:
        if procs:
            stop_all(1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DemoError as exc:  # before anything started: nothing to stop
        sys.exit(f"make demo: {exc}")
