"""Benchmark: one dry-run prune pass at 10,000 GPU pods with 20 and with 2,000 idle (and at
5×: 50,000 pods with 100 and 10,000 idle), against its floor.

    .venv/bin/python bench/prune_pass.py [--sizes 10000,50000] [--repeat 5]

Needs `prometheus` and `promtool` on PATH (Debian's prometheus package; `make test`
installs them). Everything it starts (the simulated cluster, Prometheus, a worker process,
a SQLite database) lives in one temporary folder, removed at the end.

The DCGM series carry the workload in `exported_pod`/`exported_namespace` (an
honor_labels=false scrape, as on OpenShift) and every node has a `node_dmi_info` series,
so that gpu-pruner's own query runs unchanged on the same data.

Per scenario a fresh worker process (so its peak memory is the pass's, not the bench's)
runs one untimed pass, then `--repeat` rounds of floor, pass and peer replay, and reports:
- the pass: `prune_run_execute` in dry-run mode — its three Prometheus queries (the
  candidates and the census sent at once, then the follow-up about the candidates while
  they are read), the Kubernetes reads the cost model chose, the plan, the
  PruneRun/PruneDecision rows written;
- the floor, the cheapest way to do the same reading with the libraries the product
  uses (urllib3 + orjson): the same three PromQL queries, the first two at once, the
  third while the pods are read: for few idle pods one GET of each idle pod, then of each
  owner up its chain (each once), ten GETs at a time; for many, one unpaged pod LIST
  (decoded as the pass decodes its pod pages, msgspec into just the fields a pod's view
  reads, with the collector paused);
- the peer replay: the calls gpu-pruner makes in one dry-run pass (gpu-pruner/src/main.rs,
  lib.rs, query.promql.j2 of wseaton/gpu-pruner), made with urllib3 + orjson: its one PromQL
  query (one series per idle GPU, node_dmi_info joined), then for every series, ten at a
  time, a GET of the pod and of each owner up its chain (ReplicaSet, then Deployment) —
  per pod, not once per owner;
- Kubernetes API calls and Prometheus queries of a pass, bytes received over the network
  in a pass (every socket read of the process), and the worker's peak RSS.
Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

GPUS_PER_NODE = 8
PODS_PER_WORKLOAD = 10
NOW = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
BORN = NOW - timedelta(days=1)


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def cluster_docs(pods: int, idle: int) -> tuple[list[dict], dict[tuple[str, str], float]]:
    """Scenario documents and each pod's GPU utilization (0–100). Half the workloads are
    Deployments (Deployment → ReplicaSet → pods), half bare ReplicaSets."""
    from simcluster.generate import namespace, node

    docs: list[dict] = []
    nodes = -(-pods // GPUS_PER_NODE)
    for i in range(nodes):
        docs.append(node(f"gpu-{i:05d}", pool="h100", product="NVIDIA-H100-80GB-HBM3", gpus=GPUS_PER_NODE,
                         cpu="192", memory="2063937Mi", created=rfc3339(BORN)))
    teams = 50
    for t in range(teams):
        docs.append(namespace(f"team-{t:02d}"))
    util: dict[tuple[str, str], float] = {}
    idle_workloads = idle // PODS_PER_WORKLOAD
    for w in range(pods // PODS_PER_WORKLOAD):
        ns, name = f"team-{w % teams:02d}", f"model-{w:05d}"
        labels = {"app": name}
        rs_name, rs_uid = name, str(uuid.uuid4())
        template = {"metadata": {"labels": labels}, "spec": {"containers": [{
            "name": "main", "image": "registry.example.com/model:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1", "cpu": "2"}}}]}}
        rs_meta = {"name": rs_name, "namespace": ns, "uid": rs_uid, "labels": labels,
                   "creationTimestamp": rfc3339(BORN)}
        if w % 2 == 0:
            dep_uid = str(uuid.uuid4())
            rs_name = f"{name}-7d9f8"
            rs_meta.update(name=rs_name, labels={**labels, "pod-template-hash": "7d9f8"}, ownerReferences=[
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": dep_uid, "controller": True}])
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": name, "namespace": ns, "uid": dep_uid, "labels": labels,
                                      "creationTimestamp": rfc3339(BORN)},
                         "spec": {"replicas": PODS_PER_WORKLOAD, "selector": {"matchLabels": labels},
                                  "template": template}})
        docs.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs_meta,
                     "spec": {"replicas": PODS_PER_WORKLOAD, "selector": {"matchLabels": labels},
                              "template": template},
                     "status": {"replicas": PODS_PER_WORKLOAD, "readyReplicas": PODS_PER_WORKLOAD}})
        for r in range(PODS_PER_WORKLOAD):
            index = w * PODS_PER_WORKLOAD + r
            pod_name = f"{rs_name}-{r:05d}"
            util[(ns, pod_name)] = 0.0 if w < idle_workloads else 60.0
            gpu = index % GPUS_PER_NODE
            docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()), "labels": dict(rs_meta["labels"]),
                "creationTimestamp": rfc3339(BORN),
                "annotations": {"simcluster.io/gpu-indices": str(gpu)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name,
                                     "uid": rs_uid, "controller": True}]},
                "spec": {**template["spec"], "nodeName": f"gpu-{index // GPUS_PER_NODE:05d}"},
                "status": {"phase": "Running", "startTime": rfc3339(BORN),
                           "conditions": [{"type": "Ready", "status": "True"}]}})
    return docs, util


def history(util: dict, window: timedelta, every: timedelta):
    from tests.prometheus_fixtures import Series, gpu_labels

    out = []
    times = []
    t = NOW - window - timedelta(minutes=5)
    while t <= NOW:
        times.append(t)
        t += every
    for i, ((ns, pod), value) in enumerate(util.items()):
        labels = gpu_labels(ns, pod, i % GPUS_PER_NODE, node=f"gpu-{i // GPUS_PER_NODE:05d}",
                            model="NVIDIA H100 80GB HBM3", scheme="exported")
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(m, value) for m in times]))
    for n in range(-(-len(util) // GPUS_PER_NODE)):   # node-exporter's DMI info, one per node
        out.append(Series("node_dmi_info", {"instance": f"gpu-{n:05d}", "product_name": "PowerEdge XE9680"},
                          [(m, 1.0) for m in times]))
    return out


def peer_promql(window_minutes: int) -> str:
    """gpu-pruner's query (query.promql.j2) as it renders with no namespace, model or power
    filter: one series per GPU of an exported_pod whose peak utilization was 0."""
    return ("sum by (Hostname, exported_container, exported_pod, exported_namespace, gpu, modelName) ("
            f'max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{exported_pod != ""}}[{window_minutes}m]) or '
            f'max_over_time(DCGM_FI_DEV_GPU_UTIL{{exported_pod != ""}}[{window_minutes}m]) / 100'
            ') * on (Hostname) group_left(node_type) (label_replace(label_replace(node_dmi_info, '
            '"Hostname", "$1", "instance", "(.+)"), "node_type", "$1", "product_name", "(.+)")) == 0')


class _Served:
    def __init__(self, url: str, kubeconfig_path: str):
        self.url, self.kubeconfig_path = url, kubeconfig_path


@contextlib.contextmanager
def served_cluster(docs: list[dict], workdir: Path):
    """The simulated cluster in its own process, as a real API server is: its objects do
    not sit in this process's heap (where they would slow every JSON parse here)."""
    import orjson

    workdir.mkdir(parents=True, exist_ok=True)
    scenario, kubeconfig = workdir / "scenario.json", workdir / "kubeconfig"
    scenario.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    proc = subprocess.Popen([sys.executable, "-m", "simcluster", "serve", "--scenario", str(scenario),
                             "--kubeconfig-out", str(kubeconfig)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()   # "simcluster serving at URL (...)", once loaded
        if "serving at" not in line:
            raise RuntimeError(f"simcluster did not start: {line!r}")
        url = line.split("serving at ", 1)[1].split()[0]
        while not kubeconfig.exists() or "kubeconfig written" not in proc.stdout.readline():
            if proc.poll() is not None:
                raise RuntimeError("simcluster exited")
        yield _Served(url, str(kubeconfig))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _Counted:
    """Bytes received by this process over sockets (HTTP answers of Kubernetes and Prometheus)."""
    total = 0

    @classmethod
    def install(cls) -> None:
        import socket

        recv_into = socket.socket.recv_into

        def counting(self, buffer, *args, **kwargs):
            n = recv_into(self, buffer, *args, **kwargs)
            cls.total += n
            return n

        socket.socket.recv_into = counting


def _vm(field: str) -> int:
    """KiB, from /proc/self/status (VmRSS now, VmHWM the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def django_start(database: str, *, migrate: bool = False) -> None:
    """Django on the bench's SQLite file, as a worker process starts it: migrated once by
    a process of its own (`--migrate`), so that the worker's memory holds no migration code
    (about 20 MiB of it) that a real worker never loads."""
    os.environ.update(DATABASE_URL=f"sqlite:///{database}", VAR_DIR=str(Path(database).parent),
                      DJANGO_SETTINGS_MODULE="config.settings", DJANGO_SECRET_KEY="bench-only-" + "x" * 50)
    os.environ.pop("KUBECONFIG", None)
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def worker(args) -> int:
    """One scenario, in its own process: prints one JSON line of figures."""

    folder = Path(args.database).parent
    django_start(args.database)
    try:
        _Counted.install()
        import orjson
        import urllib3

        from clusters.kube import KubeGateway
        from clusters.prometheus import PrometheusGateway
        from clusters.snapshot import POD_LIST, gc_paused
        from pruning.services import PruneParams, prune_run_execute

        now = datetime.fromisoformat(args.now)
        kube = KubeGateway.from_kubeconfig(args.kubeconfig)
        prom = PrometheusGateway(args.prometheus)
        params = PruneParams(run_mode="dry-run", max_scale_downs=10_000)
        # Ten connections kept, as many as the replay has requests in flight: gpu-pruner's
        # client (kube-rs on hyper) keeps every idle connection to a host, so its ten
        # concurrent GETs never reconnect (a smaller pool closed and reopened connections).
        http = urllib3.PoolManager(maxsize=10)
        api = args.api.rstrip("/")

        def pass_once():
            return prune_run_execute(kube_gateway=kube, prometheus=prom, params=params, now=now, actor="bench")

        query = params.query()
        pool = ThreadPoolExecutor(max_workers=10)

        def promql(expr: str) -> list:
            answer = http.request("POST", args.prometheus + "/api/v1/query",
                                  fields={"query": expr, "time": str(now.timestamp())}, encode_multipart=False)
            return orjson.loads(answer.data)["data"]["result"]

        def get(path: str):
            answer = http.request("GET", api + path)
            return orjson.loads(answer.data) if answer.status == 200 else None

        def floor_once():
            candidates, _census = pool.map(promql, [query.candidates_promql(), query.census_promql()])
            pods = sorted({(r["metric"]["exported_namespace"], r["metric"]["exported_pod"]) for r in candidates})
            followup = pool.submit(promql, query.followup_promql(pods))   # evaluated while the pods are read
            if not args.few:
                with gc_paused():   # as the pass reads its pages
                    POD_LIST.decode(http.request("GET", f"{api}/api/v1/pods").data)
                followup.result()
                return
            # Each idle pod, then each owner up its chain once, ten GETs at a time.
            read = list(pool.map(lambda key: get(f"/api/v1/namespaces/{key[0]}/pods/{key[1]}"), pods))
            followup.result()
            owners = sorted({(ns, pod["metadata"]["ownerReferences"][0]["name"]) for (ns, _), pod in zip(pods, read)})
            sets = list(pool.map(lambda key: (key[0], get(f"/apis/apps/v1/namespaces/{key[0]}/replicasets/{key[1]}")),
                                 owners))
            deployments = sorted({(ns, ref["name"]) for ns, rs in sets
                                  for ref in rs["metadata"].get("ownerReferences") or ()})
            list(pool.map(lambda key: get(f"/apis/apps/v1/namespaces/{key[0]}/deployments/{key[1]}"), deployments))

        def peer_walk(series: dict) -> int:
            """One idle GPU's pod and its owners, as gpu-pruner's find_root_object walks them."""
            ns, name = series["metric"]["exported_namespace"], series["metric"]["exported_pod"]
            pod = get(f"/api/v1/namespaces/{ns}/pods/{name}")
            calls = 1
            if pod is None or pod["status"].get("phase") == "Pending":
                return calls
            for ref in pod["metadata"].get("ownerReferences") or ():
                if ref["kind"] == "ReplicaSet":
                    rs = get(f"/apis/apps/v1/namespaces/{ns}/replicasets/{ref['name']}")
                    calls += 1
                    dep = [r for r in (rs or {}).get("metadata", {}).get("ownerReferences") or ()
                           if r["kind"] == "Deployment"]
                    if dep:
                        get(f"/apis/apps/v1/namespaces/{ns}/deployments/{dep[0]['name']}")
                        calls += 1
                    break
            return calls

        def peer_once() -> int:
            idle_gpus = promql(peer_promql(params.window_seconds // 60))
            return sum(pool.map(peer_walk, idle_gpus))   # ten at a time (buffer_unordered(10))

        rss_before = _vm("VmRSS")   # Django set up, nothing read
        pass_once()   # untimed: imports, connections, caches warm
        floor_once()
        peer_once()
        # The pass's peak RSS: the kernel's high-water mark, reset just before each pass
        # (ru_maxrss would also hold the parent's size from before exec).
        rss_peak = 0
        passes, floors, peers, calls, bytes_in, queries = [], [], [], [], [], 0
        for _ in range(args.repeat):
            start_bytes, start = _Counted.total, time.perf_counter()
            floor_once()
            floors.append(time.perf_counter() - start)
            floor_bytes = _Counted.total - start_bytes
            prom_calls = prom.calls
            Path("/proc/self/clear_refs").write_text("5")
            start_bytes, start = _Counted.total, time.perf_counter()
            run = pass_once()
            passes.append(time.perf_counter() - start)
            bytes_in.append(_Counted.total - start_bytes)
            calls.append(run.kube_api_calls)
            queries = prom.calls - prom_calls
            rss_peak = max(rss_peak, _vm("VmHWM"))
            start_bytes, start = _Counted.total, time.perf_counter()
            peer_calls = peer_once()
            peers.append(time.perf_counter() - start)
            peer_bytes = _Counted.total - start_bytes
        print(json.dumps({
            "pods_seen": run.pods_seen, "idle": run.idle_candidates, "planned": run.planned,
            "pass": passes, "floor": floors, "peer": peers, "kube_calls": calls, "prom_queries": queries,
            "bytes": bytes_in, "floor_bytes": floor_bytes, "peer_calls": peer_calls, "peer_bytes": peer_bytes,
            "rss_before_mib": rss_before / 1024, "rss_peak_mib": rss_peak / 1024,
        }))
        pool.shutdown()
        kube.close()
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scenario(pods: int, idle: int, repeat: int, workdir: Path) -> dict:
    from tests.prometheus_fixtures import PrometheusServer

    docs, util = cluster_docs(pods, idle)
    server = PrometheusServer(workdir / f"prom-{pods}-{idle}")
    server.backfill(history(util, timedelta(seconds=1800), timedelta(seconds=60)))
    server.start()
    try:
        with served_cluster(docs, workdir / f"cluster-{pods}-{idle}") as cluster:
            del docs, util
            database = workdir / f"worker-{pods}-{idle}" / "db.sqlite3"
            database.parent.mkdir(parents=True)
            subprocess.run([sys.executable, __file__, "--migrate", "--database", str(database)], check=True, cwd=ROOT)
            done = subprocess.run([sys.executable, __file__, "--worker", "--database", str(database),
                                   "--kubeconfig", cluster.kubeconfig_path,
                                   "--api", cluster.url, "--prometheus", server.url, "--now", NOW.isoformat(),
                                   "--repeat", str(repeat)] + (["--few"] if idle * 20 < pods else []),
                                  capture_output=True, text=True, cwd=ROOT, timeout=3600)
            if done.returncode:
                raise RuntimeError(f"worker failed: {done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.stop()


def _mmm(values, fmt="{:.3f}") -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,50000", help="GPU pods per cluster, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--migrate", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--kubeconfig", "--api", "--prometheus", "--now", "--database"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--few", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.migrate:
        django_start(args.database, migrate=True)
        return 0
    if args.worker:
        return worker(args)
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        print("needs prometheus and promtool on PATH (apt-get install prometheus, or make test)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="prune-bench-") as tmp:
        for size in (int(x) for x in args.sizes.split(",")):
            for idle in (size // 500, size // 5):   # 20 and 2,000 at 10,000 pods
                r = scenario(size, idle, args.repeat, Path(tmp))
                rows.append((size, idle, r))
                ratios = [p / f for p, f in zip(r["pass"], r["floor"])]
                peer = [p / g for p, g in zip(r["pass"], r["peer"])]
                print(f"{size:>6} pods, {idle:>5} idle ({r['pods_seen']} seen, {r['idle']} looked idle, "
                      f"{r['planned']} owners planned): pass {_mmm(r['pass'])} s (min/median/max), "
                      f"floor {_mmm(r['floor'])} s, ratio {_mmm(ratios, '{:.2f}')}; "
                      f"peer replay {_mmm(r['peer'])} s ({r['peer_calls']} API calls + 1 query, "
                      f"{r['peer_bytes'] / 1000:.1f} kB), pass/peer {_mmm(peer, '{:.2f}')}; "
                      f"{r['kube_calls'][-1]} API calls + {r['prom_queries']} queries; "
                      f"{statistics.median(r['bytes']) / 1000:.1f} kB read (floor {r['floor_bytes'] / 1000:.1f} kB); "
                      f"peak RSS {r['rss_peak_mib']:.0f} MiB during a timed pass ({r['rss_before_mib']:.0f} MiB before any pass)",
                      flush=True)
    by = {(s, i * 500 // s if i * 20 < s else 5): r for s, i, r in rows}
    sizes = sorted({s for s, _, _ in rows})
    if len(sizes) == 2:
        for kind, label in ((1, "few idle"), (5, "many idle")):
            a, b = by.get((sizes[0], kind)), by.get((sizes[1], kind))
            if a and b:
                print(f"growth {sizes[0]} -> {sizes[1]} pods, {label}: pass median "
                      f"{statistics.median(b['pass']) / statistics.median(a['pass']):.2f}x, floor median "
                      f"{statistics.median(b['floor']) / statistics.median(a['floor']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
