"""Benchmark: bench/fleet.py's cycle of every periodic job, on ONE real cluster of 5,000 KWOK
nodes (upstream kube-apiserver, etcd, controller-manager and scheduler of realcluster/), with
1, 2 and 4 worker processes; and kubectl's paged `get pods -A` against one unpaged LIST there.

    sudo .venv/bin/python bench/fleet_real.py [--pods 50000] [--workers 1,2,4] [--kubectl-runs 5]

Needs root (the tier's network namespace), the tier's binaries (`python -m realcluster build
--with knative --with kserve`: the Knative and KServe CRDs are read from their modules), kubectl
on PATH, PostgreSQL on 127.0.0.1:5432, Redis on 127.0.0.1:6379, and `prometheus` + `promtool`
for the prune pass (`--no-prune` leaves it out). No other realcluster tier may be running.
Memory: about 9 GiB at 50,000 pods (measured: the apiserver 5.1 GiB, etcd 1.2 GiB, the
controller-manager, scheduler and KWOK ~1 GiB each); ~10 minutes until all pods are Running.

What runs:
- `python -m realcluster up` with the ReplicaSet controller off (the List's pods come owned
  by their ReplicaSets; with it on, each ReplicaSet would make its pods itself first);
- the objects of fleet.py's cluster 0 (the generator's nodes, pods, ReplicaSets, org
  namespaces, a pynode per org), loaded by `realcluster.bulkload` from inside the tier's
  network namespace: pods already bound (spec.nodeName), many creates in flight; KWOK then
  plays each node's kubelet and marks the pods Running (timed until all are);
- Knative's and KServe's CRDs only, not their controllers: the pynodes are Knative Services
  the product reads and patches; Knative's controllers would add a Revision, a Deployment and
  a pod per org (and the autoscaler's per-pod scrapes) to a 2-core machine already carrying
  the apiserver at 50,000 pods. The `knative-serving` namespace is labelled as fleet.py's;
- kubectl `get pods -A` paged by 500 (its default) and unpaged (`--chunk-size=0`), `-v=4`,
  alternating, with its client-side throttling lines counted;
- the product (its database, broker, a Prometheus with DCGM history for every GPU) reaching
  the apiserver as tests/realcluster does, through the tier's relay on the host's 127.0.0.1;
  then fleet.py's cycles and table, for this one cluster.
Everything it starts lives in one temporary folder and is stopped and removed at the end,
also on Ctrl-C or an error. Prints a table; not a test.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402 - the simulated fleet's pieces

ROOT, GIB, MIB = fleet.ROOT, fleet.GIB, fleet.MIB
READY_LINE = re.compile(r"realcluster ready in ([\d.]+) s at (\S+); kubeconfig (\S+); memory (\d+) MiB")
INSIDE_URL = "https://10.0.0.1:6443"
UP_TIMEOUT_S = 180.0
RUNNING_TIMEOUT_S = 900.0
COMPONENTS = ("kube-apiserver", "etcd", "kwok", "kube-controller-manager", "kube-scheduler")
PR_SET_PDEATHSIG = 1
# 5,000 nodes renewing 40 s Leases every 10 s were 500 writes/s: on 2 shared cores KWOK fell
# behind (113-287 nodes NotReady while loading) and marked pods Running at ~20/s. Renewed every
# 30 s instead (the node lifecycle controller's grace period follows, see realcluster up).
NODE_LEASE_SECONDS = 120
AGE = fleet.WINDOW + timedelta(minutes=10)   # PRUNER_GRACE_SECONDS' 5 minutes, and 5 to spare


def running_tier() -> list[str]:
    """Processes of a control plane already running on this machine (kube-apiserver, etcd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in ("kube-apiserver", "etcd"):
                found.append(f"{comm} (pid {entry.name})")
    return found


def memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Tier:
    """`python -m realcluster up` in a child process; `stop` brings it down in order."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.kubeconfig = folder / "kubeconfig"
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "realcluster", "up", "--controllers", "*,-replicaset-controller",
             "--node-lease-seconds", str(NODE_LEASE_SECONDS),
             "--kubeconfig-out", str(self.kubeconfig), "--state-dir", str(folder / "tier")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            # If the bench is killed, the tier goes down with it (SIGTERM: in order).
            preexec_fn=lambda: ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.output.append(line)
                if READY_LINE.search(line):
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("realcluster up did not become ready:\n" + "".join(self.output[-30:]))
        print("  " + next(line for line in self.output if READY_LINE.search(line)).strip(), flush=True)

    def inside(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run `argv` in the tier's network namespace (where the apiserver is 10.0.0.1:6443)."""
        return subprocess.run(["nsenter", "-t", str(self.proc.pid), "-n", *argv], cwd=ROOT, **kw)

    def components(self) -> dict[str, int]:
        pids = {}
        for pid in fleet.children(self.proc.pid):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            name = next((c for c in COMPONENTS if c.startswith(comm) or comm.startswith(c[:15])), None)
            if name:
                pids[name] = pid
        return pids

    def memory(self, field: str = "VmRSS") -> dict[str, int]:
        return {name: fleet.rss(pid, field) for name, pid in self.components().items()}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def api_for(kubeconfig: Path):
    import base64
    import ssl

    import yaml

    from realcluster.client import Api

    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    api = Api(cluster["server"], token=config["users"][0]["user"]["token"], timeout=300)
    api.context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return api


def count(api, path: str, selector: str = "") -> int:
    """Objects at `path` (paged by 5,000), optionally with a field selector."""
    from urllib.parse import quote

    total, token = 0, ""
    while True:
        query = f"?limit=5000&continue={quote(token)}" + (f"&fieldSelector={quote(selector)}" if selector else "")
        body = api.request("GET", path + query).body
        if not isinstance(body, dict) or "items" not in body:
            raise RuntimeError(f"LIST {path}: {str(body)[:300]}")
        total += len(body["items"])
        token = body["metadata"].get("continue") or ""
        if not token:
            return total


def nodes_ready(api) -> tuple[int, int]:
    body = api.request("GET", "/api/v1/nodes").body
    items = body.get("items", [])
    ready = sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (n.get("status") or {}).get("conditions", [])) for n in items)
    return ready, len(items)


def wait_running(api, pods: int) -> float:
    """Seconds until no pod is other than Running (KWOK has played every kubelet). Each check
    asks for one pod that is not Running: the check costs little while the apiserver is busy."""
    began = time.monotonic()
    while True:
        body = api.request("GET", "/api/v1/pods?limit=1&fieldSelector=status.phase%21%3DRunning").body
        if not isinstance(body, dict) or "items" not in body:
            raise RuntimeError(f"LIST pods: {str(body)[:300]}")
        if not body["items"]:
            return time.monotonic() - began
        if time.monotonic() - began > RUNNING_TIMEOUT_S:
            raise RuntimeError(f"pods of {pods} still not Running after {RUNNING_TIMEOUT_S:.0f} s")
        time.sleep(5)


def kubectl_get_pods(kubectl: str, kubeconfig: Path, chunk: int | None) -> tuple[float, int, int]:
    """One `kubectl get pods -A` (paged by its default 500, or `--chunk-size=chunk`): seconds,
    lines printed, client-side throttling waits kubectl logged (-v=4)."""
    argv = [kubectl, "--kubeconfig", str(kubeconfig), "get", "pods", "-A", "-v=4"]
    if chunk is not None:
        argv.append(f"--chunk-size={chunk}")
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr[-500:]}")
    waits = sum("client-side throttling" in line for line in done.stderr.splitlines())
    return seconds, done.stdout.count("\n") - 1, waits


def kubectl_compare(kubectl: str, kubeconfig: Path, runs: int) -> dict:
    paged, unpaged = [], []
    for run in range(runs):
        for chunk, into in ((None, paged), (0, unpaged)) if run % 2 == 0 else ((0, unpaged), (None, paged)):
            into.append(kubectl_get_pods(kubectl, kubeconfig, chunk))
    version = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True)
    client = (json.loads(version.stdout or "{}").get("clientVersion") or {}).get("gitVersion", "?")
    return {"paged": paged, "unpaged": unpaged, "kubectl": client}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=fleet.NODES, help=f"KWOK nodes (default {fleet.NODES:,})")
    parser.add_argument("--pods", type=int, default=fleet.PODS, help=f"pods (default {fleet.PODS:,})")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    parser.add_argument("--kubectl-runs", type=int, default=5, help="kubectl runs each way (default 5; 0: none)")
    parser.add_argument("--concurrency", type=int, default=32, help="creates in flight while loading (default 32)")
    parser.add_argument("--no-prune", action="store_true", help="leave the prune pass out (no Prometheus)")
    parser.add_argument("--no-cycles", action="store_true", help="load and measure kubectl only")
    args = parser.parse_args(argv)
    workers = fleet.worker_counts(args.workers)
    if not (1 <= args.nodes <= 10000 and 0 <= args.pods <= 100000):
        raise SystemExit(f"--nodes must be 1..10000 and --pods 0..100000, got {args.nodes} and {args.pods}")
    if not 0 <= args.kubectl_runs <= 20:
        raise SystemExit("--kubectl-runs must be 0..20")
    if not 1 <= args.concurrency <= 256:
        raise SystemExit("--concurrency must be 1..256")
    if os.geteuid() != 0:
        raise SystemExit("the real tier runs in its own network namespace, which needs root")
    from realcluster.build import BuildError, binaries

    try:
        binaries(("knative", "kserve"))
    except BuildError as exc:
        raise SystemExit(f"{exc} (run .venv/bin/python -m realcluster build --with knative --with kserve)") from None
    kubectl = shutil.which("kubectl")
    if args.kubectl_runs and not kubectl:
        raise SystemExit("kubectl is not on PATH (or --kubectl-runs 0)")
    prune = not (args.no_prune or args.no_cycles)
    if prune:
        fleet.prometheus_check()
    others = running_tier()
    if others:
        raise SystemExit(f"a control plane is already running here ({', '.join(others)}): one tier at a time")
    available = memory_available()
    print(f"fleet bench, real tier: {args.nodes:,} KWOK nodes / {args.pods:,} pods; {os.cpu_count()} CPU(s); "
          f"{available / GIB:.1f} GiB available; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop and remove everything, as on Ctrl-C
    folder = Path(tempfile.mkdtemp(prefix="fleet-real-"))
    os.chmod(folder, 0o755)
    tier = prometheus = None
    product = fleet.Product(folder)
    workers_started: list = []
    try:
        import orjson

        from realcluster import knative, kserve
        from realcluster.pki import INSIDE_IP

        began = time.monotonic()
        docs, gpus = fleet.cluster_docs(0, args.nodes, args.pods)
        docs[:0] = [d for d in knative.manifests(INSIDE_IP) if d.get("kind") == "CustomResourceDefinition"]
        docs[:0] = kserve.crds()
        kinds = {}
        for d in docs:
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        (folder / "docs.json").write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        del docs
        print(f"  generated in {time.monotonic() - began:.1f} s: " + ", ".join(f"{n:,} {k}" for k, n in kinds.items()),
              flush=True)

        tier = Tier(folder)
        began = time.monotonic()
        loaded = tier.inside([sys.executable, "-m", "realcluster.bulkload", "--kubeconfig", str(tier.kubeconfig),
                              "--server", INSIDE_URL, "--docs", str(folder / "docs.json"),
                              "--concurrency", str(args.concurrency)], stdout=subprocess.PIPE, text=True)
        load_s = time.monotonic() - began
        if loaded.returncode != 0:
            raise RuntimeError(f"bulk load failed (exit {loaded.returncode})")
        summary = json.loads(loaded.stdout.strip().splitlines()[-1])
        (folder / "docs.json").unlink()
        api = api_for(tier.kubeconfig)
        running_s = wait_running(api, kinds.get("Pod", 0))
        pods_now = count(api, "/api/v1/pods")
        ready, total_nodes = nodes_ready(api)
        loaded_memory = tier.memory()
        print(f"  loaded in {load_s:.1f} s ({summary['seconds']}; {summary['retries']} retries; created "
              f"{summary['created']}; skipped {summary['skipped'] or 'none'}); all pods Running "
              f"{running_s:.1f} s later: {pods_now:,} pods, {ready:,} of {total_nodes:,} nodes Ready", flush=True)
        print("  memory loaded: " + ", ".join(f"{n} {b / MIB:.0f} MiB" for n, b in loaded_memory.items())
              + f" (total {sum(loaded_memory.values()) / GIB:.2f} GiB)", flush=True)

        if args.kubectl_runs:
            result = kubectl_compare(kubectl, tier.kubeconfig, args.kubectl_runs)
            paged = [s for s, _, _ in result["paged"]]
            unpaged = [s for s, _, _ in result["unpaged"]]
            print(f"\nkubectl {result['kubectl']} get pods -A at {pods_now:,} pods, {args.kubectl_runs} runs each "
                  f"(min/median/max s), through the tier's relay:", flush=True)
            print(f"  paged by 500 (default):  {spread(paged)}; lines {sorted({n for _, n, _ in result['paged']})}; "
                  f"client-side throttling waits logged per run {[w for _, _, w in result['paged']]}")
            print(f"  unpaged (--chunk-size=0): {spread(unpaged)}; lines {sorted({n for _, n, _ in result['unpaged']})}; "
                  f"throttling waits {[w for _, _, w in result['unpaged']]}")
            print(f"  paged / unpaged: {min(paged) / min(unpaged):.2f} (min), "
                  f"{statistics.median(paged) / statistics.median(unpaged):.2f} (median); load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        if args.no_cycles:
            return 0

        product.open()
        # The apiserver stamps each pod's creation now, and the pruner counts a pod idle only once
        # it has lived through the window and the grace period: the history Prometheus holds
        # ends AGE later, and the prune pass runs with the workers' clock there (as fleet.py's).
        history_end = datetime.now(timezone.utc).replace(microsecond=0) + AGE
        url = ""
        if prune:
            prometheus = fleet.prometheus_start(folder / "prometheus", gpus, history_end)
            url = prometheus.url
            print(f"  Prometheus with {len(gpus):,} GPUs' history: RSS {fleet.rss(prometheus.proc.pid) / MIB:.0f} MiB",
                  flush=True)
        del gpus
        cluster = product.register("real-0", str(tier.kubeconfig), url)
        measured = fleet.cycles(product, [cluster], workers, prune=prune, history_end=history_end,
                                on_worker=workers_started.append)
        fleet.report(measured, [cluster], f"fleet: 1 real cluster (kube-apiserver v1.32.13, KWOK) x "
                                          f"{total_nodes:,} nodes / {pods_now:,} pods")
        after, peak = tier.memory(), tier.memory("VmHWM")
        pods_after = count(api, "/api/v1/pods")
        ready, total_nodes = nodes_ready(api)
        print("  tier memory after the cycles (peak): " + ", ".join(
            f"{n} {after.get(n, 0) / MIB:.0f} ({peak.get(n, 0) / MIB:.0f}) MiB" for n in after)
            + (f"; Prometheus peak {fleet.rss(prometheus.proc.pid, 'VmHWM') / MIB:.0f} MiB" if prometheus else ""))
        print(f"  after the cycles: {pods_after:,} pods, {ready:,} of {total_nodes:,} nodes Ready")
        return 0
    finally:
        for worker in workers_started:
            worker.stop()
        if prometheus is not None:
            try:
                prometheus.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest anyway
                print(f"  (Prometheus stop: {exc})", file=sys.stderr)
        product.close()
        if tier is not None:
            tier.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
