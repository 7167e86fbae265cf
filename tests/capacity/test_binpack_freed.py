"""Which nodes a binpack run marks to be emptied first, and what a later reading of the
cluster says of them (seen free, still free, holding GPU pods again). Pure: no database."""
from __future__ import annotations

from datetime import timedelta

import pytest

from capacity.binpack import freed
from capacity.binpack import planning as bp
from clusters import labels
from clusters.snapshot import ClusterSnapshot, NodeView
from tests.capacity.test_binpack_planning import NOW, make_node, make_pod, snap


def h100(name, *, gpus=8):
    return NodeView.from_object({"metadata": {"name": name, "labels": {labels.GPU_PRODUCT_LABEL: "NVIDIA-H100"}},
                                 "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                            "conditions": [{"type": "Ready", "status": "True"}]}})


def world():
    """n-full: a1, a2 (a); n-light: a3 (a, its emptiest node); n-b1: b1; n-b2: b2, b3 (b);
    n-only: c1 (c's only node); n-hand: d1 (cost set by hand), d2 elsewhere."""
    nodes = [h100("n-full"), h100("n-light"), h100("n-b1", gpus=4), h100("n-b2"), h100("n-only"), h100("n-hand"),
             h100("n-d")]
    pods = [make_pod("a1", "n-full"), make_pod("a2", "n-full"), make_pod("a3", "n-light"),
            make_pod("b1", "n-b1", owner="rs-b"), make_pod("b2", "n-b2", owner="rs-b"),
            make_pod("b3", "n-b2", owner="rs-b"), make_pod("c1", "n-only", owner="rs-c"),
            make_pod("d1", "n-hand", owner="rs-d", annotations={labels.DELETION_COST: "5"}),
            make_pod("d2", "n-d", owner="rs-d")]
    return nodes, pods


def written_all(plan):
    return {(c.namespace, c.name) for c in plan.changes}


def test_a_run_marks_each_workloads_emptiest_node_once_its_costs_are_carried():
    nodes, pods = world()
    snapshot = snap(nodes, pods)
    plan = bp.binpack_plan(snapshot)
    marked = {m.node: m for m in freed.nodes_to_empty_first(plan, snapshot, written=written_all(plan))}
    # a's and b's emptiest nodes; not c's only node (only scaling c to zero empties it), not
    # a node holding a pod whose cost is set by hand (binpack does not order it)
    assert set(marked) == {"n-light", "n-b1"}
    assert marked["n-b1"].gpus == 4 and marked["n-b1"].gpu_model == "NVIDIA-H100"
    assert marked["n-b1"].workloads == ("team/ReplicaSet/rs-b",)
    assert marked["n-light"].why == "first node to empty of team/ReplicaSet/rs-a"


def test_a_node_whose_cost_write_did_not_land_is_not_marked():
    nodes, pods = world()
    snapshot = snap(nodes, pods)
    plan = bp.binpack_plan(snapshot)
    written = written_all(plan) - {("team", "a3")}
    assert {m.node for m in freed.nodes_to_empty_first(plan, snapshot, written=written)} == {"n-b1"}


def test_costs_already_carried_from_an_earlier_run_mark_the_node_with_no_write():
    nodes, pods = world()
    first = bp.binpack_plan(snap(nodes, pods))
    costs = first.costs
    carried = [make_pod(p.name, p.node_name, owner=p.controller.name,
                        annotations={labels.DELETION_COST: str(costs[(p.namespace, p.name)]),
                                     labels.BINPACK_MARKER: str(costs[(p.namespace, p.name)])})
               if (p.namespace, p.name) in costs else p for p in pods]
    snapshot = snap(nodes, carried)
    again = bp.binpack_plan(snapshot)
    assert not [c for c in again.changes if c.node in ("n-light", "n-b1")]
    assert {m.node for m in freed.nodes_to_empty_first(again, snapshot, written=())} == {"n-light", "n-b1"}


def mark(node="n-light", *, ago=timedelta(minutes=5), workloads=("team/ReplicaSet/rs-a",), run=1):
    return freed.Mark(run_id=run, marked_at=NOW - ago, node=node, gpus=8, gpu_model="NVIDIA-H100",
                      workloads=workloads)


def reading(nodes, pods) -> ClusterSnapshot:
    return snap(nodes, pods)


A_ELSEWHERE = [make_pod("a1", "n-full"), make_pod("a2", "n-full")]


CHECK_CASES = [
    # name, nodes, pods, mark, started (removed?) or None
    ("emptied by a scale-down while its workload runs elsewhere: freed",
     [make_node("n-full"), make_node("n-light")], A_ELSEWHERE, mark(), False),
    ("removed from the cluster: freed",
     [make_node("n-full")], A_ELSEWHERE, mark(), True),
    ("still holding a GPU pod: not yet",
     [make_node("n-full"), make_node("n-light")], [*A_ELSEWHERE, make_pod("a3", "n-light")], mark(), None),
    ("a pod leaving still counts as gone: its phase says it is no longer live",
     [make_node("n-full"), make_node("n-light")], [*A_ELSEWHERE, make_pod("a3", "n-light", phase="Succeeded")],
     mark(), False),
    ("its workload went to zero (dormancy, the pruner): not binpack's",
     [make_node("n-full"), make_node("n-light")], [], mark(), None),
    ("a pod of another workload took it: not free",
     [make_node("n-full"), make_node("n-light")], [*A_ELSEWHERE, make_pod("z1", "n-light", owner="rs-z")],
     mark(), None),
    ("a CPU-only pod on it does not hold its GPUs: freed",
     [make_node("n-full"), make_node("n-light")], [*A_ELSEWHERE, make_pod("cpu", "n-light", owner="rs-z", gpus=0)],
     mark(), False),
    ("marked too long ago: the mark no longer says why it emptied",
     [make_node("n-full"), make_node("n-light")], A_ELSEWHERE, mark(ago=freed.MARK_HORIZON + timedelta(seconds=1)),
     None),
]


@pytest.mark.parametrize("name,nodes,pods,the_mark,started", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_a_marked_node_is_freed_when_seen_free_while_its_workloads_still_run(name, nodes, pods, the_mark, started):
    check = freed.freed_check(reading(nodes, pods), marks=[the_mark], open_=[])
    if started is None:
        assert check.start == ()
    else:
        (start,) = check.start
        assert (start.mark, start.removed, check.taken_at) == (the_mark, started, NOW)
    assert check.end == () and check.seen == ()


def opened(node="n-light", *, last=NOW - timedelta(minutes=2), removed=False):
    return freed.OpenFree(id=7, node=node, workloads=("team/ReplicaSet/rs-a",), last_seen_free_at=last,
                          removed=removed)


def test_an_open_record_stays_while_free_and_notes_when_the_node_is_first_seen_gone():
    check = freed.freed_check(reading([make_node("n-full"), make_node("n-light")], A_ELSEWHERE),
                              marks=[mark()], open_=[opened()])
    assert check.seen == (freed.FreedSeen(7, removed=False),) and check.start == () and check.end == ()
    gone = freed.freed_check(reading([make_node("n-full")], A_ELSEWHERE), marks=[], open_=[opened()])
    assert gone.seen == (freed.FreedSeen(7, removed=True),)
    again = freed.freed_check(reading([make_node("n-full")], A_ELSEWHERE), marks=[], open_=[opened(removed=True)])
    assert again.seen == (freed.FreedSeen(7, removed=False),)


def test_an_open_record_ends_at_its_last_free_sighting_when_refilled_or_its_workload_goes_to_zero():
    last = NOW - timedelta(minutes=2)
    refilled = freed.freed_check(
        reading([make_node("n-full"), make_node("n-light")], [*A_ELSEWHERE, make_pod("new", "n-light", owner="rs-q")]),
        marks=[], open_=[opened(last=last)])
    (end,) = refilled.end
    assert (end.id, end.at) == (7, last) and end.reason.startswith("held GPU pods again")
    zero = freed.freed_check(reading([make_node("n-full"), make_node("n-light")], []), marks=[],
                             open_=[opened(last=last)])
    (end,) = zero.end
    assert end.at == last and "team/ReplicaSet/rs-a had no pods left" in end.reason
