#!/usr/bin/env python
"""Start the whole product on embedded defaults: `make demo`.

1. the demo simulated cluster (simcluster/scenarios/demo.yaml, real-time clock),
   writing var/kubeconfig;
2. migrations on SQLite (var/db.sqlite3), the demo operator account, the orgs of the
   cluster (sync_orgs);
3. web (Django on http://127.0.0.1:8000/admin/), a Celery worker and beat — on Redis
   when one answers at REDIS_URL (default redis://127.0.0.1:6379/0), else on kombu's
   filesystem transport under var/;
4. Prometheus scraping the simulated cluster's DCGM exporter (`/metrics`) when the
   `prometheus` binary is installed, so the pruner reads real data; said clearly when not.

Ctrl-C stops everything. Needs no root and no services.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PY = sys.executable
OPERATOR = ("operator", "operator-demo")
WEB_PORT = int(os.environ.get("DEMO_WEB_PORT", "8000"))
PROMETHEUS_PORT = int(os.environ.get("DEMO_PROMETHEUS_PORT", "9090"))
# Scrape as often as dcgm-exporter is usually scraped; the pruner's window is minutes.
SCRAPE_INTERVAL = "15s"


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
            sys.exit(f"the simulated cluster exited with {proc.returncode} before writing {path}")
        if time.monotonic() > deadline:
            sys.exit(f"the simulated cluster wrote no {path} within {seconds:.0f}s")
        time.sleep(0.2)


def cluster_url(kubeconfig: Path) -> str:
    import yaml

    config = yaml.safe_load(kubeconfig.read_text())
    return config["clusters"][0]["cluster"]["server"]


def prometheus_config(sim_url: str) -> str:
    """A scrape job for the simulated DCGM exporter; honor_labels keeps the exporter's
    own `pod`/`namespace` labels, the scheme the pruner detects by default."""
    target = urlparse(sim_url).netloc
    return (f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n"
            "scrape_configs:\n"
            "  - job_name: dcgm-exporter\n"
            "    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['{target}']\n")


def main() -> None:
    VAR.mkdir(exist_ok=True)
    kubeconfig = VAR / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    env = dict(os.environ)
    env.setdefault("DJANGO_DEBUG", "1")
    env["KUBECONFIG"] = str(kubeconfig)
    redis_url = env.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(redis_url):
        env["REDIS_URL"] = redis_url
        broker = redis_url
    else:
        env["REDIS_URL"] = ""
        env.setdefault("CELERY_BROKER_URL", "filesystem://")
        broker = "filesystem:// under var/ (no Redis answered at " + redis_url + ")"
        for folder in ("celery-queue", "celery-processed"):
            (VAR / folder).mkdir(exist_ok=True)

    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True)
        procs.append((name, proc))
        return proc

    def stop_all(*_):
        for name, proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    try:
        sim = start("simcluster", PY, "-m", "simcluster", "serve", "--scenario", "simcluster/scenarios/demo.yaml",
                    "--speed", "1", "--port", "0", "--kubeconfig-out", str(kubeconfig))
        wait_for(kubeconfig, sim, 60)
        manage = [PY, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run([*manage, "shell", "-c", (
            "from django.contrib.auth import get_user_model; U = get_user_model(); "
            f"u = U.objects.filter(username='{OPERATOR[0]}').first() or "
            f"U.objects.create_superuser('{OPERATOR[0]}', 'operator@example.com', '{OPERATOR[1]}')")],
            cwd=ROOT, env=env, check=True)
        prometheus = shutil.which("prometheus")
        if prometheus:
            config = VAR / "prometheus.yml"
            config.write_text(prometheus_config(cluster_url(kubeconfig)))
            env["PROMETHEUS_URL"] = f"http://127.0.0.1:{PROMETHEUS_PORT}"
            start("prometheus", prometheus, f"--config.file={config}", f"--storage.tsdb.path={VAR / 'prometheus'}",
                  f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}")
            metrics = f"Prometheus {env['PROMETHEUS_URL']} scraping the simulated DCGM exporter"
        else:
            metrics = ("OFF: no `prometheus` binary (apt-get install prometheus); the pruner has no GPU "
                       "data and finds nothing idle")
        subprocess.run([*manage, "sync_orgs"], cwd=ROOT, env=env, check=False)
        start("web", *manage, "runserver", f"127.0.0.1:{WEB_PORT}", "--noreload")
        start("worker", PY, "-m", "celery", "-A", "config", "worker", "-l", "info", "--concurrency", "2")
        start("beat", PY, "-m", "celery", "-A", "config", "beat", "-l", "info")
        print(f"""
  GPU capacity control plane is up.
    admin:    http://127.0.0.1:{WEB_PORT}/admin/   user {OPERATOR[0]!r}  password {OPERATOR[1]!r}
    cluster:  simulated, kubeconfig {kubeconfig}  (kubectl --kubeconfig {kubeconfig} get pods -A)
    broker:   {broker}
    metrics:  {metrics}
  Ctrl-C stops everything.
""", flush=True)
        while True:
            for name, proc in procs:
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; stopping the rest", flush=True)
                    stop_all()
            time.sleep(1)
    finally:
        stop_all()


if __name__ == "__main__":
    main()
