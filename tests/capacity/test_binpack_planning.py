"""Pure binpack planning: costs, ownership of the annotation, opt-out, groups, budget.
No database, no HTTP: snapshots are built from plain dicts."""
from datetime import datetime, timezone

import pytest

from capacity.binpack import planning as bp
from clusters import labels
from clusters.snapshot import ClusterSnapshot, NodeView, PodView

NOW = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)


def make_node(name, *, gpus=8):
    alloc = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return NodeView.from_object({"metadata": {"name": name}, "status": {
        "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}})


def make_pod(name, node, *, owner="rs-a", kind="ReplicaSet", ns="team", gpus=1, annotations=None,
             labels=None, phase="Running", deleting=False):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {},
            "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return PodView.from_object({"metadata": meta, "spec": {"nodeName": node, "containers": [
        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": phase}})


def snap(nodes, pods):
    return ClusterSnapshot.build(taken_at=NOW, nodes=nodes, pods=pods)


def plan(nodes, pods, **options):
    return bp.binpack_plan(snap(nodes, pods), options=bp.BinpackOptions(**options))


@pytest.mark.parametrize("text,value", [
    ("0", 0), ("17", 17), ("-5", -5), ("2147483647", 2147483647), ("-2147483648", -2147483648),
    ("+5", None), ("007", None), ("2147483648", None), ("1.5", None), ("", None), ("abc", None), ("٣", None),
])
def test_parse_cost_accepts_only_what_the_api_server_accepts(text, value):
    assert bp.parse_cost(text) == value


def test_pods_on_the_node_their_workload_could_free_with_fewest_deletions_cost_least():
    nodes = [make_node("n-busy"), make_node("n-alone"), make_node("n-pair")]
    pods = [make_pod("a1", "n-busy"), make_pod("x1", "n-busy", owner="rs-x"),
            make_pod("a2", "n-alone"),
            make_pod("a3", "n-pair"), make_pod("a4", "n-pair")]
    costs = plan(nodes, pods).costs
    assert costs[("team", "a2")] < costs[("team", "a3")] == costs[("team", "a4")] < costs[("team", "a1")]


def test_every_cost_is_a_valid_int32_even_on_crowded_nodes():
    nodes = [make_node("n1")]
    pods = [make_pod(f"p{i}", "n1", owner=f"rs-{i % 3}") for i in range(300)]
    for value in plan(nodes, pods).costs.values():
        assert bp.parse_cost(str(value)) == value
        assert 0 <= value < 2 ** 31


def test_cpu_nodes_daemonsets_orphans_and_terminating_pods_get_no_cost():
    nodes = [make_node("gpu"), make_node("cpu", gpus=0)]
    pods = [make_pod("on-cpu", "cpu"), make_pod("ds", "gpu", owner="dcgm", kind="DaemonSet"),
            make_pod("orphan", "gpu", owner=None), make_pod("leaving", "gpu", deleting=True),
            make_pod("model", "gpu")]
    assert set(plan(nodes, pods).costs) == {("team", "model")}


def test_pods_already_carrying_the_planned_cost_are_not_rewritten():
    nodes = [make_node("n1")]
    first = plan(nodes, [make_pod("a", "n1")])
    cost = str(first.costs[("team", "a")])
    again = plan(nodes, [make_pod("a", "n1", annotations={labels.DELETION_COST: cost, labels.BINPACK_MARKER: cost})])
    assert again.changes == () and again.unchanged == 1


def test_a_cost_set_by_hand_is_left_alone_unless_told_otherwise():
    nodes = [make_node("n1")]
    by_hand = make_pod("a", "n1", annotations={labels.DELETION_COST: "500"})
    # Ours once, then changed by an operator: the marker no longer matches.
    edited = make_pod("b", "n1", annotations={labels.DELETION_COST: "7", labels.BINPACK_MARKER: "1024"})
    result = plan(nodes, [by_hand, edited])
    assert result.changes == ()
    assert {s.name for s in result.skipped} == {"a", "b"}
    forced = plan(nodes, [by_hand, edited], override_manual=True)
    assert {c.name for c in forced.changes} == {"a", "b"}
    assert all("overriding hand-set cost" in c.reason for c in forced.changes)


def test_invalid_cost_we_wrote_is_replaced():
    nodes = [make_node("n1")]
    pod = make_pod("a", "n1", annotations={labels.DELETION_COST: "0042", labels.BINPACK_MARKER: "0042"})
    (change,) = plan(nodes, [pod]).changes
    assert change.old == "0042" and bp.parse_cost(str(change.new)) == change.new
    assert "invalid" in change.reason


@pytest.mark.parametrize("where", ["annotation", "label", "owner"])
def test_an_opted_out_workload_gets_no_cost_and_loses_ours(where):
    nodes = [make_node("n1")]
    opt = {"annotations": {labels.BINPACK_OPT_OUT: "false"}} if where == "annotation" else \
        {"labels": {labels.BINPACK_OPT_OUT: "false"}} if where == "label" else {}
    owners = frozenset({"uid-rs-a"}) if where == "owner" else frozenset()
    fresh = make_pod("fresh", "n1", **opt)
    ours = make_pod("ours", "n1", annotations={labels.DELETION_COST: "5", labels.BINPACK_MARKER: "5",
                                               **opt.get("annotations", {})}, labels=opt.get("labels"))
    result = plan(nodes, [fresh, ours], opted_out_owners=owners)
    assert [(c.name, c.new) for c in result.changes] == [("ours", None)]
    assert [s.name for s in result.skipped] == ["fresh"]


def test_kthena_groups_are_ranked_by_the_sum_of_their_pods_costs():
    nodes = [make_node("empty-ish"), make_node("shared")]
    kthena = lambda name, group, node: make_pod(  # noqa: E731
        name, node, owner="sample", kind="ModelServing",
        labels={labels.KTHENA_NAME_LABEL: "sample", labels.KTHENA_GROUP_LABEL: group})
    pods = [kthena("sample-0-decode-0-0", "sample-0", "shared"), kthena("sample-0-prefill-0-0", "sample-0", "shared"),
            kthena("sample-1-decode-0-0", "sample-1", "empty-ish"),
            kthena("sample-1-prefill-0-0", "sample-1", "empty-ish"),
            make_pod("other", "shared", owner="rs-other")]
    result = plan(nodes, pods)
    ranks = {g.group: g for g in result.groups}
    costs = result.costs
    assert ranks["sample-1"].cost == costs[("team", "sample-1-decode-0-0")] + costs[("team", "sample-1-prefill-0-0")]
    # sample-1 alone on its node: removing it frees the node, so it goes first.
    assert ranks["sample-1"].rank == 0 and ranks["sample-0"].rank == 1


def test_a_configurable_group_label_groups_pods_of_one_workload():
    nodes = [make_node("n1"), make_node("n2")]
    pods = [make_pod("g1-a", "n1", labels={"lws/group": "g-1"}), make_pod("g1-b", "n1", labels={"lws/group": "g-1"}),
            make_pod("g0-a", "n2", labels={"lws/group": "g-0"}), make_pod("x", "n2", owner="rs-x")]
    ranks = {g.group: g for g in plan(nodes, pods, group_label="lws/group").groups}
    assert ranks["g-1"].pods == 2 and ranks["g-0"].pods == 1
    assert {g.rank for g in ranks.values()} == {0, 1}


def test_the_write_budget_caps_a_run_and_says_how_many_wait():
    nodes = [make_node("n1")]
    result = plan(nodes, [make_pod(f"p{i}", "n1") for i in range(10)], max_writes=4)
    assert len(result.changes) == 4 and result.over_budget == 6
    assert "6 left for the next run" in result.describe()[-1]


# ---- why a pod gets its cost ----------------------------------------------------------------

def kthena(name, group, node):
    return make_pod(name, node, owner="sample", kind="ModelServing",
                    labels={labels.KTHENA_NAME_LABEL: "sample", labels.KTHENA_GROUP_LABEL: group})


SPREAD = ([make_node("n-alone"), make_node("n-pair"), make_node("n-busy")],
          [make_pod("a2", "n-alone"), make_pod("a3", "n-pair"), make_pod("a4", "n-pair"),
           make_pod("a1", "n-busy"), make_pod("x1", "n-busy", owner="rs-x")])


@pytest.mark.parametrize("nodes, pods, pod, why", [
    pytest.param(*SPREAD, "a2", "node n-alone: 1 of 8 GPUs in use, 1 pod (all of its workload, no other workload on "
                 "it) → deleted first of its workload's 3 nodes; cost = (0 + 1) × 1024 + 907 (node tie-break) = 1931",
                 id="the least-used node of its workload is deleted first"),
    pytest.param(*SPREAD, "a3", "node n-pair: 2 of 8 GPUs in use, 2 pods (all of its workload, no other workload on "
                 "it) → deleted 2nd of its workload's 3 nodes; cost = (0 + 2) × 1024 + 329 (node tie-break) = 2377",
                 id="a node in the middle"),
    pytest.param(*SPREAD, "a1", "node n-busy: 2 of 8 GPUs in use, 2 pods (1 of its workload, 1 of others: shared, "
                 "+256 as its workload alone cannot free it) → deleted last of its workload's 3 nodes; "
                 "cost = (256 + 2) × 1024 + 674 (node tie-break) = 264866",
                 id="a node shared with another workload goes last"),
    pytest.param(*SPREAD, "x1", "node n-busy: 2 of 8 GPUs in use, 2 pods (1 of its workload, 1 of others: shared, "
                 "+256 as its workload alone cannot free it) → its workload's only node; "
                 "cost = (256 + 2) × 1024 + 674 (node tie-break) = 264866", id="a workload on one node"),
    pytest.param([make_node("n-alone"), make_node("n-h")],
                 [make_pod("a2", "n-alone"), make_pod("h", "n-h", annotations={labels.DELETION_COST: "1"})], "a2",
                 "node n-alone: 1 of 8 GPUs in use, 1 pod (all of its workload, no other workload on it) → deleted "
                 "last of its workload's 2 nodes; cost = (0 + 1) × 1024 + 907 (node tie-break) = 1931",
                 id="a cost set by hand elsewhere counts in the order"),
    pytest.param([make_node("empty-ish"), make_node("shared")],
                 [kthena("sample-0-decode-0-0", "sample-0", "shared"), kthena("sample-0-prefill-0-0", "sample-0", "shared"),
                  kthena("sample-1-decode-0-0", "sample-1", "empty-ish"),
                  kthena("sample-1-prefill-0-0", "sample-1", "empty-ish"), make_pod("other", "shared", owner="rs-o")],
                 "sample-1-decode-0-0",
                 "node empty-ish: 2 of 8 GPUs in use, 2 pods (all of its workload, no other workload on it) → its "
                 "group sample-1 sums 4348 over 2 pods: removed first of its workload's 2 groups; "
                 "cost = (0 + 2) × 1024 + 126 (node tie-break) = 2174", id="a Kthena group goes by its sum"),
    pytest.param([make_node("n1", gpus=512)], [make_pod(f"p{i}", "n1", owner=f"rs-{i % 2}") for i in range(300)],
                 "p0", "node n1: 300 of 512 GPUs in use, 300 pods (150 of its workload, 150 of others: shared, +256 "
                 "as its workload alone cannot free it) → its workload's only node; cost = (256 + 255, capped) × "
                 "1024 + 236 (node tie-break) = 523500", id="the pod count is capped"),
])
def test_each_change_says_why_the_pod_gets_its_cost(nodes, pods, pod, why):
    result = plan(nodes, pods)
    change = next(c for c in result.changes if c.name == pod)
    assert change.reason == why
    assert result.explain("team", pod) == why
    assert change.basis.cost == change.new == int(why.rsplit("= ", 1)[1])
    assert f"team/{pod}: - -> {change.new} ({why})" in result.describe()


def test_why_is_also_said_for_pods_the_plan_leaves_as_they_are():
    nodes = [make_node("n-alone"), make_node("n1")]
    others = [make_pod("hand", "n1", owner="rs-h", annotations={labels.DELETION_COST: "500"}),
              make_pod("ds", "n1", owner="dcgm", kind="DaemonSet")]
    cost = str(plan(nodes, [make_pod("a", "n-alone"), *others]).costs[("team", "a")])
    result = plan(nodes, [make_pod("a", "n-alone", annotations={labels.DELETION_COST: cost,
                                                                 labels.BINPACK_MARKER: cost}), *others])
    assert result.changes == () and result.unchanged == 1
    assert result.explain("team", "a") == ("node n-alone: 1 of 8 GPUs in use, 1 pod (all of its workload, no other "
                                           "workload on it) → its workload's only node; cost = (0 + 1) × 1024 + 907 "
                                           "(node tie-break) = 1931")
    assert result.explain("team", "hand") == "no cost of ours: cost '500' set by hand"
    assert result.explain("team", "ds") == "no cost of ours: not among the live pods with a controller on GPU nodes"
    assert result.explain("team", "nope") == ("no such pod: team/nope is not in the cluster's reading "
                                              "(taken at 2026-01-01 12:00:00 UTC)")
    assert result.has_pod("team", "ds") and not result.has_pod("team", "nope") and not result.has_pod("other", "a")


def test_overriding_a_hand_set_cost_says_why_and_what_it_replaces():
    result = plan([make_node("n1")], [make_pod("a", "n1", annotations={labels.DELETION_COST: "500"})],
                  override_manual=True)
    (change,) = result.changes
    assert change.reason == ("node n1: 1 of 8 GPUs in use, 1 pod (all of its workload, no other workload on it) → its "
                             "workload's only node; cost = (0 + 1) × 1024 + 236 (node tie-break) = 1260; "
                             "overriding hand-set cost '500'")
