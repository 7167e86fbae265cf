"""Benchmark: one dry-run prune pass over 10,000 GPU pods (2,000 idle) against its floor.

    .venv/bin/python bench/prune_pass.py [--pods 10000] [--idle 2000] [--repeat 3]

Floor, measured in the same run: the pass's one Prometheus query (same PromQL, same
evaluation time) plus one raw cluster-wide pod LIST over HTTP parsed with orjson.
The pass: `prune_run_execute` in dry-run mode — query, parse, cluster LISTs, owner walk,
plan, and the PruneRun/PruneDecision rows written. Target: pass / floor <= 2.
It also prints the Kubernetes API calls of a pass at two cluster sizes (target: equal).
Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "pruning")]

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
    from prometheus_fixtures import Series, gpu_labels

    out = []
    times = []
    t = NOW - window - timedelta(minutes=5)
    while t <= NOW:
        times.append(t)
        t += every
    for i, ((ns, pod), value) in enumerate(util.items()):
        labels = gpu_labels(ns, pod, i % GPUS_PER_NODE, node=f"gpu-{i // GPUS_PER_NODE:05d}",
                            model="NVIDIA H100 80GB HBM3")
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(m, value) for m in times]))
    return out


def setup_django(var_dir: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # A throwaway key for this process: settings refuse to start without one unless
    # DJANGO_DEBUG is on, and DEBUG would record every SQL query and skew the timings.
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["VAR_DIR"] = var_dir
    os.environ["DATABASE_URL"] = f"sqlite:///{var_dir}/bench.sqlite3"
    os.environ["LOG_LEVEL"] = "WARNING"
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)


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


def median_time(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(pods: int, idle: int, repeat: int, workdir: Path) -> dict:
    import orjson
    import urllib3

    from clusters.kube import KubeGateway
    from clusters.prometheus import PrometheusGateway
    from prometheus_fixtures import PrometheusServer
    from pruning.services import PruneParams, prune_run_execute
    docs, util = cluster_docs(pods, idle)
    params = PruneParams(run_mode="dry-run")
    t0 = time.perf_counter()
    server = PrometheusServer(workdir / f"prom-{pods}")
    server.backfill(history(util, timedelta(seconds=params.window_seconds), timedelta(seconds=60)))
    server.start()
    setup_s = time.perf_counter() - t0
    try:
        with served_cluster(docs, workdir / f"cluster-{pods}") as cluster:
            kube = KubeGateway.from_kubeconfig(cluster.kubeconfig_path)
            prom = PrometheusGateway(server.url)
            promql = params.query().promql()
            http = urllib3.PoolManager()

            def raw_list():
                response = http.request("GET", f"{cluster.url}/api/v1/pods")
                return orjson.loads(response.data)

            raw_list(), prom.query(promql, at=NOW)  # warm both servers' caches alike
            # Interleaved, so load from elsewhere on the machine hits floor and pass alike.
            query_t, list_t, pass_t = [], [], []
            for _ in range(repeat):
                query_t.append(median_time(lambda: prom.query(promql, at=NOW), 1)[0])
                list_s, listed = median_time(raw_list, 1)
                list_t.append(list_s)
                pass_s, run = median_time(lambda: prune_run_execute(
                    kube_gateway=kube, prometheus=prom, params=params, now=NOW, actor="bench"), 1)
                pass_t.append(pass_s)
            samples = prom.query(promql, at=NOW)
            query_s, list_s, pass_s = (statistics.median(x) for x in (query_t, list_t, pass_t))
            kube.close()
    finally:
        server.stop()
    return {"pods": len(listed["items"]), "series": len(samples), "idle_seen": run.idle_candidates,
            "query_s": query_s, "list_s": list_s, "floor_s": query_s + list_s, "pass_s": pass_s,
            "ratio": pass_s / (query_s + list_s), "kube_calls": run.kube_api_calls, "setup_s": setup_s,
            "planned": run.planned}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--idle", type=int, default=2_000)
    ap.add_argument("--small", type=int, default=1_000, help="second size, for the API call count")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="prune-bench-") as tmp:
        setup_django(tmp)
        results = [measure(args.pods, args.idle, args.repeat, Path(tmp))]
        if args.small:
            results.append(measure(args.small, args.small // 5, args.repeat, Path(tmp)))
    for r in results:
        print(f"{r['pods']:>6} GPU pods ({r['series']} series in the answer, {r['idle_seen']} looked idle, "
              f"{r['planned']} owners planned):")
        print(f"    floor: query {r['query_s']:.3f}s + raw pod LIST {r['list_s']:.3f}s = {r['floor_s']:.3f}s")
        print(f"    dry-run pass {r['pass_s']:.3f}s  ->  ratio {r['ratio']:.2f} (target <= 2)")
        print(f"    Kubernetes API calls per pass: {r['kube_calls']}")
    if len(results) == 2:
        same = results[0]["kube_calls"] == results[1]["kube_calls"]
        print(f"API calls independent of pod count: {'yes' if same else 'NO'} "
              f"({results[1]['kube_calls']} at {results[1]['pods']} pods, "
              f"{results[0]['kube_calls']} at {results[0]['pods']} pods)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
