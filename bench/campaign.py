"""Benchmark: what a campaign frees against the GPU map's one-node-at-a-time advice, and what
planning it costs at fleet size.

    .venv/bin/python bench/campaign.py [--runs 5] [--nodes 5000] [--pods 50000] [--skip-fleet]

Two clusters, each served by the simulated cluster and read through the product's gateway
(`snapshot_take` over `KubeGateway`):
- the demo scenario (simcluster/scenarios/demo.yaml), its clock advanced until its pods are
  placed;
- the fleet benchmark's 5,000-node / 50,000-pod cluster (bench/fleet.py's `cluster_docs`,
  the generator's), its GPU pods served as Knative revision pods, as model pods are (the
  generator makes plain ReplicaSet pods, which no defrag job moves), then every model
  scaled down by --scale-down of its pods (0.5: half, overnight style, as the binpack bench
  does): the generator fills every GPU, and a full pool has nothing to free.
For every GPU pool of each, under both scheduler scorings (LeastAllocated, MostAllocated):
nodes freed, pod moves per node freed, pods moved more than once and replacements landing
on a node being freed, for (a) the campaign plan (`campaign_plan`, goal None), (b) the GPU
map's candidates defragged one at a time in rank order (`one_at_a_time`), (c) the lower
bound (`most_freeable`: no plan frees more).

Planning time at 5,000 nodes: every pool's campaign over one snapshot (what the proposals
task plans per cluster), min/median/max of --runs, against the binpack planner on the same
snapshot (floor, measured back to back in each run); the ratio is printed, no time is asserted.

Executed (bench/_campaign_run.py; --skip-executed leaves it out): the product's services
stepped in-process on the simulated cluster's clock, each run on a fresh copy of the cluster,
for the demo's pools that a plan can free and for a generated pool at two sizes
(--executed-nodes, 12 and 48 nodes by default: 8-GPU nodes, one model per node of two pods
of 1, 2, 1 or 3 GPUs, spread by the scheduler, about 44 % of the GPUs requested), under the
demo's spread placement (LeastAllocated) and, for the generated pool, the same pool then
served with most-allocated placement (MostAllocated): (a) the campaign with 1 and 2 nodes in
flight, (b) the GPU map's candidates one at a time in rank order, the advice read afresh
before each job. Per run: nodes freed, pod moves per node freed, pods moved more than once,
replacements landing on a node being freed (the campaign's, or a later candidate), simulated
time to all safe, and API calls per pass per node in flight (median); the ratio of those
calls between the two sizes says whether they grow with the cluster.
Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from capacity.campaigns.planning import campaign_plan, one_at_a_time  # noqa: E402
from capacity.campaigns.pools import gpu_pools  # noqa: E402
from capacity.gpumap.advice import Scoring  # noqa: E402
from clusters.labels import GPU_PRODUCT_LABEL, KNATIVE_SERVICE_LABEL, REVISION_LABEL, TEMPLATE_HASH_LABEL  # noqa: E402

DEMO = ROOT / "simcluster" / "scenarios" / "demo.yaml"


@dataclass(frozen=True)
class Outcome:
    """What one way of freeing a pool does: nodes freed, pod moves, pods moved more than
    once, replacements landing on a node being freed (or freed later)."""

    freed: int
    pods_moved: int
    moved_twice: int
    onto_freed: int

    @property
    def moves_per_node(self) -> float | None:
        return self.pods_moved / self.freed if self.freed else None


@dataclass(frozen=True)
class PoolResult:
    pool: str
    scoring: str
    nodes: int
    campaign: Outcome
    one_at_a_time: Outcome
    most_freeable: int


def measure(snapshot, *, scorings=Scoring.ALL) -> list[PoolResult]:
    """For every GPU pool of the snapshot and each scoring: the campaign, the map's candidates
    one at a time, and the lower bound."""
    results = []
    for scoring in scorings:
        for pool, selector in gpu_pools(snapshot).items():
            plan = campaign_plan(snapshot, selector=selector, scoring=scoring)
            base = one_at_a_time(snapshot, selector=selector, scoring=scoring)
            results.append(PoolResult(
                pool=pool, scoring=scoring, nodes=plan.pool_nodes,
                campaign=Outcome(plan.freed, plan.pods_moved, plan.pods_moved_twice,
                                 plan.replacements_on_campaign_nodes),
                one_at_a_time=Outcome(base["freed"], base["pods_moved"], base["pods_moved_twice"],
                                      base["replacements_on_candidates"]),
                most_freeable=plan.most_freeable))
    return results


def plan_all_pools(snapshot, *, scoring: str) -> int:
    """Every pool's campaign over one snapshot (what the proposals task plans): nodes freed."""
    return sum(campaign_plan(snapshot, selector=selector, scoring=scoring).freed
               for selector in gpu_pools(snapshot).values())


def models_as_revisions(docs: list[dict]) -> list[dict]:
    """The generator's GPU ReplicaSets and their pods made Knative revisions' (labels only):
    the pods a defrag job orphans for their ReplicaSet to replace."""
    gpu_sets = set()
    for doc in docs:
        if doc.get("kind") == "Pod" and _gpus(doc["spec"]):
            owner = doc["metadata"]["ownerReferences"][0]["name"]
            gpu_sets.add((doc["metadata"]["namespace"], owner))
    for doc in docs:
        meta = doc.get("metadata", {})
        if doc.get("kind") == "Pod" and (meta.get("namespace"), meta["ownerReferences"][0]["name"]) in gpu_sets:
            meta["labels"].update(_revision_labels(meta["ownerReferences"][0]["name"]))
        elif doc.get("kind") == "ReplicaSet" and (meta.get("namespace"), meta["name"]) in gpu_sets:
            doc["spec"]["template"]["metadata"]["labels"].update(_revision_labels(meta["name"]))
    return docs


def _revision_labels(name: str) -> dict[str, str]:
    return {REVISION_LABEL: f"{name}-00001", KNATIVE_SERVICE_LABEL: name, TEMPLATE_HASH_LABEL: "5d8f7c9b4"}


def _gpus(spec: dict) -> int:
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
               for c in spec.get("containers", ()))


def fleet_docs(nodes: int, pods: int, seed: int = 0) -> list[dict]:
    """The fleet benchmark's cluster (bench/fleet.py's `cluster_docs`), model pods as revisions'."""
    from fleet import cluster_docs

    docs, _ = cluster_docs(seed, nodes, pods)
    return models_as_revisions(docs)


def scaled_down(docs: list[dict], share: float, seed: int = 0) -> list[dict]:
    """Each model (GPU ReplicaSet) with `share` of its pods gone (rounded down), chosen at
    random: the fragmented pools a night's scale-down leaves."""
    rng = random.Random(seed)
    pods_of: dict[tuple[str, str], list[dict]] = {}
    for doc in docs:
        if doc.get("kind") == "Pod" and _gpus(doc["spec"]):
            meta = doc["metadata"]
            pods_of.setdefault((meta["namespace"], meta["ownerReferences"][0]["name"]), []).append(doc)
    gone: set[int] = set()
    for pods in pods_of.values():
        gone.update(id(p) for p in rng.sample(pods, int(len(pods) * share)))
    kept = [d for d in docs if id(d) not in gone]
    for doc in kept:
        if doc.get("kind") == "ReplicaSet":
            meta = doc["metadata"]
            left = len(pods_of.get((meta["namespace"], meta["name"]), ()))
            if left:
                left -= int(left * share)
                doc["spec"]["replicas"] = left
                doc["status"].update(replicas=left, readyReplicas=left, availableReplicas=left,
                                     fullyLabeledReplicas=left)
    return kept


# ---- reporting --------------------------------------------------------------------------------

def _cell(outcome: Outcome) -> list[str]:
    per = outcome.moves_per_node
    return [str(outcome.freed), "-" if per is None else f"{per:.2f}", str(outcome.moved_twice),
            str(outcome.onto_freed)]


def table(cluster: str, results: list[PoolResult]) -> list[str]:
    """A Markdown table (the README's) of one cluster's results."""
    lines = [f"| {cluster}: pool (nodes) | scoring | campaign freed | moves/node | moved twice | onto its nodes "
             "| one at a time freed | moves/node | moved twice | onto later candidates | most freeable |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in results:
        lines.append("| " + " | ".join([f"{r.pool} ({r.nodes})", r.scoring, *_cell(r.campaign),
                                        *_cell(r.one_at_a_time), str(r.most_freeable)]) + " |")
    return lines


# ---- the clusters, served and read ------------------------------------------------------------

def _gateway(url, name: str):
    from clusters import kube

    return kube.KubeGateway.from_kubeconfig(str(url.kubeconfig_path), name=name)


def demo_snapshot():
    """The demo scenario served, its clock advanced until no pod waits for a node."""
    from clusters import kube
    from clusters.selectors import snapshot_take
    from simcluster.control import SimControl
    from simcluster.testing import running_cluster

    with running_cluster(DEMO.read_text()) as url:
        gateway, control = _gateway(url, "bench-demo"), SimControl(url)
        for _ in range(60):
            control.advance(10)
            pods = gateway.list(kube.PODS)
            if pods and all((p.get("spec") or {}).get("nodeName") for p in pods
                            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")):
                break
        else:
            raise SystemExit("the demo's pods were still not all placed after 600 simulated seconds")
        return snapshot_take(gateway, now=datetime.now(timezone.utc))


# ---- executed on the simulated cluster ---------------------------------------------------------

GENERATED_POOL = {"karpenter.sh/nodepool": "h100"}
_POD_GPUS = (1, 2, 1, 3)


def generated_pool(nodes: int) -> list[dict]:
    """`nodes` 8-GPU nodes of one pool and one model per node, two pods each of 1, 2, 1 or 3
    GPUs in turn (the scheduler spreads them): about 44 % of the pool's GPUs requested."""
    from defrag_builders import make_node
    from defrag_cluster import knative_service

    return ([{"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation", "metadata": {"name": "campaign-bench"},
              "spec": {"placement": "spread"}}]
            + [make_node(f"n{i:04d}") for i in range(1, nodes + 1)]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}}]
            + [knative_service(f"m{i:04d}", min_scale=2, gpus=_POD_GPUS[i % len(_POD_GPUS)])
               for i in range(1, nodes + 1)])


def executed_runs(scenario, *, selector, scoring: str, placement: str | None = None) -> list:
    """(a) the campaign with 1 and 2 nodes in flight, (b) the map's candidates one at a time."""
    from _campaign_run import run_campaign, run_one_at_a_time

    return [run_campaign(scenario, selector=selector, scoring=scoring, max_in_flight=k, placement=placement)
            for k in (1, 2)] + [run_one_at_a_time(scenario, selector=selector, scoring=scoring, placement=placement)]


def executed_table(rows: list[tuple[str, str, int, list]]) -> list[str]:
    """A Markdown table of executed runs: (cluster and pool, scoring, lower bound's most freeable, runs)."""
    lines = ["| executed on simcluster: cluster, pool | scoring | way | freed | most freeable | moves/node "
             "| moved twice | onto freed nodes | to all safe (simulated) | calls/pass/node in flight |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for where, scoring, most, runs in rows:
        for r in runs:
            per = r.moves_per_node
            lines.append("| " + " | ".join([
                where, scoring, r.way, str(r.freed), str(most), "-" if per is None else f"{per:.2f}",
                str(r.moved_twice), str(r.onto_freed),
                "-" if r.seconds_to_all_safe is None else f"{r.seconds_to_all_safe:,.0f} s",
                "-" if r.calls_per_check is None else f"{r.calls_per_check:.1f}"]) + " |")
    return lines


def executed_section(sizes: list[int]) -> list[str]:
    """Every executed run: the demo's freeable pools, the generated pool at each size."""
    rows: list[tuple[str, str, int, list]] = []
    demo = demo_snapshot()
    for result in measure(demo, scorings=(Scoring.LEAST_ALLOCATED,)):
        if result.campaign.freed:
            selector = gpu_pools(demo)[result.pool]
            rows.append((f"demo, {result.pool} ({result.nodes})", result.scoring, result.most_freeable,
                         executed_runs(str(DEMO), selector=selector, scoring=result.scoring)))
            print("\n".join(executed_table(rows[-1:])), flush=True)
    calls: dict[tuple[int, str], list[float]] = {}
    for nodes in sizes:
        docs = generated_pool(nodes)
        for scoring, placement in ((Scoring.LEAST_ALLOCATED, None), (Scoring.MOST_ALLOCATED, "most-allocated")):
            began = time.perf_counter()
            runs = executed_runs(docs, selector=GENERATED_POOL, scoring=scoring, placement=placement)
            snapshot = _placed_snapshot(docs)
            most = campaign_plan(snapshot, selector=GENERATED_POOL, scoring=scoring).most_freeable
            rows.append((f"generated, h100 ({nodes})", scoring, most, runs))
            print("\n".join(executed_table(rows[-1:])) + f"\n({time.perf_counter() - began:.0f} s wall)", flush=True)
            for r in runs:
                if r.calls_per_check is not None:
                    calls.setdefault((nodes, r.way), []).append(r.calls_per_check)
    out = executed_table(rows)
    if len(sizes) >= 2:
        small, large = min(sizes), max(sizes)
        for way in sorted({w for _, w in calls}):
            if (small, way) in calls and (large, way) in calls:
                ratio = statistics.median(calls[(large, way)]) / statistics.median(calls[(small, way)])
                out.append(f"API calls per pass per node in flight, {way}: {large} nodes / {small} nodes = "
                           f"{ratio:.2f}")
    return out


def _placed_snapshot(docs: list[dict]):
    """The generated pool as the scheduler placed it (for its lower bound)."""
    from _campaign_run import served
    from clusters.selectors import snapshot_take

    with served(docs) as (now, _, _, gateway):
        return snapshot_take(gateway, now=now())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="planning runs at fleet size (default 5)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--scale-down", type=float, default=0.5,
                        help="share of each model's pods gone from the fleet cluster (default 0.5)")
    parser.add_argument("--skip-fleet", action="store_true", help="the demo scenario only")
    parser.add_argument("--skip-executed", action="store_true", help="plans only, no executed runs")
    parser.add_argument("--executed-nodes", default="12,48",
                        help="sizes of the generated pool the executed runs use (default 12,48)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(n) for n in args.executed_nodes.split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"--executed-nodes must be whole numbers separated by commas, got {args.executed_nodes!r}")
    if not sizes or any(n < 2 for n in sizes):
        raise SystemExit(f"--executed-nodes must be 2 nodes or more each, got {args.executed_nodes!r}")
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    if not 0 <= args.scale_down < 1:
        raise SystemExit(f"--scale-down must be at least 0 and below 1, got {args.scale_down}")
    import _django

    _django.setup("campaign-bench", extra_paths=["tests/capacity"])   # the executed runs keep their jobs
    from _runs import Report, paired, per_run

    from capacity.binpack import planning as binpack
    from capacity.binpack.services import binpack_options
    from clusters.selectors import snapshot_take
    from clusters.snapshot import gc_paused
    from simcluster.testing import running_cluster

    out: list[str] = []
    snapshot = demo_snapshot()
    out += table("demo", measure(snapshot))
    print("\n".join(out), flush=True)
    if not args.skip_executed:
        out += [""] + executed_section(sizes)
        print("\n".join(out), flush=True)
    if args.skip_fleet:
        return 0
    began = time.perf_counter()
    docs = scaled_down(fleet_docs(args.nodes, args.pods), args.scale_down)
    served = sum(1 for d in docs if d.get("kind") == "Pod")
    with running_cluster(docs) as url:
        del docs
        print(f"fleet cluster of {args.nodes:,} nodes / {served:,} pods ({args.pods:,} less {args.scale_down:g} of "
              f"each model's) served in "
              f"{time.perf_counter() - began:.0f} s", flush=True)
        snapshot = snapshot_take(_gateway(url, "bench-fleet"), now=datetime.now(timezone.utc))
    gpu_nodes = sum(1 for n in snapshot.nodes if n.gpus_allocatable > 0)
    fleet = table(f"fleet {args.nodes:,}, {args.scale_down:g} of each model scaled down", measure(snapshot))
    print("\n".join(fleet), flush=True)
    report = Report("campaign", runs=args.runs)
    options = binpack_options()
    ratios = []
    for scoring in Scoring.ALL:
        with gc_paused():   # as binpack's planning runs (capacity/binpack/services.py)
            floors, samples = paired(args.runs, lambda: binpack.binpack_plan(snapshot, options=options),
                                     lambda: plan_all_pools(snapshot, scoring=scoring))
        report.add(1, f"every pool's campaign, {scoring}", samples, floor="binpack_plan, same snapshot",
                   floor_samples=floors, note=per_run(samples, floors))
        ratios.append(sorted(s / f for s, f in zip(samples, floors))[len(samples) // 2])
    report.print()
    print(f"\n{args.nodes:,} nodes ({gpu_nodes:,} with GPUs), {len(snapshot.pods):,} pods: planning every pool's "
          f"campaign takes {' and '.join(f'{r:.2f}' for r in ratios)} times the binpack planner's time "
          f"(LeastAllocated, MostAllocated; median of per-run ratios)")
    print("\n" + "\n".join(out + [""] + fleet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
