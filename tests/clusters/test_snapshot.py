"""The one pure view of a cluster: GPUs counted one way, the owner index, who waits for
GPUs. Snapshots built from plain objects (no database, no cluster), and one test of
`snapshot_take` reading a simulated cluster page by page."""
from __future__ import annotations

import gc
from datetime import UTC, datetime

import orjson
import pytest

from clusters import kube
from clusters.labels import GPU_RESOURCE
from clusters.selectors import snapshot_take
from clusters.snapshot import ClusterSnapshot, NodeView, PodView, gc_paused
from tests.expiring_pages import compacting_between_pages

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, gpus: int = 8) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {GPU_RESOURCE: str(gpus)}}}


def pod(name: str, *, node_name: str | None = "n1", gpus: int = 1, phase: str = "Running", owner_uid: str = "",
        deleting: bool = False, scheduled: dict | None = None, limits_only: bool = False) -> dict:
    amounts = {GPU_RESOURCE: str(gpus)}
    resources = {"limits": amounts} if limits_only else {"requests": amounts, "limits": amounts}
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner_uid:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node_name, "containers": [{"resources": resources}]},
            "status": {"phase": phase, "conditions": [scheduled] if scheduled else []}}


def snap(nodes: list[dict], pods: list[dict]) -> ClusterSnapshot:
    return ClusterSnapshot.build(taken_at=NOW, nodes=[NodeView.from_object(n) for n in nodes],
                                 pods=[PodView.from_object(p) for p in pods])


def test_a_nodes_gpus_are_what_its_live_pods_requested_and_the_rest_is_free():
    s = snap([node("n1"), node("n2", gpus=4)], [
        pod("running", gpus=3), pod("pending-bound", gpus=2, phase="Pending"),
        pod("finished", gpus=4, phase="Succeeded"), pod("failed", gpus=4, phase="Failed"),
        pod("leaving", gpus=4, deleting=True), pod("limits-only", gpus=1, limits_only=True),
        pod("elsewhere", node_name="n2", gpus=4)])
    assert (s.gpus_requested("n1"), s.gpus_free("n1")) == (6, 2)
    assert (s.gpus_requested("n2"), s.gpus_free("n2")) == (4, 0)
    assert s.gpus_free("no-such-node") == 0


def test_more_requested_than_allocatable_leaves_no_free_gpus_not_a_negative_count():
    s = snap([node("n1", gpus=2)], [pod("a", gpus=2), pod("b", gpus=2)])
    assert (s.gpus_requested("n1"), s.gpus_free("n1")) == (4, 0)


def test_pods_are_indexed_by_their_controller():
    s = snap([node("n1")], [pod("a", owner_uid="rs-1"), pod("b", owner_uid="rs-1"), pod("bare")])
    assert [p.name for p in s.pods_owned_by("rs-1")] == ["a", "b"]
    assert s.pods_owned_by("rs-2") == ()


SHORT = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": f"0/4 nodes are available: 4 Insufficient {GPU_RESOURCE}."}


@pytest.mark.parametrize("kwargs,waits", [
    (dict(node_name=None, phase="Pending", scheduled=SHORT), True),
    (dict(node_name=None, phase="Pending", scheduled={**SHORT, "message": "4 Insufficient cpu."}), False),
    (dict(node_name=None, phase="Pending", scheduled={**SHORT, "reason": "SchedulerError"}), False),
    (dict(node_name=None, phase="Pending", scheduled=SHORT, gpus=0), False),
    (dict(node_name="n1", phase="Pending", scheduled=SHORT), False),
    (dict(node_name=None, phase="Pending"), False),
])
def test_a_pod_waits_for_gpus_only_when_the_scheduler_said_gpus_were_short(kwargs, waits):
    assert PodView.from_object(pod("p", **kwargs)).pending_for_gpus is waits


def test_the_collector_runs_again_when_the_last_pause_ends_and_only_if_it_ran_before():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()              # the outer pause still holds
            raise RuntimeError("a read failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()                  # paused by someone else before: left so
    finally:
        gc.enable()


def gpu_cluster(nodes: int, pods_per_node: int) -> list[dict]:
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}]
    for n in range(nodes):
        docs.append({"apiVersion": "v1", "kind": "Node", **node(f"n{n}")})
        for p in range(pods_per_node):
            docs.append({"apiVersion": "v1", "kind": "Pod", **pod(f"p{n}-{p}", node_name=f"n{n}", gpus=2,
                                                                  owner_uid=f"rs-{n}")})
    return docs


def test_views_read_what_the_api_may_write_and_an_odd_value_spoils_only_its_own_field():
    from clusters.snapshot import NODE_LIST, POD_LIST

    items = [
        {"metadata": {"name": "bare"}},   # no namespace, spec or status
        {"metadata": {"name": "odd", "namespace": "ns", "labels": {"n": 3}, "deletionTimestamp": None,
                      "ownerReferences": [{"kind": "ReplicaSet", "uid": "rs", "controller": "true"}]},
         "spec": {"nodeName": None, "containers": [{"resources": {"limits": {GPU_RESOURCE: 2}}},
                                                   {"resources": None}, {"name": "no-resources"}]},
         "status": {"phase": None, "conditions": [{"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable"}]}},
        {"metadata": {"name": "junk-gpus"}, "spec": {"containers": [{"resources": {"requests": {GPU_RESOURCE: "x"}}}]}},
    ]
    page = POD_LIST.decode(orjson.dumps({"kind": "PodList", "metadata": {"continue": ""}, "items": items}))
    bare, odd, junk = (PodView.from_fields(p) for p in page.items)
    assert (bare.namespace, bare.phase, bare.gpus, bare.node_name, bare.owners, bare.live) == ("", "Pending", 0, None,
                                                                                               (), True)
    assert odd.labels == {"n": 3} and not odd.terminating and odd.gpus == 2 and odd.phase == "Pending"
    assert odd.controller.uid == "rs" and odd.unschedulable_message == "" and page.continue_token == ""
    assert junk.gpus == 0
    assert [PodView.from_fields(p) for p in page.items] == [PodView.from_object(p) for p in items]
    nodes = NODE_LIST.decode(orjson.dumps({"items": [
        {"metadata": {"name": "n1"}, "spec": {"unschedulable": True},
         "status": {"allocatable": {GPU_RESOURCE: "8"}, "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}]}))
    assert [(n.name, n.gpus_allocatable, n.unschedulable, n.ready) for n in map(NodeView.from_fields, nodes.items)] == [
        ("n1", 8, True, True), ("n2", 0, False, False)]


def test_a_view_made_from_a_callers_dict_keeps_none_of_it():
    raw = pod("p", owner_uid="rs")
    raw["metadata"]["labels"] = {"app": "a"}
    view = PodView.from_object(raw)
    raw["metadata"]["labels"]["app"] = "changed"
    assert view.labels == {"app": "a"}
    with pytest.raises(TypeError):
        view.labels["app"] = "x"
    with pytest.raises(ValueError, match="not a Pod the views can read: Object missing required field `name`"):
        PodView.from_object({"metadata": {"namespace": "ns"}})


@pytest.mark.django_db
def test_a_paged_snapshot_is_the_whole_cluster_read_a_page_at_a_time(sim_cluster_factory):
    handle = sim_cluster_factory(gpu_cluster(nodes=7, pods_per_node=3))
    whole = snapshot_take(handle.gateway, now=NOW, page_size=None)
    handle.gateway.calls.clear()
    paged = snapshot_take(handle.gateway, now=NOW, page_size=5)
    assert handle.gateway.calls == {("list", "nodes"): 2, ("list", "pods"): 5}   # 7 nodes, 21 pods by 5
    assert paged.nodes == whole.nodes and paged.pods == whole.pods
    assert len(paged.pods) == 21 and paged.gpus_free("n3") == 2 and len(paged.pods_owned_by("rs-6")) == 3
    assert gc.isenabled()


@pytest.mark.django_db
def test_a_gpu_nodes_snapshot_holds_the_gpu_nodes_and_only_the_pods_bound_to_them(sim_cluster_factory):
    docs = gpu_cluster(nodes=3, pods_per_node=2)
    docs.append({"apiVersion": "v1", "kind": "Node", **node("cpu-1", gpus=0)})
    docs.append({"apiVersion": "v1", "kind": "Pod", **pod("web", node_name="cpu-1", gpus=0)})
    docs.append({"apiVersion": "v1", "kind": "Pod", **pod("waiting", node_name=None, gpus=16, phase="Pending")})
    handle = sim_cluster_factory(docs)
    whole = snapshot_take(handle.gateway, now=NOW)
    assert len(whole.nodes) == 4 and len(whole.pods) == 8   # the CPU node, its pod and the unbound one too
    handle.gateway.calls.clear()
    gpus_only = snapshot_take(handle.gateway, now=NOW, gpu_nodes_only=True, page_size=4)
    assert handle.gateway.calls == {("list", "nodes"): 1, ("list", "pods"): 2}   # the same LISTs, 8 pods by 4
    assert [n.name for n in gpus_only.nodes] == ["n0", "n1", "n2"]
    assert sorted(p.name for p in gpus_only.pods) == ["p0-0", "p0-1", "p1-0", "p1-1", "p2-0", "p2-1"]
    assert [p for p in whole.pods if p.node_name in ("n0", "n1", "n2")] == list(gpus_only.pods)
    assert gpus_only.gpus_free("n1") == whole.gpus_free("n1") == 4 and gpus_only.node("cpu-1") is None
    with pytest.raises(ValueError, match="needs the nodes read"):
        snapshot_take(handle.gateway, now=NOW, nodes=False, gpu_nodes_only=True)


@pytest.mark.django_db
def test_a_snapshot_whose_pages_expire_is_read_again_in_one_list(sim_cluster_factory, monkeypatch):
    handle = sim_cluster_factory(gpu_cluster(nodes=7, pods_per_node=3))
    gateway = handle.gateway
    gateway.calls.clear()
    compacting_between_pages(gateway, handle.sim, monkeypatch, pod="p0-0", namespace="ns")
    snapshot = snapshot_take(gateway, now=NOW, page_size=5)
    assert len(snapshot.pods) == 21 and len({p.name for p in snapshot.pods}) == 21   # none twice, none lost
    assert next(p for p in snapshot.pods if p.name == "p0-0").labels["seen"] == "late"
    # first page, the expired continue (410), then one full LIST
    assert gateway.calls[("list", "pods")] == 3 and gateway.errors[("list", "pods")] == 1


@pytest.mark.parametrize("resources,gpus,asks", [
    ({"limits": {"nvidia.com/gpu": "2"}}, 2, True),
    ({"requests": {"nvidia.com/mig-1g.5gb": "1"}, "limits": {"nvidia.com/mig-1g.5gb": "1"}}, 0, True),
    ({"limits": {"nvidia.com/gpu.shared": "1"}}, 0, True),
    ({"limits": {"nvidia.com/gpu": "0", "nvidia.com/mig-2g.10gb": "0"}, "requests": {"cpu": "4"}}, 0, False),
    ({"limits": {"amd.com/gpu": "1"}}, 0, False),
])
def test_a_pod_view_counts_whole_gpus_and_tells_any_nvidia_device_apart(resources, gpus, asks):
    # The capacity planners count whole GPUs only (a node's nvidia.com/gpu); a MIG slice or
    # a shared GPU is an NVIDIA device all the same (the pruner's owners count it).
    view = PodView.from_object({"metadata": {"name": "p", "namespace": "a"},
                                "spec": {"containers": [{"name": "c", "resources": resources}]},
                                "status": {"phase": "Running"}})
    assert (view.gpus, view.asks_nvidia) == (gpus, asks)
