"""The GPU map and the cluster dashboard, decided from a snapshot (no ORM, no HTTP, no clock):
GPUs per node, which node to empty, and the totals per GPU product.

Which nodes to empty is `defrag_advice` (capacity/gpumap/advice.py: the rules a job
applies, simulated node after node); what a job decides once started is
capacity/defrag/planning.py's. At 1,000 nodes the dashboard shows totals per GPU product and
the top candidates, never one row per node (that is the GPU map's job, which pages)."""
from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from clusters.labels import (
    GPU_PRODUCT_LABEL,
    ISVC_LABEL,
    KNATIVE_SERVICE_LABEL,
    ORG_LABEL,
    REVISION_LABEL,
    TEMPLATE_HASH_LABEL,
)
from clusters.snapshot import ClusterSnapshot, PodView

from capacity.gpumap.advice import (
    DefragAdvice,
    Freeing,
    FreeingStep,
    Scoring,
    defrag_advice,
    node_pool,
)

# ---- where to defrag: the fragmentation view --------------------------------------------

# The Okabe–Ito palette (M. Okabe and K. Ito, "Color Universal Design (CUD): how to make
# figures and presentations that are friendly to colorblind people", 2008): colours that stay
# apart under the common colour-vision deficiencies. Its black is left out: a black cell of a
# cordoned node, drawn pale, would read as the grey of a free GPU.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
# The second cue once a map shows more org/models than colours: each colour solid first,
# then striped, dotted and cross-hatched (views.py draws them) — 28 swatches. Past that, two
# org/models share a swatch, and a cell's title and the legend still name each one.
PATTERNS = ("", "stripes", "dots", "cross")
FREE_COLOUR = "#e5e7eb"


@dataclass(frozen=True, order=True)
class Swatch:
    """How an org/model's cells are drawn: a palette colour, and a pattern over it ("" solid)."""

    colour: str
    pattern: str = ""


@functools.lru_cache(maxsize=4096)
def _preferred(key: str) -> int:
    """The palette entry an org/model asks for first: from a hash of its name, so it does not
    depend on the names beside it (kept per key: a map of 5,000 nodes asks for the same few
    hundred keys tens of thousands of times)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % len(PALETTE)


def swatches_assign(keys) -> dict[str, Swatch]:
    """A swatch per org/model key ("org/model"), distinct for the first 28 keys: the keys, in
    name order, each take the free solid colour nearest after the one their hash prefers, then
    the free patterned ones. The same keys give the same swatches on every request; a key
    added or gone moves only the keys whose first choice it takes or frees."""
    taken: set[tuple[int, int]] = set()
    out: dict[str, Swatch] = {}
    for key in sorted(set(keys)):
        first = _preferred(key)
        slot = next(((pattern, (first + k) % len(PALETTE)) for pattern in range(len(PATTERNS))
                     for k in range(len(PALETTE)) if (pattern, (first + k) % len(PALETTE)) not in taken),
                    (0, first))   # every swatch taken: the one its hash prefers, shared
        taken.add(slot)
        out[key] = Swatch(PALETTE[slot[1]], PATTERNS[slot[0]])
    return out


def swatch_for(key: str) -> Swatch:
    """An org/model's swatch when no assignment over the map is at hand: its first choice."""
    return Swatch(PALETTE[_preferred(key)])


def org_of(pod: PodView) -> str:
    return pod.labels.get(ORG_LABEL) or pod.namespace


def model_of(pod: PodView) -> str:
    """The workload a pod serves: its Knative Service or InferenceService, else the workload
    that owns it (a Deployment's ReplicaSet named without its pod-template-hash, a
    StatefulSet...), so that every replica of one workload reads, and is coloured, the same;
    the pod's own name only for a pod no controller owns."""
    named = pod.labels.get(KNATIVE_SERVICE_LABEL) or pod.labels.get(ISVC_LABEL) or pod.labels.get(REVISION_LABEL)
    if named:
        return named
    owner = pod.controller
    if owner is None:
        return pod.name
    suffix = f"-{pod.labels.get(TEMPLATE_HASH_LABEL, '')}"
    if owner.kind == "ReplicaSet" and suffix != "-" and owner.name.endswith(suffix):
        return owner.name[:-len(suffix)]
    return owner.name


@dataclass(frozen=True)
class GpuCell:
    """One GPU of a node: free, or held by a pod."""

    pod: str | None = None
    org: str | None = None
    model: str | None = None
    colour: str = FREE_COLOUR
    pattern: str = ""   # PATTERNS: the second cue beside the colour ("" solid)


_FREE = GpuCell()   # every free GPU's cell: one object, however many nodes
_by_name = operator.attrgetter("name")
_org_model_name = operator.itemgetter(0, 1, 2)


class NodeRow(msgspec.Struct, frozen=True, gc=False):
    """One GPU node of the map. A Struct, not a dataclass: a reading of 5,000 nodes makes,
    pickles (into the cache) and unpickles one per node, and a Struct does each faster (the
    figures: README, "Tests and benchmarks")."""

    name: str
    pool: str
    gpu_product: str
    total: int
    used: int
    cordoned: bool
    held_by_job: int | None
    # The node's live GPU pods as (org, model, pod name, namespace, GPUs), by org, model and
    # name: what its cells show. Kept as plain tuples (the map draws a page of 100 rows, not
    # all of them, and a reading of 5,000 nodes is pickled into the cache).
    holders: tuple[tuple[str, str, str, str, int], ...]
    # The node's Ready condition is True: a node that is not (its kubelet stopped reporting,
    # say) starts no new pod, whatever GPUs it lists.
    ready: bool = True

    @property
    def free(self) -> int:
        return max(self.total - self.used, 0)

    @property
    def takes_pods(self) -> bool:
        """Ready and not cordoned: its free GPUs can take a new pod."""
        return self.ready and not self.cordoned

    @property
    def gpu_pods(self) -> int:
        return len(self.holders)

    @property
    def cells(self) -> tuple[GpuCell, ...]:
        """One per GPU, each org/model in its first-choice swatch (see `cells_in`)."""
        return self.cells_in({})

    def cells_in(self, swatches: Mapping[str, Swatch]) -> tuple[GpuCell, ...]:
        """One per GPU: each pod's (by org, model and name) in its org/model's swatch of
        `swatches` ("org/model" keys, `FragmentationView.swatches`), then the free ones."""
        cells: list[GpuCell] = []
        for org, model, name, namespace, gpus in self.holders:
            key = f"{org}/{model}"
            swatch = swatches.get(key) or swatch_for(key)
            cells.extend([GpuCell(f"{namespace}/{name}", org, model, swatch.colour, swatch.pattern)] * gpus)
        cells.extend([_FREE] * self.free)
        return tuple(cells)


@dataclass(frozen=True)
class FragmentationView:
    rows: tuple[NodeRow, ...]
    advice: DefragAdvice
    pools: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Each org/model's swatch ("org/model" → Swatch), assigned over every row of the reading:
    # one org/model reads the same on every node and page, and in every pool's view of it.
    swatches: Mapping[str, Swatch] = field(default_factory=dict)

    @property
    def candidates(self) -> tuple[FreeingStep, ...]:
        return self.advice.steps


def fragmentation_view(snapshot: ClusterSnapshot, *, held_nodes: Mapping[str, int] | None = None,
                       pool: str | None = None, scoring: str = Scoring.LEAST_ALLOCATED) -> FragmentationView:
    """GPUs per node, the GPU map cells, and where to defrag.

    Where to defrag is `defrag_advice` over the whole snapshot (replacements may land in
    any pool of the GPU product), then limited to the pool shown: which nodes can be freed
    together, in order, and why the others cannot.
    """
    held_nodes = held_nodes or {}
    rows: list[NodeRow] = []
    for node in sorted(snapshot.nodes, key=_by_name):
        if node.gpus_allocatable <= 0:
            continue
        node_pool_name = node_pool(node)
        if pool and node_pool_name != pool:
            continue
        # Who holds the node's GPUs: its live GPU pods (what they request in all is the
        # snapshot's `gpus_requested`, counted once for the map and the advice).
        holders: list[tuple[str, str, str, str, int]] = []
        for pod in snapshot.pods_on(node.name):
            if pod.gpus > 0 and pod.live:
                holders.append((org_of(pod), model_of(pod), pod.name, pod.namespace, pod.gpus))
        if len(holders) > 1:
            holders.sort(key=_org_model_name)
        rows.append(NodeRow(name=node.name, pool=node_pool_name, gpu_product=node.labels.get(GPU_PRODUCT_LABEL, ""),
                            total=node.gpus_allocatable, used=snapshot.gpus_requested(node.name),
                            cordoned=node.unschedulable, held_by_job=held_nodes.get(node.name),
                            holders=tuple(holders), ready=node.ready))
    advice = defrag_advice(snapshot, held_nodes=held_nodes, scoring=scoring)
    if pool:
        advice = advice.only({r.name for r in rows})
    swatches = swatches_assign({f"{org}/{model}" for r in rows for org, model, *_ in r.holders})
    return FragmentationView(rows=tuple(rows), advice=advice, pools=_pool_totals(rows), swatches=swatches)


def fragmentation_pool(view: FragmentationView, pool: str) -> FragmentationView:
    """One pool of a whole-cluster view: the same as `fragmentation_view(snapshot, pool=pool)`
    over the snapshot that view was drawn from, without drawing it again."""
    rows = tuple(r for r in view.rows if r.pool == pool)
    return FragmentationView(rows=rows, advice=view.advice.only({r.name for r in rows}), pools=_pool_totals(rows),
                             swatches=view.swatches)


def _pool_totals(rows: tuple[NodeRow, ...] | list[NodeRow]) -> dict[str, dict[str, int]]:
    """Per pool: nodes and GPUs (`free`: every node's free GPUs); `empty_nodes`: whole nodes
    free that take pods (room for a whole-node model), `closed_nodes`: nodes that take no new
    pod (cordoned or not Ready), as the dashboard counts them."""
    pools: dict[str, dict[str, int]] = {}
    for row in rows:
        totals = pools.setdefault(row.pool, {"nodes": 0, "total": 0, "used": 0, "free": 0, "empty_nodes": 0,
                                             "closed_nodes": 0})
        totals["nodes"] += 1
        totals["total"] += row.total
        totals["used"] += row.used
        totals["free"] += row.free
        totals["empty_nodes"] += row.used == 0 and row.takes_pods
        totals["closed_nodes"] += not row.takes_pods
    return pools


# ---- the dashboard: totals per GPU product ----------------------------------------------

DASHBOARD_CANDIDATES = 10  # rows of "where to defrag" on the dashboard


@dataclass(frozen=True)
class ProductTotals:
    """`free` counts every node's free GPUs; whole free nodes, fragmented nodes and stranded
    GPUs only those of nodes that take new pods (Ready, not cordoned): an empty node that is
    cordoned or not Ready is no room for a large model."""

    product: str
    nodes: int
    total: int
    used: int
    free: int
    empty_nodes: int      # whole nodes free and taking pods: what a large model needs
    fragmented_nodes: int  # partly used, taking pods: free GPUs that a whole-node model cannot use
    cordoned_nodes: int
    empty_nodes_gpus: int
    not_ready_nodes: int = 0
    closed_free: int = 0   # free GPUs on nodes that take no new pod (cordoned or not Ready)

    @property
    def stranded(self) -> int:
        """Free GPUs on partly used nodes that take pods: free, but not for a whole-node model."""
        return self.free - self.empty_nodes_gpus - self.closed_free


@dataclass(frozen=True)
class GpuSummary:
    products: tuple[ProductTotals, ...]
    candidates: tuple[FreeingStep, ...]   # the first `top` of the advice
    advice: DefragAdvice

    @property
    def whole_node_candidates(self) -> int:
        """Nodes that can be freed together (not each alone)."""
        return self.advice.count(Freeing.TOGETHER)

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
             "empty_nodes_gpus", "not_ready_nodes", "closed_free"), 0))
        t["nodes"] += 1
        t["total"] += row.total
        t["used"] += row.used
        t["free"] += row.free
        t["cordoned_nodes"] += row.cordoned
        t["not_ready_nodes"] += not row.ready
        if not row.takes_pods:
            t["closed_free"] += row.free
        elif row.used == 0:
            t["empty_nodes"] += 1
            t["empty_nodes_gpus"] += row.total
        elif row.free > 0:
            t["fragmented_nodes"] += 1
    products = tuple(ProductTotals(product=name, **t) for name, t in sorted(acc.items()))
    return GpuSummary(products=products, candidates=view.candidates[:top], advice=view.advice)


# ---- GPUs per pool, for /metrics and the GPU history ------------------------------------

@dataclass(frozen=True)
class PoolGpus:
    """Per (pool, GPU product): the GPUs the nodes offer (`nvidia.com/gpu` allocatable) and
    those the live pods bound to them request; and each GPU node's pool, so that a per-node
    series (DCGM's `Hostname`) can be counted per pool. Small beside the map: /metrics reads
    it on every scrape."""

    gpus: Mapping[tuple[str, str], tuple[int, int]]   # (pool, product) -> (allocatable, allocated)
    node_pools: Mapping[str, str]                      # node name -> pool


def pool_gpus(view: FragmentationView) -> PoolGpus:
    gpus: dict[tuple[str, str], tuple[int, int]] = {}
    for row in view.rows:
        key = (row.pool, row.gpu_product or "unlabelled")
        allocatable, allocated = gpus.get(key, (0, 0))
        gpus[key] = (allocatable + row.total, allocated + row.used)
    return PoolGpus(gpus=dict(sorted(gpus.items())), node_pools={row.name: row.pool for row in view.rows})
