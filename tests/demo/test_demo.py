"""`make demo` as a new user meets it: the real start script in a subprocess on free ports,
management commands from a second "shell" (a process holding only VAR_DIR), and the
demo-only controls. One demo serves the module (it takes some seconds to start); it runs
on the filesystem broker so it never touches the test Redis."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from demo.services import DemoInputError, duration_parse, duration_text
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 180   # the demo on a loaded 2-core machine; it takes ~7 s when idle
# One demo serves the module: its tests stay on one pytest-xdist worker (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shell_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """A second shell: nothing of the product's settings, only where the demo keeps its files."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
            "VAR_DIR": str(var_dir), **extra}


def manage(var_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=shell_env(var_dir, **extra),
                          capture_output=True, text=True, timeout=180)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except OSError:
        return None


@dataclass
class Demo:
    proc: subprocess.Popen
    var_dir: Path
    env: dict
    web_port: int
    prometheus_port: int
    lines: list[str] = field(default_factory=list)
    url: str | None = None
    status_when_printed: int | None = None
    env_file_when_printed: bool = False
    up: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        """Reads the demo's output; the moment it prints the panel's URL, asks that URL."""
        for line in self.proc.stdout:
            self.lines.append(line)
            match = re.search(r"admin:\s+(http://\S+)", line)
            if match and self.url is None:
                self.url = match.group(1)
                self.status_when_printed = http_status(self.url)
                self.env_file_when_printed = (self.var_dir / "demo.env").exists()
                self.up.set()
        self.up.set()

    def output(self) -> str:
        return "".join(self.lines)

    def sim_url(self) -> str:
        text = (self.var_dir / "kubeconfig").read_text()
        return re.search(r"server:\s*(\S+)", text).group(1)


def start_env(var_dir: Path, web_port: int, prometheus_port: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_", "KUBE", "PROMETHEUS_"))}
    # No Redis answers on port 1: the demo runs on its own filesystem broker under VAR_DIR.
    env.update(VAR_DIR=str(var_dir), DEMO_WEB_PORT=str(web_port), DEMO_PROMETHEUS_PORT=str(prometheus_port),
               REDIS_URL="redis://127.0.0.1:1/0")
    return env


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("demo") / "var"
    web_port, prometheus_port = free_port(), free_port()
    env = start_env(var_dir, web_port, prometheus_port)
    proc = subprocess.Popen([sys.executable, "scripts/start_demo.py"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    handle = Demo(proc=proc, var_dir=var_dir, env=env, web_port=web_port, prometheus_port=prometheus_port)
    threading.Thread(target=handle.read, daemon=True).start()
    try:
        handle.up.wait(START_SECONDS)
        assert handle.url, f"the demo printed no URL within {START_SECONDS}s:\n{handle.output()[-3000:]}"
        yield handle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)   # Ctrl-C: the script stops what it started
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# --- with the demo running ---------------------------------------------------------------
def test_the_url_is_printed_only_once_the_panel_answers(running):
    assert running.url == f"http://127.0.0.1:{running.web_port}/admin/"
    assert running.status_when_printed == 200, "the URL was printed before the panel answered"
    assert running.env_file_when_printed, "the URL was printed before manage.py could reach the demo"
    assert "is up" in running.output()


def test_the_summary_with_url_and_password_stays_last_once_the_workers_are_up(running):
    """Celery's banners go to var/log/, not over the summary: once both workers and beat have
    started (their logs say so), the terminal's last lines still hold the URL and password."""
    logs = running.var_dir / "log"
    ready = {"worker.log": "ready.", "worker-long.log": "ready.", "beat.log": "beat: Starting"}
    deadline = time.monotonic() + START_SECONDS
    while not all(word in (logs / name).read_text() for name, word in ready.items() if (logs / name).exists()) \
            or not all((logs / name).exists() for name in ready):
        assert time.monotonic() < deadline, {name: (logs / name).exists() for name in ready}
        time.sleep(0.5)   # a real Celery worker starting in another process: nothing to advance
    assert "[queues]" in (logs / "worker.log").read_text()   # Celery's banner went to the log
    last = "".join(running.lines[-4:])
    assert f"admin:    {running.url}" in last and "password 'operator-demo'" in last, last
    assert f"logs:     {logs}/<name>.log" in running.output()
    assert "[queues]" not in running.output() and "demo@" not in running.output()


def test_the_start_up_summary_holds_no_noise_from_the_steps_it_runs(running):
    """What the operator reads at start: the demo's own lines, not Django shell's count of the
    objects it imported while the operator account was made."""
    assert "imported automatically" not in running.output(), running.output()


def test_the_demos_prometheus_holds_the_gpus_per_pool_the_savings_page_charts(running):
    """The savings page's history reads the control plane's own gpu_capacity_pool_gpus and
    gpu_capacity_node_pool_info from Prometheus: the demo's Prometheus scrapes the panel's
    /metrics, which exports the reading the schedule keeps every minute (no Redis: a cache
    folder the web and the workers share)."""
    if "metrics:  Prometheus" not in running.output():
        message = "no prometheus binary: the demo runs without Prometheus (make system-deps installs it)"
        if IN_CI:
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    base = f"http://127.0.0.1:{running.prometheus_port}/api/v1/query?query="
    deadline = time.monotonic() + START_SECONDS
    found: dict[str, list] = {}
    while time.monotonic() < deadline:
        for name in ("gpu_capacity_pool_gpus", "gpu_capacity_node_pool_info"):
            with urllib.request.urlopen(base + name + '{cluster="default"}', timeout=10) as response:
                found[name] = json.load(response)["data"]["result"]
        if all(found.values()):
            break
        time.sleep(2)   # beat, a worker, the panel and Prometheus' scrape in other processes
    assert found["gpu_capacity_pool_gpus"], "Prometheus has no GPUs per pool of the demo's cluster"
    pools = {s["metric"]["pool"] for s in found["gpu_capacity_pool_gpus"]}
    assert pools == {"p5.48xlarge", "g5.8xlarge"}, pools
    nodes = {s["metric"]["node"] for s in found["gpu_capacity_node_pool_info"]}
    assert "gpu-h100-00" in nodes and "gpu-a10g-00" in nodes, nodes


def test_a_second_start_on_the_same_ports_names_the_port_and_the_variable(running, tmp_path):
    env = start_env(tmp_path / "var", running.web_port, running.prometheus_port)
    started = time.monotonic()
    second = subprocess.run([sys.executable, "scripts/start_demo.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert time.monotonic() - started < 30, "it should refuse before starting anything"
    assert f"port {running.web_port} (web) is in use" in second.stderr
    assert "DEMO_WEB_PORT" in second.stderr
    assert "is up" not in second.stdout + second.stderr
    assert not (tmp_path / "var" / "db.sqlite3").exists()
    # The first demo is untouched.
    assert http_status(running.url) == 200
    assert (running.var_dir / "db.sqlite3").exists()


def test_a_second_start_from_the_same_folder_is_refused(running):
    env = start_env(running.var_dir, free_port(), free_port())
    second = subprocess.run([sys.executable, "scripts/start_demo.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f"a demo already runs from {running.var_dir} (pid {running.proc.pid}" in second.stderr
    assert http_status(running.url) == 200


def test_a_command_from_another_shell_uses_the_demos_environment(running):
    done = manage(running.var_dir, "sweep_dormancy", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dry_run"] is True
    assert f"using the demo's environment from {running.var_dir / 'demo.env'} (demo pid {running.proc.pid})" \
        in done.stderr


def test_the_demos_environment_wins_over_a_shell_pointing_elsewhere(running, tmp_path):
    done = manage(running.var_dir, "shell", "-c", "from django.conf import settings; print(settings.KUBECONFIG)",
                  KUBECONFIG=str(tmp_path / "production-kubeconfig"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(running.var_dir / "kubeconfig")
    assert "it replaces KUBECONFIG from your shell" in done.stderr


def _utilization(running: Demo, namespace: str, pod_prefix: str) -> list[float]:
    with urllib.request.urlopen(running.sim_url() + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'namespace="{namespace}"' in line
            and f'pod="{pod_prefix}' in line]


def test_demo_load_makes_a_model_idle_then_busy_on_the_exporter(running):
    idle = manage(running.var_dir, "demo_load", "acme/llama-3-8b", "idle")
    assert idle.returncode == 0, idle.stderr
    assert "org-acme/llama-3-8b is idle" in idle.stdout
    assert _utilization(running, "org-acme", "llama-3-8b-predictor-") == [0.0]
    busy = manage(running.var_dir, "demo_load", "acme/llama-3-8b", "busy")
    assert busy.returncode == 0, busy.stderr
    assert "report 90% GPU utilization" in busy.stdout
    assert _utilization(running, "org-acme", "llama-3-8b-predictor-") == [90.0]


def test_demo_load_names_the_models_of_an_org_for_an_unknown_one(running):
    done = manage(running.var_dir, "demo_load", "acme/no-such-model", "busy")
    assert done.returncode == 1
    assert "no InferenceService 'no-such-model' in namespace 'org-acme' (there: llama-3-8b)" in done.stderr


def _org_dormant(running: Demo, slug: str) -> str:
    done = manage(running.var_dir, "shell", "-c",
                  f"from orgs.models import Org; print(Org.objects.get(slug='{slug}').dormant)")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_advancing_the_clock_lets_an_org_idle_25h_turn_dormant(running):
    before = manage(running.var_dir, "sweep_dormancy", "--dry-run", "--json")
    assert json.loads(before.stdout)["dormant"] == []
    assert _org_dormant(running, "acme") == "False"

    moved = manage(running.var_dir, "demo_clock", "advance", "25h")
    assert moved.returncode == 0, moved.stderr
    assert "moved the product's clock and the simulated cluster's forward by 1d1h (90000 seconds)" in moved.stdout
    asked = time.monotonic()
    shown = manage(running.var_dir, "demo_clock", "show")
    took = timedelta(seconds=time.monotonic() - asked)
    product = re.search(r"product now:\s+(\S+ \S+) UTC \(wall clock \+1d1h\)", shown.stdout)
    cluster = re.search(r"simulated cluster now:\s+(\S+ \S+) UTC", shown.stdout)
    assert product and cluster, shown.stdout
    product_now = datetime.fromisoformat(product.group(1)).replace(tzinfo=timezone.utc)
    cluster_now = datetime.fromisoformat(cluster.group(1)).replace(tzinfo=timezone.utc)
    wall = datetime.now(timezone.utc)
    assert abs(product_now - (wall + timedelta(hours=25))) < timedelta(minutes=2)
    # Both clocks run at wall speed from the same advance. They differ by the time between
    # the command's two readings (at most how long it took) and the simulated clock's lag
    # behind wall time between its ticks (a few seconds on a loaded machine).
    assert abs(cluster_now - product_now) <= took + timedelta(seconds=5)

    swept = manage(running.var_dir, "sweep_dormancy", "--json")
    assert swept.returncode == 0, swept.stderr
    # The sweep here or beat's own (it runs on the moved clock too) made it dormant.
    assert _org_dormant(running, "acme") == "True"


# --- without a demo ----------------------------------------------------------------------
def test_without_a_demo_or_settings_a_command_fails_in_one_line(tmp_path):
    done = manage(tmp_path, "sweep_dormancy", "--dry-run")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"manage.py: no demo is running (no {tmp_path / 'demo.env'}) and DJANGO_SECRET_KEY "
                               "is not set"), lines[0]
    assert "Start the demo with `make demo`" in lines[0] and "DJANGO_DEBUG" not in lines[0]


def test_an_env_file_left_by_a_dead_demo_is_ignored(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "demo.env").write_text(f"DEMO_PID={gone.pid}\nDEMO_MODE=1\nDJANGO_DEBUG=1\n")
    done = manage(tmp_path, "check")
    assert done.returncode != 0
    assert f"ignoring {tmp_path / 'demo.env'}: the demo that wrote it (pid {gone.pid}) no longer runs" in done.stderr
    assert "DJANGO_SECRET_KEY is not set" in done.stderr


def test_a_deployment_never_reads_the_demo_file(tmp_path):
    (tmp_path / "demo.env").write_text(f"DEMO_PID={os.getpid()}\nDEMO_MODE=1\nDJANGO_DEBUG=1\n")
    done = manage(tmp_path, "shell", "-c", "from django.conf import settings; print(settings.DEMO_MODE)",
                  DJANGO_SECRET_KEY="a-deployment-secret-key-0123456789-0123456789-0123456789",
                  DJANGO_HTTPS="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert "demo" not in done.stderr


def test_the_demo_controls_refuse_outside_the_demo(tmp_path):
    offset = tmp_path / "clock-offset"
    done = manage(tmp_path, "demo_clock", "advance", "25h", DJANGO_DEBUG="1", CLOCK_OFFSET_FILE=str(offset))
    assert done.returncode == 1
    assert "demo_clock runs only beside the demo started by `make demo` (DEMO_MODE is not set)" in done.stderr
    assert not offset.exists()
    load = manage(tmp_path, "demo_load", "acme/llama-3-8b", "busy", DJANGO_DEBUG="1")
    assert load.returncode == 1 and "demo_load runs only beside the demo" in load.stderr


@pytest.mark.parametrize("text", ["-5h", "0", "nan", "inf", "25x", "", "2500d", "1e9"])
def test_demo_clock_rejects_a_bad_duration_naming_it(tmp_path, text):
    done = manage(tmp_path, "demo_clock", "advance", text, DJANGO_DEBUG="1")
    assert done.returncode != 0
    assert "duration" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("25h", 90000), ("2d", 172800),
                                               ("1h30m", 5400), ("1.5h", 5400)])
def test_duration_parse(text, seconds):
    assert duration_parse(text) == seconds
    assert duration_parse(duration_text(seconds)) == seconds


@pytest.mark.parametrize("text", ["-1h", "0s", "nan", "h", "1h-30m", "367d"])
def test_duration_parse_refuses(text):
    with pytest.raises(DemoInputError, match="duration"):
        duration_parse(text)


def test_demo_clock_advance_without_a_unit_is_refused_and_moves_nothing(tmp_path):
    """`advance 25` once moved the clocks 25 seconds, silently: now it names the units."""
    offset = tmp_path / "clock-offset"
    done = manage(tmp_path, "demo_clock", "advance", "25", DJANGO_DEBUG="1", CLOCK_OFFSET_FILE=str(offset))
    assert done.returncode == 1
    assert "duration '25' has no unit: write 25s, 25m, 25h or 25d" in done.stderr
    assert not offset.exists()
