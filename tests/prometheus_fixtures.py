"""A real Prometheus server per test: Debian's `prometheus` binary on a free port with a
temporary data dir (never the system service), history (DCGM's, the control plane's own
metrics) backfilled with `promtool tsdb create-blocks-from openmetrics` so windows are exact.
Shared by the pruner's, the savings page's, the deploy checks' and the browser tests;
`prometheus_factory` is the fixture their conftest modules take in.
"""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import yaml

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
READY_DEADLINE_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Series:
    """One DCGM series and its samples: [(time, value)], times as datetimes."""
    metric: str
    labels: dict
    samples: list = field(default_factory=list)


def gpu_labels(namespace: str, pod: str, gpu: int = 0, *, node: str = "gpu-node-1",
               model: str = "NVIDIA A10G", scheme: str = "pod") -> dict:
    labels = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "device": f"nvidia{gpu}",
              "modelName": model, "Hostname": node, "container": "main"}
    if scheme == "pod":
        labels.update(namespace=namespace, pod=pod)
    else:  # honor_labels=false: the exporter's own pod/namespace sit beside the workload's
        labels.update(exported_namespace=namespace, exported_pod=pod,
                      namespace="gpu-operator", pod="nvidia-dcgm-exporter-abcde")
    return labels


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics(series: list[Series], path: Path) -> None:
    by_metric: dict[str, list[Series]] = {}
    for s in series:
        by_metric.setdefault(s.metric, []).append(s)
    lines = []
    for metric, group in by_metric.items():
        lines.append(f"# TYPE {metric} gauge")
        for s in group:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            for moment, value in sorted(s.samples, key=lambda x: x[0]):
                ts = moment.timestamp() if isinstance(moment, datetime) else float(moment)
                lines.append(f"{metric}{{{labels}}} {value} {ts:.3f}")
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")


class PrometheusServer:
    def __init__(self, workdir: Path, *, scrape_configs: list | None = None, scrape_interval: str = "15s",
                 tls: tuple[Path, Path] | None = None):
        self.workdir = Path(workdir)
        self.data = self.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls   # (certificate, key): serve HTTPS, as a production Prometheus would
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": scrape_configs or []}))
        self.proc: subprocess.Popen | None = None

    def backfill(self, series: list[Series]) -> None:
        """Write history as TSDB blocks; call before `start` (Prometheus loads blocks at start)."""
        source = self.workdir / "history.om"
        write_openmetrics(series, source)
        done = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source),
                               str(self.data)], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"promtool failed: {done.stderr or done.stdout}")

    def start(self) -> "PrometheusServer":
        log = open(self.workdir / "prometheus.log", "wb")
        args = [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=30d",
                "--web.enable-lifecycle"]
        context = None
        if self.tls:
            web = self.workdir / "web.yml"
            web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(self.tls[0]),
                                                                 "key_file": str(self.tls[1])}}))
            args.append(f"--web.config.file={web}")
            context = ssl.create_default_context(cafile=str(self.tls[0]))
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:  # waiting on an external process, bounded
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1, context=context) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"prometheus not ready after {READY_DEADLINE_S}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def prometheus_factory(tmp_path):
    """`make(history=[Series…], scrape_configs=[…])` → a started `PrometheusServer`."""
    servers: list[PrometheusServer] = []

    def make(history=None, *, scrape_configs=None, scrape_interval="15s", tls=None) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}", scrape_configs=scrape_configs,
                                  scrape_interval=scrape_interval, tls=tls)
        if history:
            server.backfill(history)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


def parse_exposition(text: str, moment: datetime, into: dict) -> None:
    """Add one scrape (Prometheus text format) at `moment` to `into`: {(name, labels): Series}."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            series = into.get(key)
            if series is None:
                series = into[key] = Series(s.name, dict(s.labels))
            series.samples.append((moment, s.value))


def to_exported_scheme(series: list[Series]) -> list[Series]:
    """The same history as a scrape with honor_labels=false records it: the workload's
    labels become exported_*, the exporter's own pod/namespace take their place."""
    out = []
    for s in series:
        labels = dict(s.labels)
        if "pod" in labels:
            labels["exported_pod"] = labels.pop("pod")
            labels["exported_namespace"] = labels.pop("namespace", "")
            labels.update(pod="nvidia-dcgm-exporter-x1y2z", namespace="gpu-operator")
        out.append(Series(s.metric, labels, list(s.samples)))
    return out
