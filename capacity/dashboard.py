"""The home dashboard of a cluster: pure aggregation of the GPU map view.

At 1,000 nodes the dashboard shows totals per GPU product and the top candidates, never
one row per node (that is the GPU map's job, which pages)."""
from __future__ import annotations

from dataclasses import dataclass

from capacity.planning import Candidate, FragmentationView

TOP_CANDIDATES = 10  # rows of "where to defrag" on the dashboard


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


def gpu_summary(view: FragmentationView, *, top: int = TOP_CANDIDATES) -> GpuSummary:
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
