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
Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import os
import random
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="planning runs at fleet size (default 5)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--scale-down", type=float, default=0.5,
                        help="share of each model's pods gone from the fleet cluster (default 0.5)")
    parser.add_argument("--skip-fleet", action="store_true", help="the demo scenario only")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    if not 0 <= args.scale_down < 1:
        raise SystemExit(f"--scale-down must be at least 0 and below 1, got {args.scale_down}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)   # settings only: no database
    import django

    django.setup()
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
