"""Benchmark: binpack deletion costs at scale, and GPU nodes freed with vs without them.

    .venv/bin/python bench/binpack_plan.py [--scales 1,5] [--runs 5] [--churn 200] [--skip-scale]
                                           [--snapshot-only]

Part 1, per scale, on a simulated cluster over HTTP (1,000 8-GPU nodes / 10,000 pods at
1x, every one on a GPU node, see `gpu_cluster_docs`; 5,000 / 50,000 at 5x):
- snapshot through the gateway, min/median/max of --runs; floor: the same LIST calls the
  snapshot makes (nodes and pods, pages of SNAPSHOT_PAGE_SIZE) over one keep-alive urllib3
  pool, each page decoded as the snapshot decodes it (msgspec, into just the fields its
  views read) and let go, the collector paused as the snapshot pauses it (the least a
  snapshot must read); floor and snapshot back to back in each run,
  per-run ratios printed; the same again against one unpaged LIST of each (what the page
  size costs or saves); --snapshot-only stops there (no planning, no writes);
- planning, min/median/max of --runs (target < 1 s at 1x);
- apply with the product's options (BINPACK_MAX_WRITES caps a run's writes; the rest is
  the plan's `over_budget`): runs until the plan is within budget, counting them;
- then a rerun must write nothing, and after deleting `--churn` pods one more run must
  write exactly the pods whose cost changed, counted independently from two snapshots.

Part 2, the binpack demo scenario: 32 H100 nodes (8 GPUs), 12 Kthena ModelServings of
1- or 2-GPU single-pod groups placed the way the default scheduler spreads them (least
allocated node first), then every ModelServing scaled down by half, overnight style.
The same scenario runs twice on disjoint node sets of one cluster: once with the
costs written by the binpack service's code, once opted out (Kthena's default order,
highest index first). Prints whole GPU nodes freed by each. Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "capacity")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Settings only (no database is used): a throwaway key, as the other benches do.
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)

import django  # noqa: E402
import kubernetes  # noqa: E402
import urllib3  # noqa: E402

django.setup()

from _runs import Report, bench_arguments, paired, per_run, raw_lists, scales_of  # noqa: E402
from django.conf import settings  # noqa: E402

from capacity.binpack import planning  # noqa: E402
from capacity.binpack.services import _apply_one, binpack_options, opted_out_owners  # noqa: E402
from clusters import kube  # noqa: E402
from clusters.selectors import SNAPSHOT_PAGE_SIZE, snapshot_take  # noqa: E402
from simcluster.control import SimControl  # noqa: E402
from simcluster.generate import namespace as namespace_doc  # noqa: E402
from simcluster.generate import node as node_doc  # noqa: E402
from simcluster.generate import resources as resources_doc  # noqa: E402
from simcluster.testing import running_cluster  # noqa: E402

BASE_NODES, BASE_PODS = 1000, 10000


def costs_on_cluster(gateway) -> dict[tuple[str, str], str | None]:
    return {(p["metadata"]["namespace"], p["metadata"]["name"]):
            (p["metadata"].get("annotations") or {}).get(planning.DELETION_COST) for p in gateway.list(kube.PODS)}


def apply_all(gateway, *, runs: int = 1) -> tuple[planning.BinpackPlan, list[float], float, int]:
    """One binpack run with the product's options: (plan, planning seconds per run of
    `runs`, apply seconds, pods patched). The plan holds at most BINPACK_MAX_WRITES
    changes; `plan.over_budget` says how many wait for the next run."""
    snapshot = snapshot_take(gateway, now=datetime.now(timezone.utc))
    options = binpack_options(opted_out_owners=opted_out_owners(gateway))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        plan = planning.binpack_plan(snapshot, options=options)
        times.append(time.perf_counter() - t0)
    before = gateway.calls[("patch", "pods")]
    t0 = time.perf_counter()
    errors: list[str] = []
    for change in plan.changes:
        _apply_one(gateway, change, errors)
    if errors:
        raise SystemExit(f"write errors: {errors[:3]}")
    return plan, times, time.perf_counter() - t0, gateway.calls[("patch", "pods")] - before


def apply_until_within_budget(gateway, *, limit: int = 50) -> tuple[int, int]:
    """Binpack runs until a plan has nothing over budget: (runs, pods patched in all)."""
    runs = writes = 0
    while True:
        plan, _, _, written = apply_all(gateway)
        runs, writes = runs + 1, writes + written
        if not plan.over_budget:
            return runs, writes
        if runs >= limit:
            raise SystemExit(f"still {plan.over_budget} changes over budget after {runs} runs")


def gpu_cluster_docs(nodes: int, pods: int, seed: int = 1) -> list[dict]:
    """`nodes` 8-GPU nodes and `pods` Running pods, all on them, in ReplicaSets of 1-8
    pods placed at random (fragmented, as binpack finds a cluster): 1- or 2-GPU pods
    while GPUs last, then CPU-only pods. Every pod is one the planner costs.
    (`simcluster.generate` puts most pods on CPU nodes: it stops placing GPU pods at the
    first 8-GPU pod that finds no whole node free, 641 of 10,000 at the defaults.)"""
    rng = random.Random(seed)
    born = datetime(2026, 1, 1, tzinfo=timezone.utc)
    stamp = born.strftime("%Y-%m-%dT%H:%M:%SZ")
    docs: list[dict] = [node_doc(f"gpu-{i:05d}", pool="h100", product="NVIDIA-H100-80GB-HBM3", gpus=8, cpu="192",
                                 memory="2000Gi") for i in range(nodes)]
    free_gpus, used_pods = [8] * nodes, [0] * nodes
    orgs = max(1, pods // 40)
    docs += [namespace_doc(f"org-{i:04d}", org=f"org-{i:04d}") for i in range(orgs)]
    placed = workload = 0
    while placed < pods:
        ns, name = f"org-{workload % orgs:04d}", f"model-{workload:05d}"
        gpus = rng.choice((1, 1, 1, 2))
        replicas = min(rng.randint(1, 8), pods - placed)
        rs_uid = str(uuid.UUID(int=rng.getrandbits(128)))
        labels = {"app": name, "capacity.io/component": "model"}
        fits = [i for i in rng.sample(range(nodes), min(nodes, 64)) if free_gpus[i] >= gpus and used_pods[i] < 110]
        if not fits:
            gpus = 0
            fits = [i for i in range(nodes) if used_pods[i] < 110]
        spec = {"containers": [{"name": "main", "image": f"registry.example.com/{name}:1",
                                "resources": resources_doc(cpu="2", memory="8Gi", gpus=gpus)}],
                "terminationGracePeriodSeconds": 30}
        for r in range(replicas):
            fits = [i for i in fits if free_gpus[i] >= gpus and used_pods[i] < 110] or fits
            host = rng.choice(fits)
            first = 8 - free_gpus[host]
            free_gpus[host] -= gpus
            used_pods[host] += 1
            pod_name = f"{name}-{r}"
            annotations = {"simcluster.io/gpu-indices": ",".join(str(g) for g in range(first, first + gpus))} \
                if gpus else {}
            docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod_name, "namespace": ns, "labels": dict(labels), "annotations": annotations,
                "creationTimestamp": stamp, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{ns}/{pod_name}")),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": rs_uid,
                                     "controller": True, "blockOwnerDeletion": True}]},
                "spec": {**spec, "nodeName": f"gpu-{host:05d}"},
                "status": {"phase": "Running", "startTime": stamp,
                           "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                                          for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}})
        docs.append({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                     "metadata": {"name": name, "namespace": ns, "uid": rs_uid, "labels": dict(labels),
                                  "creationTimestamp": stamp},
                     "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                              "template": {"metadata": {"labels": dict(labels)}, "spec": spec}}})
        placed += replicas
        workload += 1
    return docs


def part1(scale: int, runs: int, churn: int, report: Report, snapshot_only: bool = False) -> None:
    nodes, pods = BASE_NODES * scale, BASE_PODS * scale
    docs = gpu_cluster_docs(nodes, pods)
    print(f"scale {scale}x: {nodes} nodes, {pods} pods; BINPACK_MAX_WRITES={settings.BINPACK_MAX_WRITES}",
          flush=True)
    with running_cluster(docs) as url:
        del docs
        gateway = kube.KubeGateway.from_kubeconfig(str(url.kubeconfig_path), name="bench")
        now = datetime.now(timezone.utc)
        pool = urllib3.PoolManager(maxsize=1)
        floor = lambda: raw_lists(pool, str(url), ("/api/v1/nodes", "/api/v1/pods"),   # noqa: E731
                                  page_size=SNAPSHOT_PAGE_SIZE)
        floor(), snapshot_take(gateway, now=now)   # warm up: connections, the server's first pages
        floors, samples = paired(runs, floor, lambda: snapshot_take(gateway, now=now))
        report.add(scale, "snapshot", samples, floor_samples=floors, note=per_run(samples, floors),
                   floor=f"same LISTs raw (urllib3 + the typed decode, pages of {SNAPSHOT_PAGE_SIZE}, "
                         "collector paused)")
        # The same against one unpaged LIST each: what paging by SNAPSHOT_PAGE_SIZE (chosen
        # for memory: one page of raw JSON held at a time) costs or saves in time.
        unpaged = lambda: raw_lists(pool, str(url), ("/api/v1/nodes", "/api/v1/pods"),   # noqa: E731
                                    page_size=None)
        floors, samples = paired(runs, unpaged, lambda: snapshot_take(gateway, now=now))
        report.add(scale, "snapshot vs unpaged LISTs", samples, floor_samples=floors, note=per_run(samples, floors),
                   floor="one unpaged LIST each raw (urllib3 + the typed decode, collector paused)")
        pool.clear()
        if snapshot_only:
            gateway.close()
            return
        plan, plan_times, apply_s, writes = apply_all(gateway, runs=runs)
        report.add(scale, "planning", plan_times, note=f"{len(plan.changes)} costs planned, "
                   f"{plan.over_budget} over budget, {len(plan.skipped)} skipped")
        more_runs, more_writes = (0, 0) if not plan.over_budget else apply_until_within_budget(gateway)
        print(f"  [apply] first run patched {writes} pods in {apply_s:.1f} s; {more_runs} more run(s) "
              f"within BINPACK_MAX_WRITES patched {more_writes}", flush=True)
        plan2, plan2_times, _, writes2 = apply_all(gateway)
        print(f"  [rerun] once within budget: {len(plan2.changes)} planned, {writes2} patched (must be 0), "
              f"{plan2.unchanged} unchanged, {plan2.over_budget} over budget "
              f"{'OK' if writes2 == 0 and not plan2.over_budget else 'FAILED'}", flush=True)
        before = costs_on_cluster(gateway)
        rng = random.Random(2)
        victims = rng.sample(sorted(k for k, v in before.items() if v is not None), churn)
        for ns, name in victims:
            gateway.delete(kube.PODS, name, namespace=ns, grace_period_seconds=0)
        SimControl(url).advance(0)
        churn_runs, writes3 = apply_until_within_budget(gateway)
        after = costs_on_cluster(gateway)
        # A pod the ReplicaSet created to replace a deleted one changed from no cost to one.
        changed = sum(1 for k, v in after.items() if before.get(k) != v)
        replacements = sum(1 for k in after if k not in before)
        print(f"  [churn] {churn} pods deleted, {replacements} replacements: {churn_runs} run(s), {writes3} patched, "
              f"{changed} pods whose cost changed {'OK (equal)' if writes3 == changed else 'FAILED (must be equal)'}",
              flush=True)
        gateway.close()


def spread_placement(workloads: list[tuple[str, int, int]], nodes: int, gpus_per_node: int) -> dict:
    """Least-allocated first, as the default scheduler's spread scoring does."""
    free = [gpus_per_node] * nodes
    placement: dict[str, list[int]] = {}
    order = [(w, g) for w, groups, _ in workloads for g in range(groups)]
    random.Random(3).shuffle(order)     # pods arrive interleaved
    size = {w: gpus for w, _, gpus in workloads}
    for w, g in order:
        best = max((i for i in range(nodes) if free[i] >= size[w]), key=lambda i: (free[i], -i))
        free[best] -= size[w]
        placement.setdefault(w, [0] * next(n for ww, n, _ in workloads if ww == w))[g] = best
    return placement


def part2() -> None:
    from binpack_world import GROUP, PLACER, PLURAL, VERSION, cluster_docs, node_name

    rng = random.Random(5)
    nodes, per_node = 32, 8
    workloads = [(f"model-{i:02d}", rng.randint(6, 14), rng.choice((1, 1, 2))) for i in range(12)]
    placement = spread_placement(workloads, nodes, per_node)
    shrink = {w: groups // 2 for w, groups, _ in workloads}
    used = sum(groups * gpus for _, groups, gpus in workloads)
    with running_cluster(cluster_docs({"with": nodes, "without": nodes})) as url:
        gateway = kube.KubeGateway.from_kubeconfig(str(url.kubeconfig_path), name="bench-demo")
        control = SimControl(url)
        # Binding is the scheduler's verb: the product's gateway has no call for it.
        core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(url.kubeconfig_path)))
        for tag in ("with", "without"):
            for w, groups, gpus in workloads:
                # PLACER: the default scheduler leaves these pods to the binding below, so
                # both copies get exactly `placement`.
                resources = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
                template = {"spec": {"schedulerName": PLACER, "nodeSelector": {"capacity.io/pool": tag},
                                     "containers": [{"name": "serve", "image": "vllm/vllm-openai:v0.6",
                                                     "resources": resources}]}}
                gateway.create(kube.MODELSERVINGS, {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelServing",
                    "metadata": {"name": w, "namespace": tag,
                                 "annotations": {"capacity.io/binpack": "false"} if tag == "without" else {}},
                    "spec": {"replicas": groups, "template": {"roles": [
                        {"name": "serve", "replicas": 1, "entryTemplate": template, "workerReplicas": 0}]}}})
        control.advance(0)
        for tag in ("with", "without"):
            for pod in gateway.list(kube.PODS, namespace=tag):
                if pod["spec"].get("nodeName"):
                    continue
                labels = pod["metadata"]["labels"]
                w, g = labels["modelserving.volcano.sh/name"], int(labels["modelserving.volcano.sh/group-name"].rsplit("-", 1)[1])
                body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name(tag, placement[w][g])}}
                core.create_namespaced_pod_binding(pod["metadata"]["name"], tag, body, _preload_content=False)
        control.advance(30)
        plan, plan_times, _, writes = apply_all(gateway)
        plan_s = plan_times[0]
        for tag in ("with", "without"):
            for w, groups, _ in workloads:
                gateway.patch(kube.MODELSERVINGS, w, {"spec": {"replicas": groups - shrink[w]}}, namespace=tag)
        control.advance(120)
        freed = {}
        for tag in ("with", "without"):
            busy = {p["spec"].get("nodeName") for p in gateway.list(kube.PODS, namespace=tag)
                    if not p["metadata"].get("deletionTimestamp")}
            freed[tag] = sum(1 for i in range(nodes) if node_name(tag, i) not in busy)
        removed = sum(shrink.values())
        print(f"[demo] {nodes} H100 nodes, {len(workloads)} ModelServings, {sum(g for _, g, _ in workloads)} groups "
              f"({used} of {nodes * per_node} GPUs), spread placement; each scaled down by half ({removed} groups)")
        print(f"[demo] costs: {writes} pods patched, planning {plan_s * 1000:.1f} ms")
        print(f"[demo] whole GPU nodes freed: with costs {freed['with']}, default order {freed['without']}")
        gateway.close()


def main() -> None:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--churn", type=int, default=200)
    parser.add_argument("--skip-scale", action="store_true", help="only the demo scenario")
    parser.add_argument("--snapshot-only", action="store_true", help="only the snapshot against its floor")
    args = parser.parse_args()
    if not args.skip_scale:
        report = Report("binpack_plan", runs=args.runs)
        for scale in scales_of(args):
            part1(scale, args.runs, args.churn, report, args.snapshot_only)
        report.print()
    if not args.snapshot_only:
        part2()


if __name__ == "__main__":
    main()
