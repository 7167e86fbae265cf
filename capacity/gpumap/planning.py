"""The GPU map and the cluster dashboard, decided from a snapshot (no ORM, no HTTP, no clock):
GPUs per node, which node to empty, and the totals per GPU product.

What a defrag job decides once started lives in `capacity.defrag.planning`. At 1,000 nodes
the dashboard shows totals per GPU product and the top candidates, never one row per node
(that is the GPU map's job, which pages)."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clusters.labels import (
    GPU_PRODUCT_LABEL,
    ISVC_LABEL,
    KNATIVE_SERVICE_LABEL,
    NODE_POOL_LABELS,
    ORG_LABEL,
    REVISION_LABEL,
)
from clusters.snapshot import ClusterSnapshot, NodeView, PodView

from capacity.defrag.planning import Role, pod_classify


# ---- where to defrag: the fragmentation view --------------------------------------------

def colour_for(key: str) -> str:
    """A stable colour per org/model, so one org reads the same on every node."""
    digest = hashlib.sha256(key.encode()).digest()
    return f"hsl({int.from_bytes(digest[:2], 'big') % 360}, 65%, {45 + digest[2] % 20}%)"


def org_of(pod: PodView) -> str:
    return pod.labels.get(ORG_LABEL) or pod.namespace


def model_of(pod: PodView) -> str:
    return (pod.labels.get(KNATIVE_SERVICE_LABEL) or pod.labels.get(ISVC_LABEL)
            or pod.labels.get(REVISION_LABEL) or pod.name)


@dataclass(frozen=True)
class GpuCell:
    """One GPU of a node: free, or held by a pod."""

    pod: str | None = None
    org: str | None = None
    model: str | None = None
    colour: str = "#e5e7eb"


@dataclass(frozen=True)
class NodeRow:
    name: str
    pool: str
    gpu_product: str
    total: int
    used: int
    cordoned: bool
    held_by_job: int | None
    cells: tuple[GpuCell, ...]
    gpu_pods: int
    blockers: int

    @property
    def free(self) -> int:
        return max(self.total - self.used, 0)


@dataclass(frozen=True)
class Candidate:
    node: str
    pool: str
    frees_whole_node: bool
    gpus_moved: int
    pods_moved: int
    why: str


@dataclass(frozen=True)
class FragmentationView:
    rows: tuple[NodeRow, ...]
    candidates: tuple[Candidate, ...]
    pools: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def node_pool(node: NodeView) -> str:
    return next((node.labels[k] for k in NODE_POOL_LABELS if node.labels.get(k)),
                node.labels.get(GPU_PRODUCT_LABEL, "default"))


def _fits(requests: Sequence[int], free: list[int]) -> bool:
    """First-fit decreasing into the given free GPU counts, most-allocated first (as a
    bin-packing scheduler would place them), without touching empty nodes."""
    free = sorted(free)
    for need in sorted(requests, reverse=True):
        slot = next((i for i, f in enumerate(free) if f >= need), None)
        if slot is None:
            return False
        free[slot] -= need
        free.sort()
    return True


def fragmentation_view(snapshot: ClusterSnapshot, *, held_nodes: Mapping[str, int] | None = None,
                       pool: str | None = None) -> FragmentationView:
    """GPUs per node, the GPU map cells, and the ranked candidates to empty.

    A candidate is a node with GPU pods and no blockers; it frees a whole node when all
    its GPU pods fit into the free GPUs of other schedulable, non-empty nodes of the same
    GPU product (moving them onto an empty node would only move the fragment). Ranked by
    freeing a whole node, then fewest GPUs moved, then fewest pods moved.
    """
    held_nodes = held_nodes or {}
    rows: list[NodeRow] = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if node.gpus_allocatable <= 0:
            continue
        node_pool_name = node_pool(node)
        if pool and node_pool_name != pool:
            continue
        pods = sorted((p for p in snapshot.pods_on(node.name) if p.live and p.gpus > 0),
                      key=lambda p: (org_of(p), model_of(p), p.name))
        cells: list[GpuCell] = []
        for pod in pods:
            org, model = org_of(pod), model_of(pod)
            cells.extend([GpuCell(pod=f"{pod.namespace}/{pod.name}", org=org, model=model,
                                  colour=colour_for(f"{org}/{model}"))] * pod.gpus)
        used = snapshot.gpus_requested(node.name)
        cells.extend([GpuCell()] * max(node.gpus_allocatable - used, 0))
        blockers = sum(1 for p in snapshot.pods_on(node.name) if p.live and pod_classify(p)[0] == Role.BLOCKER)
        rows.append(NodeRow(name=node.name, pool=node_pool_name, gpu_product=node.labels.get(GPU_PRODUCT_LABEL, ""),
                            total=node.gpus_allocatable, used=used, cordoned=node.unschedulable,
                            held_by_job=held_nodes.get(node.name), cells=tuple(cells), gpu_pods=len(pods),
                            blockers=blockers))
    candidates = []
    for row in rows:
        if row.used == 0 or row.cordoned or row.held_by_job or row.blockers:
            continue
        requests = [p.gpus for p in snapshot.pods_on(row.name) if p.live and p.gpus > 0]
        others = [r.free for r in rows if r.name != row.name and not r.cordoned and not r.held_by_job
                  and r.gpu_product == row.gpu_product and r.used > 0 and r.free > 0]
        whole = _fits(requests, others)
        why = (f"its {len(requests)} pod(s) fit in the free GPUs of other {row.gpu_product or 'GPU'} nodes"
               if whole else "its pods would need an empty node: emptying it only moves the fragment")
        candidates.append(Candidate(node=row.name, pool=row.pool, frees_whole_node=whole, gpus_moved=row.used,
                                    pods_moved=len(requests), why=why))
    candidates.sort(key=lambda c: (not c.frees_whole_node, c.gpus_moved, c.pods_moved, c.node))
    pools: dict[str, dict[str, int]] = {}
    for row in rows:
        totals = pools.setdefault(row.pool, {"nodes": 0, "total": 0, "used": 0, "free": 0, "empty_nodes": 0})
        totals["nodes"] += 1
        totals["total"] += row.total
        totals["used"] += row.used
        totals["free"] += row.free
        totals["empty_nodes"] += row.used == 0
    return FragmentationView(rows=tuple(rows), candidates=tuple(candidates), pools=pools)


# ---- the dashboard: totals per GPU product ----------------------------------------------

DASHBOARD_CANDIDATES = 10  # rows of "where to defrag" on the dashboard


@dataclass(frozen=True)
class ProductTotals:
    product: str
    nodes: int
    total: int
    used: int
    free: int
    empty_nodes: int      # whole nodes free: what a large model needs
    fragmented_nodes: int  # partly used: free GPUs that a whole-node model cannot use
    cordoned_nodes: int
    empty_nodes_gpus: int

    @property
    def stranded(self) -> int:
        """Free GPUs on partly used nodes: free, but not for a whole-node model."""
        return self.free - self.empty_nodes_gpus


@dataclass(frozen=True)
class GpuSummary:
    products: tuple[ProductTotals, ...]
    candidates: tuple[Candidate, ...]
    whole_node_candidates: int

    @property
    def total(self) -> int:
        return sum(p.total for p in self.products)

    @property
    def used(self) -> int:
        return sum(p.used for p in self.products)

    @property
    def free(self) -> int:
        return sum(p.free for p in self.products)


def gpu_summary(view: FragmentationView, *, top: int = DASHBOARD_CANDIDATES) -> GpuSummary:
    """GPUs total / used / free per product, fragmentation, and the best candidates."""
    acc: dict[str, dict[str, int]] = {}
    for row in view.rows:
        t = acc.setdefault(row.gpu_product or "unlabelled", dict.fromkeys(
            ("nodes", "total", "used", "free", "empty_nodes", "fragmented_nodes", "cordoned_nodes",
             "empty_nodes_gpus"), 0))
        t["nodes"] += 1
        t["total"] += row.total
        t["used"] += row.used
        t["free"] += row.free
        t["cordoned_nodes"] += row.cordoned
        if row.used == 0:
            t["empty_nodes"] += 1
            t["empty_nodes_gpus"] += row.total
        elif row.free > 0:
            t["fragmented_nodes"] += 1
    products = tuple(ProductTotals(product=name, **t) for name, t in sorted(acc.items()))
    return GpuSummary(products=products, candidates=view.candidates[:top],
                      whole_node_candidates=sum(1 for c in view.candidates if c.frees_whole_node))
