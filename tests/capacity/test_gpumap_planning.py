"""Pure GPU map and dashboard planning: GPUs per node, where to defrag, totals per product.
No database, no cluster: snapshots built from plain objects."""
from __future__ import annotations

from datetime import UTC, datetime

from defrag_builders import make_model_pod, make_node, make_pod
from capacity.gpumap.planning import fragmentation_pool, fragmentation_view, gpu_summary
from clusters.snapshot import ClusterSnapshot, NodeView, PodView


def snapshot(nodes, pods) -> ClusterSnapshot:
    return ClusterSnapshot.build(taken_at=datetime(2026, 1, 1, tzinfo=UTC),
                                 nodes=[NodeView.from_object(n) for n in nodes],
                                 pods=[PodView.from_object(p) for p in pods])


def test_where_to_defrag_is_what_freeing_the_nodes_one_after_the_other_frees():
    nodes = [make_node("a"), make_node("b"), make_node("c"), make_node("empty")]
    pods = [
        make_model_pod("a1", revision="big-00001", node="a", gpus=7),   # a: 1 free; 7 fit nowhere but empty
        make_model_pod("b1", revision="mid-00001", node="b", gpus=5),   # b: 3 free; 5 fit into c's 6
        make_model_pod("c1", revision="small-00001", node="c", gpus=2),  # c: 6 free; 2 fit into b's 3
    ]
    view = fragmentation_view(snapshot(nodes, pods), scoring="MostAllocated")
    # b and c each fit alone into the other, not both: c (fewer GPUs) first, then b needs its room.
    assert [(c.node, c.outcome_label) for c in view.candidates] == [
        ("c", "frees a whole node (#1 together)"), ("b", "instead of an earlier one, not as well"),
        ("a", "only by using an empty node")]
    assert view.advice.summary == ("1 node can be freed; 1 more needs the room the first one uses; "
                                   "1 cannot be freed without using an empty node.")
    assert gpu_summary(view).whole_node_candidates == 1
    rows = {r.name: r for r in view.rows}
    assert (rows["a"].used, rows["a"].free, rows["empty"].free) == (7, 1, 8)
    assert len(rows["c"].cells) == 8 and rows["c"].cells[1].pod == "org-a/c1" and rows["c"].cells[2].pod is None
    assert view.pools["h100"] == {"nodes": 4, "total": 32, "used": 14, "free": 18, "empty_nodes": 1,
                                  "closed_nodes": 0}


def test_fragmentation_skips_cordoned_held_and_blocked_nodes_and_other_gpu_products():
    nodes = [make_node("a"), make_node("b", unschedulable=True), make_node("c"), make_node("d"),
             make_node("e", product="NVIDIA-A10G", pool="a10")]
    pods = [make_model_pod("a1", revision="r-00001", node="a", gpus=1),
            make_model_pod("b1", revision="r-00001", node="b", gpus=1),
            make_model_pod("c1", revision="r-00001", node="c", gpus=1),
            make_pod("d1", node="d", owner=("StatefulSet", "nb")),
            make_model_pod("e1", revision="r-00001", node="e", gpus=1)]
    view = fragmentation_view(snapshot(nodes, pods), held_nodes={"c": 7})
    assert [c.node for c in view.candidates] == ["a", "e"]
    # a's pod fits on d (whose notebook keeps it from being a candidate); no other A10G node for e
    assert [(c.node, c.frees_whole_node) for c in view.candidates] == [("a", True), ("e", False)]
    assert view.candidates[0].moves[0].to == "d"
    rows = {r.name: r for r in view.rows}
    assert rows["b"].cordoned and rows["c"].held_by_job == 7 and rows["d"].gpu_pods == 1   # d: blocked, not a candidate
    a10 = fragmentation_view(snapshot(nodes, pods), pool="a10")
    assert [r.name for r in a10.rows] == ["e"] and [c.node for c in a10.candidates] == ["e"]
    assert a10.advice.summary == ("No node can be emptied into the free GPUs of other non-empty nodes; "
                                  "1 cannot be freed at all (no room for its pods, even on empty nodes).")


def test_same_org_and_model_get_the_same_colour_on_every_node():
    nodes = [make_node("a"), make_node("b")]
    pods = [make_model_pod("a1", revision="r-00001", node="a"), make_model_pod("b1", revision="r-00001", node="b"),
            make_model_pod("b2", revision="s-00001", node="b", namespace="org-z")]
    rows = {r.name: r for r in fragmentation_view(snapshot(nodes, pods)).rows}
    assert rows["a"].cells[0].colour == rows["b"].cells[0].colour
    assert rows["b"].cells[1].colour != rows["b"].cells[0].colour


def test_summary_totals_gpus_per_product_and_counts_fragments():
    """Two H100 nodes (one 6/8 used, one empty), one A10G node (1/1 used)."""
    nodes = [make_node("h1"), make_node("h2"), make_node("a1", gpus=1, product="NVIDIA-A10G", pool="a10g")]
    pods = [make_model_pod("big-1", revision="big-00001", node="h1", gpus=6),
            make_model_pod("small-1", revision="small-00001", node="a1", gpus=1)]
    summary = gpu_summary(fragmentation_view(snapshot(nodes, pods)))
    by_product = {p.product: p for p in summary.products}
    h100 = by_product["NVIDIA-H100-80GB-HBM3"]
    assert (h100.nodes, h100.total, h100.used, h100.free) == (2, 16, 6, 10)
    assert (h100.empty_nodes, h100.fragmented_nodes, h100.stranded) == (1, 1, 2)
    a10g = by_product["NVIDIA-A10G"]
    assert (a10g.total, a10g.used, a10g.free, a10g.fragmented_nodes) == (1, 1, 0, 0)
    assert (summary.total, summary.used, summary.free) == (17, 7, 10)


def test_empty_nodes_that_take_no_pods_are_not_whole_free_nodes():
    """Cordoned or not Ready, an empty node is no room for a whole-node model, and a partly
    used one strands nothing: its free GPUs take no pod at all."""
    down = make_node("down")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    half_down = make_node("half-down")
    half_down["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    nodes = [make_node("open"), make_node("busy"), down, half_down, make_node("cordoned", unschedulable=True)]
    pods = [make_model_pod("b1", revision="r-00001", node="busy", gpus=6),
            make_model_pod("h1", revision="r-00001", node="half-down", gpus=4)]
    view = fragmentation_view(snapshot(nodes, pods))
    rows = {r.name: r for r in view.rows}
    assert [name for name, r in rows.items() if not r.ready] == ["down", "half-down"]
    (h100,) = gpu_summary(view).products
    assert (h100.free, h100.empty_nodes, h100.empty_nodes_gpus, h100.fragmented_nodes, h100.stranded) == (
        30, 1, 8, 1, 2)
    assert (h100.cordoned_nodes, h100.not_ready_nodes, h100.closed_free) == (1, 2, 20)
    # The map's pool table counts alike: one empty node takes pods, three take none.
    assert view.pools["h100"] == {"nodes": 5, "total": 40, "used": 10, "free": 30, "empty_nodes": 1,
                                  "closed_nodes": 3}


def test_finished_and_terminating_pods_hold_no_gpus_on_the_map():
    done = make_model_pod("done", revision="r-00001", node="a", gpus=4, phase="Succeeded")
    leaving = make_model_pod("leaving", revision="r-00001", node="a", gpus=2)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    (row,) = fragmentation_view(snapshot([make_node("a")], [done, leaving,
                                         make_model_pod("a1", revision="r-00001", node="a")])).rows
    assert (row.used, row.free, row.gpu_pods) == (1, 7, 1)


def test_one_pool_of_a_kept_whole_cluster_view_is_that_pools_own_view():
    """The pages keep one view of the whole cluster and cut a pool out of it: the same rows,
    totals and advice as drawing the pool alone (whose room counts every pool of the product)."""
    nodes = [make_node("h-a"), make_node("h-b"), make_node("spot-a", pool="spot"), make_node("spot-b", pool="spot"),
             make_node("a10", gpus=1, product="NVIDIA-A10G", pool="a10g")]
    pods = [make_model_pod("m1", revision="m1-00001", node="h-a", gpus=2),
            make_model_pod("m2", revision="m2-00001", node="spot-a", gpus=3),
            make_model_pod("m3", revision="m3-00001", node="spot-b", gpus=6),
            make_model_pod("m4", revision="m4-00001", node="a10", gpus=1)]
    s = snapshot(nodes, pods)
    whole = fragmentation_view(s, held_nodes={"h-b": 7})
    for pool in ("h100", "spot", "a10g", "none"):
        cut, drawn = fragmentation_pool(whole, pool), fragmentation_view(s, held_nodes={"h-b": 7}, pool=pool)
        assert (cut.rows, cut.advice, cut.pools) == (drawn.rows, drawn.advice, drawn.pools), pool
    spot = fragmentation_pool(whole, "spot")
    assert [r.name for r in spot.rows] == ["spot-a", "spot-b"]
    # Room counted across pools: h-a (h100) is freed first into spot-b, so both spot nodes
    # could only be freed instead of it.
    assert [(c.node, c.outcome_label) for c in spot.candidates] == [
        ("spot-a", "instead of an earlier one, not as well"), ("spot-b", "instead of an earlier one, not as well")]
    assert spot.pools == {"spot": {"nodes": 2, "total": 16, "used": 9, "free": 7, "empty_nodes": 0, "closed_nodes": 0}}


def test_the_first_models_get_distinct_palette_colours_then_patterns_as_a_second_cue():
    from capacity.gpumap.planning import PALETTE, PATTERNS, Swatch, swatches_assign

    keys = [f"org-{i % 3}/model-{i}" for i in range(len(PALETTE) * len(PATTERNS))]
    swatches = swatches_assign(keys)
    solid = [s for s in swatches.values() if not s.pattern]
    # Every palette colour used once, solid, before any pattern; then every swatch distinct.
    assert sorted(s.colour for s in solid) == sorted(PALETTE)
    assert len(set(swatches.values())) == len(keys)
    assert {s.pattern for s in swatches.values()} == set(PATTERNS)
    first = swatches_assign(keys[:len(PALETTE)])
    assert {s.colour for s in first.values()} == set(PALETTE) and {s.pattern for s in first.values()} == {""}
    assert all(isinstance(s, Swatch) and s.colour in PALETTE for s in swatches.values())


def test_a_model_keeps_its_swatch_across_readings_and_node_order():
    from capacity.gpumap.planning import swatches_assign

    keys = [f"org/model-{i}" for i in range(12)]
    assert swatches_assign(keys) == swatches_assign(list(reversed(keys)))   # same models, same swatches
    nodes = [make_node("a"), make_node("b")]
    pods = [make_model_pod("a1", revision="r-00001", node="a"), make_model_pod("b2", revision="s-00001", node="b")]
    first = fragmentation_view(snapshot(nodes, pods))
    again = fragmentation_view(snapshot(list(reversed(nodes)), list(reversed(pods))))
    assert first.swatches == again.swatches and len(set(first.swatches.values())) == 2
    cells = {r.name: r.cells_in(first.swatches)[0] for r in first.rows}
    assert {(c.colour, c.pattern) for c in cells.values()} == {(s.colour, s.pattern) for s in first.swatches.values()}
    # A pool's view of the reading keeps the whole reading's swatches.
    assert fragmentation_pool(first, first.rows[0].pool).swatches == first.swatches


def test_replicas_of_one_workload_read_and_are_coloured_as_that_workload_not_as_each_pod():
    """A Deployment's pods (ReplicaSet `<deployment>-<pod-template-hash>`) and a StatefulSet's
    read as their workload in the map's cells and legend; a bare pod as itself."""
    from capacity.gpumap.planning import model_of

    hashed = {"pod-template-hash": "565fdcd88b"}
    pods = [make_pod(f"batch-embedder-565fdcd88b-{s}", node="n1", owner=("ReplicaSet", "batch-embedder-565fdcd88b"),
                     labels=hashed) for s in ("8qnxk", "w2p4d")]
    pods += [make_pod("scratch-notebook-0", node="n2", owner=("StatefulSet", "scratch-notebook")),
             make_pod("debug", node="n2")]
    view = fragmentation_view(snapshot([make_node(n) for n in ("n1", "n2")], pods))
    assert [model_of(PodView.from_object(p)) for p in pods] == [
        "batch-embedder", "batch-embedder", "scratch-notebook", "debug"]
    n1 = next(r for r in view.rows if r.name == "n1")
    assert {cell.model for cell in n1.cells_in(view.swatches) if cell.pod} == {"batch-embedder"}
    assert len({(cell.colour, cell.pattern) for cell in n1.cells_in(view.swatches) if cell.pod}) == 1
