"""Benchmark: a fleet of simulated 5,000-node / 50,000-pod clusters, one full cycle of every
periodic job with 1, 2 and 4 worker processes, each cycle against its beat interval.

    .venv/bin/python bench/fleet.py [--clusters auto|N] [--memory-gib G] [--workers 1,2,4]

Needs PostgreSQL on 127.0.0.1:5432 (user postgres; a database of its own is created and
dropped), Redis on 127.0.0.1:6379 (a free database number, emptied at the end), and
`prometheus` + `promtool` on PATH for the prune pass (`--no-prune` leaves it out).

What runs, as in production:
- each cluster is `python -m simcluster serve` in a process of its own (the generator's
  5,000 nodes / 50,000 pods, its org namespaces named per cluster, a pynode per org), with
  a Prometheus of its own holding 30 minutes of DCGM history for its GPUs (promtool);
- `--clusters auto` starts one cluster, reads its RSS (simulated cluster + Prometheus) and
  fits as many as `--memory-gib` holds after the workers' share, at most `--max-clusters`;
- per worker count, one `celery -A config worker -Q beat,sweep,apply,long --concurrency=W`
  (W prefork processes); each job is queued as beat queues it (the fan-out task) and its
  cycle is the time until every task it fanned out has finished (the worker's log lines);
- the sweep marks a tenth of each cluster's orgs dormant; its cycle ends when their applies
  are done (a wake of the same orgs, untimed, restores them before the next worker count);
- the GPU map is no task: it is read by the web, at most once per CAPACITY_MAP_CACHE_SECONDS
  (its interval here); W processes render every cluster's map (the cache off).
Everything it starts lives in one temporary folder and is stopped and removed at the end.
Prints a table; not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

NODES, PODS = 5000, 50000
MIB, GIB = 1024 ** 2, 1024 ** 3
WINDOW = timedelta(minutes=30)          # PRUNER_DURATION_MINUTES' default: the history Prometheus holds
# Measured at 50k pods (2026-11-25): a worker pool process peaked at 748-755 MiB; a
# cluster's Prometheus grew to 246-299 MiB once queried. A cluster's simulated API server
# holds 0.44 GiB loaded, 0.51 GiB once every pod's JSON is kept (a first LIST) and 0.59 GiB
# once every pod carries binpack's cost annotations (its store shares what a write leaves
# unchanged; it was 0.65 -> 1.16 GiB before that): 1.4x what it holds when loaded.
WORKER_SHARE_GIB = 0.75
CLUSTER_GROWTH, PROMETHEUS_QUERIED = 1.4, 300 * 1024 ** 2
SWEEP_SHARE = 10                        # one org in ten goes dormant per sweep
CYCLE_LIMIT_S = 1200.0
QUEUES = "beat,sweep,apply,long"


# ---- a cluster's objects and its GPUs' history ------------------------------------------------
def cluster_docs(index: int, nodes: int, pods: int) -> tuple[list[dict], list[list]]:
    """Cluster `index`'s objects as the generator makes them (org namespaces named per cluster,
    a pynode per org, a `knative-serving` namespace) and its GPUs: [namespace, pod, node,
    gpu index, utilization, product] each."""
    from simcluster.generate import GPU_INDICES_ANNOTATION, ORG_LABEL, UTILIZATION_ANNOTATION, generate, pynode

    # The pods come placed; the Simulation document (placement of new pods) cannot sit in a List.
    docs = [d for d in generate(nodes=nodes, pods=pods, seed=index) if d.get("kind") != "Simulation"]
    prefix = f"c{index}-"
    orgs = []
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        if doc.get("kind") == "Namespace" and (meta.get("labels") or {}).get(ORG_LABEL):
            meta["name"] = prefix + meta["name"]
            meta["labels"][ORG_LABEL] = prefix + meta["labels"][ORG_LABEL]   # org slugs are fleet-wide
            orgs.append(meta["name"])
        elif meta.get("namespace", "").startswith("org-"):
            meta["namespace"] = prefix + meta["namespace"]
    docs.append({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}})
    docs.extend(pynode(ns) for ns in orgs)
    products = {d["metadata"]["name"]: d["metadata"]["labels"].get("nvidia.com/gpu.product", "")
                for d in docs if d.get("kind") == "Node"}
    gpus = []
    for d in docs:
        annotations = d.get("metadata", {}).get("annotations") or {}
        if d.get("kind") == "Pod" and annotations.get(GPU_INDICES_ANNOTATION):
            node = d["spec"]["nodeName"]
            for gpu in annotations[GPU_INDICES_ANNOTATION].split(","):
                gpus.append([d["metadata"]["namespace"], d["metadata"]["name"], node, int(gpu),
                             float(annotations.get(UTILIZATION_ANNOTATION, "50")), products.get(node, "")])
    return docs, gpus


# ---- one simulated cluster (a child process of its own) --------------------------------------
def cluster_serve(index: int, workdir: Path, nodes: int, pods: int) -> None:
    """Generate cluster `index`, write its scenario and its GPUs' utilization, then become its
    simulated API server (exec: the generator's memory is given back)."""
    import orjson

    docs, gpus = cluster_docs(index, nodes, pods)
    (workdir / "gpus.json").write_bytes(orjson.dumps(gpus))
    (workdir / "scenario.json").write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    del docs, gpus
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "simcluster", "serve", "--scenario", str(workdir / "scenario.json"),
                              "--kubeconfig-out", str(workdir / "kubeconfig")])


def prometheus_start(folder: Path, gpus: list[list], now: datetime):
    """A Prometheus in `folder` holding WINDOW of DCGM utilization history, to `now`, for each
    GPU of `gpus` (as cluster_docs gives them), backfilled with promtool; started."""
    from tests.prometheus_fixtures import PrometheusServer, Series, gpu_labels

    times, t = [], now - WINDOW - timedelta(minutes=5)
    while t <= now:
        times.append(t)
        t += timedelta(seconds=60)
    series = [Series("DCGM_FI_DEV_GPU_UTIL", gpu_labels(ns, pod, gpu, node=node, model=model or "NVIDIA GPU"),
                     [(m, util) for m in times]) for ns, pod, node, gpu, util, model in gpus]
    server = PrometheusServer(folder)
    server.backfill(series)
    del series
    (folder / "history.om").unlink(missing_ok=True)   # the blocks hold it now
    server.start()
    return server


def available_memory() -> int:
    """Bytes the kernel says can be taken without swapping (MemAvailable)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("cannot read MemAvailable from /proc/meminfo: pass --memory-gib")


def rss(pid: int, field: str = "VmRSS") -> int:
    """Bytes, from /proc/<pid>/status (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


class Fleet:
    """Everything the bench starts; `close` stops and removes all of it."""

    def __init__(self, folder: Path, nodes: int, pods: int):
        self.folder, self.nodes, self.pods = folder, nodes, pods
        self.procs: list[subprocess.Popen] = []
        self.proms = []
        self.clusters: list[dict] = []

    def cluster_start(self, index: int, *, prometheus: bool, now: datetime) -> dict:
        workdir = self.folder / f"cluster-{index}"
        workdir.mkdir()
        began = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--serve-one", str(index), str(workdir),
                                 "--nodes", str(self.nodes), "--pods", str(self.pods)], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if "serving at" not in line:
            raise RuntimeError(f"simulated cluster {index} did not start: {line!r}")
        url = line.split("serving at ", 1)[1].split()[0]
        while "kubeconfig written" not in proc.stdout.readline():
            if proc.poll() is not None:
                raise RuntimeError(f"simulated cluster {index} exited")
        info = {"index": index, "name": f"fleet-{index}", "url": url, "kubeconfig": str(workdir / "kubeconfig"),
                "pid": proc.pid, "started_s": time.perf_counter() - began, "sim_rss": rss(proc.pid),
                "prometheus": "", "prom_rss": 0}
        if prometheus:
            info.update(self._prometheus(workdir, now))
        (workdir / "scenario.json").unlink()
        self.clusters.append(info)
        print(f"  cluster {index}: {url}, ready in {info['started_s']:.1f} s (generated and loaded), "
              f"simcluster RSS {info['sim_rss'] / GIB:.2f} GiB"
              + (f", Prometheus RSS {info['prom_rss'] / MIB:.0f} MiB" if prometheus else ""), flush=True)
        return info

    def _prometheus(self, workdir: Path, now: datetime) -> dict:
        import orjson

        server = prometheus_start(workdir / "prometheus", orjson.loads((workdir / "gpus.json").read_bytes()), now)
        self.proms.append(server)
        return {"prometheus": server.url, "prom_rss": rss(server.proc.pid)}

    def close(self) -> None:
        for server in self.proms:
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest anyway
                print(f"  (Prometheus stop: {exc})", file=sys.stderr)
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


# ---- the database, the broker, Django ---------------------------------------------------------
def database_create(name: str) -> str:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def database_drop(name: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def redis_claim() -> tuple[str, object]:
    import redis

    for db in range(15, 0, -1):
        client = redis.Redis.from_url(f"redis://127.0.0.1:6379/{db}")
        if client.dbsize() == 0 and client.set("fleet-bench:claim", os.getpid(), nx=True, ex=7200):
            return f"redis://127.0.0.1:6379/{db}", client
        client.close()
    raise SystemExit("no empty Redis database number (1-15) for the bench's broker")


# ---- a worker and the cycles -----------------------------------------------------------------
TERMINAL = re.compile(r"Task (?P<task>[\w.]+)\[[0-9a-f-]+\] (?:(?P<ok>succeeded) in (?P<secs>[0-9.e-]+)s"
                      r"|(?P<err>raised unexpected))")


class Worker:
    def __init__(self, folder: Path, env: dict, processes: int):
        self.log_path = folder / f"worker-{processes}.log"
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop
        self.processes = processes
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("celery")), "-A", "config", "worker", "-Q", QUEUES,
             f"--concurrency={processes}", "--pool=prefork", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-n", f"fleet-{processes}-{os.getpid()}@%h", "--loglevel=INFO"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while "ready." not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark(self) -> int:
        return len(self.text())

    def finished(self, since: int, task: str) -> tuple[int, int, list[float]]:
        ok = err = 0
        secs = []
        for m in TERMINAL.finditer(self.text(), since):
            if m["task"] == task:
                if m["ok"]:
                    ok += 1
                    secs.append(float(m["secs"]))
                else:
                    err += 1
        return ok, err, secs

    def wait(self, since: int, task: str, count: int) -> tuple[float, int, list[float]]:
        deadline = time.monotonic() + CYCLE_LIMIT_S
        while True:
            ok, err, secs = self.finished(since, task)
            if ok + err >= count:
                return time.monotonic(), err, secs
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{task}: {ok + err} of {count} done within {CYCLE_LIMIT_S:.0f} s")
            time.sleep(0.05)

    def peak_child_rss(self) -> int:
        return max((rss(pid, "VmHWM") for pid in children(self.proc.pid)), default=0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def clock_at(offset_file: Path, moment: datetime) -> None:
    """Set the workers' clock to `moment` now (the prune history ends at the bench's start)."""
    offset_file.write_text(str(moment.timestamp() - time.time()))


def fan_out(worker: Worker, fan_task: str, per_cluster_task: str, count: int) -> dict:
    from config.celery import task_send

    since = worker.mark()
    began = time.monotonic()
    task_send(fan_task)
    ended, errors, secs = worker.wait(since, per_cluster_task, count)
    return {"cycle": ended - began, "errors": errors, "slowest": max(secs, default=0.0)}


def sweep_cycle(worker: Worker, clusters) -> dict:
    """A tenth of each cluster's orgs idle for 25 h: the sweep marks them and queues their
    applies; the cycle ends with the last apply. Then a wake of the same orgs (untimed)."""
    from config import clock
    from config.celery import task_send
    from orgs import services
    from orgs.models import DormancySwitch, Org

    now = clock.now()
    chosen = []
    for cluster in clusters:
        ids = list(Org.objects.filter(cluster=cluster).order_by("id").values_list("id", flat=True))[::SWEEP_SHARE]
        chosen += ids
    Org.objects.update(last_activity_at=now)
    Org.objects.filter(id__in=chosen).update(last_activity_at=now - timedelta(hours=25))
    since = worker.mark()
    began = time.monotonic()
    task_send("orgs.tasks.dormancy_sweep")
    worker.wait(since, "orgs.tasks.dormancy_sweep", 1)
    marked = Org.objects.filter(dormant=True).count()
    ended, errors, secs = worker.wait(since, "orgs.tasks.org_scale_to_zero_apply", marked)
    result = {"cycle": ended - began, "errors": errors, "slowest": max(secs, default=0.0), "tasks": marked}
    enabled = Org.objects.filter(dormant=True, applied="enabled").count()
    # The wake, untimed: every org back to its owner's floor before the next worker count.
    since = worker.mark()
    for slug in Org.objects.filter(dormant=True).values_list("slug", flat=True):
        services.org_mark_active(org_slug=slug, cause=DormancySwitch.Cause.ACTIVITY)
    worker.wait(since, "orgs.tasks.org_scale_to_zero_apply", marked)
    result["note"] = f"{marked} orgs dormant, {enabled} enabled"
    return result


def gpu_map_one(name: str) -> float:
    from django.contrib.auth.models import User
    from django.test import Client, override_settings

    client = Client()
    client.force_login(User.objects.get(username="fleet-bench"))
    began = time.perf_counter()
    with override_settings(CAPACITY_MAP_CACHE_SECONDS=0):   # drawn now, not served from a kept reading
        response = client.get(f"/capacity/clusters/{name}/gpu-map/")
    if response.status_code != 200:
        raise RuntimeError(f"GPU map of {name}: HTTP {response.status_code}")
    return time.perf_counter() - began


def gpu_map_cycle(processes: int, names: list[str]) -> dict:
    import multiprocessing

    from django.db import connections

    connections.close_all()   # each forked process opens its own
    began = time.monotonic()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        secs = pool.map(gpu_map_one, names, chunksize=1)
    return {"cycle": time.monotonic() - began, "errors": 0, "slowest": max(secs), "tasks": len(names)}


# ---- the product's side, the cycles, the table (shared with bench/fleet_real.py) --------------
class Product:
    """The product as the bench runs it: a database of its own, a free Redis database as its
    broker, Django set up in this process with the workers' environment. `close` drops both."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.db_name = f"fleet_bench_{os.getpid()}"
        self.broker_client = None
        self.database = False
        self.offset_file = folder / "clock-offset"

    def open(self) -> dict:
        broker, self.broker_client = redis_claim()
        self.offset_file.write_text("0")
        url = database_create(self.db_name)
        self.database = True
        env = {
            "DATABASE_URL": url, "REDIS_URL": broker, "CELERY_BROKER_URL": broker,
            "DJANGO_SETTINGS_MODULE": "config.settings", "DJANGO_SECRET_KEY": "bench-only-" + "x" * 50,
            "DJANGO_ALLOWED_HOSTS": "testserver", "DJANGO_HTTPS": "false", "VAR_DIR": str(self.folder / "var"),
            "CLOCK_OFFSET_FILE": str(self.offset_file),
            "PRUNER_RUN_MODE": "dry-run",
            "ORGS_ACTIVITY_THROTTLE_SECONDS": "0",   # each wake between worker counts is recorded
            "KUBE_IN_CLUSTER": "0", "LOG_LEVEL": "INFO", "CELERY_TASK_ALWAYS_EAGER": "0",
        }
        os.environ.pop("KUBECONFIG", None)
        os.environ.update(env)
        warnings.filterwarnings("ignore", message="No directory at")   # no collected static files: none served
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from django.contrib.auth.models import User

        User.objects.create_superuser("fleet-bench", password=uuid.uuid4().hex)
        return env

    def register(self, name: str, kubeconfig: str, prometheus: str):
        from clusters.models import Cluster
        from orgs import services

        cluster = Cluster.objects.create(name=name, kubeconfig_path=kubeconfig, prometheus_url=prometheus)
        synced = services.orgs_sync(cluster=cluster, now=datetime.now(timezone.utc))
        print(f"  {cluster.name}: {len(synced.created)} orgs", flush=True)
        return cluster

    def close(self) -> None:
        if "django" in sys.modules and self.database:
            from django.db import connections

            connections.close_all()
        if self.database:
            try:
                database_drop(self.db_name)
            except Exception as exc:  # noqa: BLE001 - say it, remove the rest
                print(f"  (could not drop database {self.db_name}: {exc})", file=sys.stderr)
        if self.broker_client is not None:
            self.broker_client.flushdb()
            self.broker_client.close()


def cycles(product: Product, clusters: list, workers: list[int], *, prune: bool, history_end: datetime,
           on_worker=None) -> dict:
    """One cycle of every periodic job over `clusters` per worker count; returns what `report`
    prints. `on_worker(worker)` runs with each worker started (the caller stops it on error)."""
    from config.schedule import SCHEDULES

    interval = {p.task: p.every_seconds for p in SCHEDULES}
    jobs = [("reconcile", "orgs.tasks.scale_to_zero_reconcile", "orgs.tasks.scale_to_zero_reconcile_cluster"),
            ("discovery", "clusters.tasks.discovery_refresh_all", "clusters.tasks.discovery_refresh_cluster"),
            ("registry sync", "capacity.runbook.tasks.registry_sync_all_clusters",
             "capacity.runbook.tasks.registry_sync_cluster"),
            ("binpack", "capacity.binpack.tasks.binpack_all_clusters", "capacity.binpack.tasks.binpack_cluster")]
    if prune:
        jobs.insert(3, ("prune pass", "pruning.tasks.prune_all_clusters", "pruning.tasks.prune_cluster"))
    intervals = {name: interval[fan] for name, fan, _ in jobs}
    intervals["sweep"] = interval["orgs.tasks.dormancy_sweep"]
    from django.conf import settings

    intervals["GPU map"] = settings.CAPACITY_MAP_CACHE_SECONDS   # how old a map may be, as configured
    results: dict[tuple[str, int], dict] = {}
    peaks: dict[int, int] = {}
    offset_file = product.offset_file
    for processes in workers:
        print(f"\n-- {processes} worker process(es)", flush=True)
        worker = Worker(product.folder, {**os.environ}, processes)
        if on_worker:
            on_worker(worker)
        if processes == workers[0]:
            # Untimed: the first reconcile applies every org for the first time; the cycle
            # measured is the steady one (holding, drift repairs only).
            warm = fan_out(worker, jobs[0][1], jobs[0][2], len(clusters))
            print(f"  (reconcile's first apply of every org, untimed: {warm['cycle']:.1f} s)", flush=True)
            # Untimed too: binpack until its costs hold (a run patches at most BINPACK_MAX_WRITES
            # pods, a first costing of 50,000 pods takes several), so that every worker count
            # measures the same steady cycle: read, plan, patch only what changed.
            from capacity.binpack.models import BinpackRun

            for round_ in range(1, 8):
                since_pk = BinpackRun.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
                warm = fan_out(worker, "capacity.binpack.tasks.binpack_all_clusters",
                               "capacity.binpack.tasks.binpack_cluster", len(clusters))
                written = list(BinpackRun.objects.filter(pk__gt=since_pk).values_list("written", flat=True))
                print(f"  (binpack costing round {round_}, untimed: {warm['cycle']:.1f} s, "
                      f"pods patched per cluster {written})", flush=True)
                if not any(written):
                    break
        result = sweep_cycle(worker, clusters)
        results[("sweep", processes)] = result
        print(f"  sweep: {result['cycle']:.1f} s ({result['note']})", flush=True)
        for name, fan, per in jobs:
            if name == "prune pass":
                clock_at(offset_file, history_end)   # the history Prometheus holds ends there
            result = fan_out(worker, fan, per, len(clusters))
            offset_file.write_text("0")
            result["tasks"] = len(clusters)
            results[(name, processes)] = result
            print(f"  {name}: {result['cycle']:.1f} s (slowest cluster {result['slowest']:.1f} s, "
                  f"{result['errors']} failed)", flush=True)
        peaks[processes] = worker.peak_child_rss()
        worker.stop()
        result = gpu_map_cycle(processes, [c.name for c in clusters])
        results[("GPU map", processes)] = result
        print(f"  GPU map: {result['cycle']:.1f} s (slowest cluster {result['slowest']:.1f} s)", flush=True)
    return {"results": results, "peaks": peaks, "intervals": intervals, "workers": workers,
            "names": ["sweep"] + [name for name, _, _ in jobs] + ["GPU map"], "prune": prune}


def report(measured: dict, clusters: list, title: str) -> None:
    """The table: each job's cycle per worker count against its interval, and the speed-ups."""
    from django.conf import settings as dj

    from capacity.binpack.models import BinpackRun
    from pruning.models import PruneRun

    results, workers, names, intervals = (measured[k] for k in ("results", "workers", "names", "intervals"))
    writes = list(BinpackRun.objects.order_by("pk").values_list("written", flat=True))
    prunes = list(PruneRun.objects.filter(cluster=clusters[0]).order_by("pk").values_list(
        "pods_seen", "idle_candidates", "planned", "kube_api_calls"))
    print(f"\n{title}; {os.cpu_count()} CPU(s); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"cycle = queueing the fan-out to its last task done (one run each)")
    head = f"  {'job':<14} {'interval':>8} " + " ".join(f"{f'{w} worker(s)':>12}" for w in workers) + \
        "   " + " ".join(f"{f'x{w}/x{workers[0]}':>8}" for w in workers[1:]) + "   within interval"
    print(head)
    for name in names:
        cycles_ = [results[(name, w)]["cycle"] for w in workers]
        speedups = [cycles_[0] / c for c in cycles_[1:]]
        within = "yes" if all(c <= intervals[name] for c in cycles_) else \
            "no: " + ",".join(str(w) for w, c in zip(workers, cycles_) if c > intervals[name]) + " worker(s)"
        print(f"  {name:<14} {intervals[name]:>7}s " + " ".join(f"{c:>11.1f}s" for c in cycles_) + "   "
              + " ".join(f"{s:>7.2f}x" for s in speedups) + f"   {within}")
    print("  slowest single cluster task per job (s): " + "; ".join(
        f"{name} " + "/".join(f"{results[(name, w)]['slowest']:.1f}" for w in workers) for name in names))
    failed = {name: [results[(name, w)]["errors"] for w in workers] for name in names
              if any(results[(name, w)]["errors"] for w in workers)}
    print("  GPU map: every cluster's map rendered by W web processes, the cache off; its interval is the "
          "age a map may have (CAPACITY_MAP_CACHE_SECONDS)")
    print(f"  failed tasks: {failed or 'none'}; binpack pods patched per run, in order: {writes} "
          f"(BINPACK_MAX_WRITES={dj.BINPACK_MAX_WRITES})")
    if measured["prune"]:
        print(f"  prune runs (dry run), first cluster's: pods with GPU data / idle / owners planned / API calls "
              f"{prunes}")
    print("  worker process peak " + ", ".join(f"{w}: {measured['peaks'][w] / MIB:.0f} MiB" for w in workers))


def worker_counts(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",")]
        if not workers or any(w < 1 or w > 16 for w in workers):
            raise ValueError
    except ValueError:
        raise SystemExit(f"--workers must be counts 1..16 separated by commas, got {text!r}") from None
    return workers


def prometheus_check() -> None:
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        raise SystemExit("the prune pass needs prometheus and promtool on PATH (apt-get install prometheus), "
                         "or --no-prune")


# ---- main ------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", default="auto", help="how many clusters, or auto (what --memory-gib holds)")
    parser.add_argument("--max-clusters", type=int, default=10)
    parser.add_argument("--memory-gib", type=float, default=None,
                        help="memory the bench may use (default: 80%% of what the machine has available now)")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    parser.add_argument("--no-prune", action="store_true", help="leave the prune pass out (no Prometheus)")
    parser.add_argument("--nodes", type=int, default=NODES, help=f"nodes per cluster (default {NODES:,})")
    parser.add_argument("--pods", type=int, default=PODS, help=f"pods per cluster (default {PODS:,})")
    parser.add_argument("--serve-one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_one:
        cluster_serve(int(args.serve_one[0]), Path(args.serve_one[1]), args.nodes, args.pods)
        return 0
    workers = worker_counts(args.workers)
    if args.clusters != "auto" and not (args.clusters.isdigit() and 1 <= int(args.clusters) <= args.max_clusters):
        raise SystemExit(f"--clusters must be auto or 1..{args.max_clusters}, got {args.clusters!r}")
    if args.memory_gib is None:
        args.memory_gib = round(available_memory() * 0.8 / GIB, 1)
    if not (0 < args.memory_gib <= 256):
        raise SystemExit(f"--memory-gib must be in (0, 256], got {args.memory_gib}")
    if not (1 <= args.nodes <= 20000 and 0 <= args.pods <= 200000):
        raise SystemExit(f"--nodes must be 1..20000 and --pods 0..200000, got {args.nodes} and {args.pods}")
    prune = not args.no_prune
    if prune:
        prometheus_check()

    folder = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    fleet = Fleet(folder, args.nodes, args.pods)
    product = Product(folder)
    workers_started: list[Worker] = []
    try:
        product.open()
        history_end = datetime.now(timezone.utc).replace(microsecond=0)

        print(f"fleet bench: {args.nodes:,} nodes / {args.pods:,} pods per cluster; memory for the bench "
              f"{args.memory_gib:g} GiB; {os.cpu_count()} CPU(s)", flush=True)
        first = fleet.cluster_start(0, prometheus=prune, now=history_end)
        per_cluster = first["sim_rss"] * CLUSTER_GROWTH + (PROMETHEUS_QUERIED if prune else 0)
        reserved = WORKER_SHARE_GIB * max(workers) * GIB
        fits = int((args.memory_gib * GIB - reserved) // per_cluster)
        count = min(args.max_clusters, max(1, fits)) if args.clusters == "auto" else int(args.clusters)
        print(f"  one cluster will hold {per_cluster / GIB:.2f} GiB (simcluster {first['sim_rss'] / GIB:.2f} loaded, "
              f"x{CLUSTER_GROWTH} once worked; Prometheus {PROMETHEUS_QUERIED / MIB:.0f} MiB once queried); "
              f"{args.memory_gib:g} GiB less {reserved / GIB:.1f} GiB "
              f"for {max(workers)} worker processes fits {fits}; running {count}", flush=True)
        for index in range(1, count):
            fleet.cluster_start(index, prometheus=prune, now=history_end)
        clusters = [product.register(info["name"], info["kubeconfig"], info["prometheus"]) for info in fleet.clusters]
        measured = cycles(product, clusters, workers, prune=prune, history_end=history_end,
                          on_worker=workers_started.append)
        report(measured, clusters, f"fleet: {len(clusters)} simulated clusters x {args.nodes:,} nodes / "
                                   f"{args.pods:,} pods")
        print("  memory after the cycles: simcluster " + ", ".join(
            f"{rss(c['pid']) / GIB:.2f}" for c in fleet.clusters) + " GiB" + (
            "; Prometheus peak " + ", ".join(f"{rss(s.proc.pid, 'VmHWM') / MIB:.0f}" for s in fleet.proms)
            + " MiB" if prune else ""))
        return 0
    finally:
        for worker in workers_started:
            worker.stop()
        fleet.close()
        product.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
