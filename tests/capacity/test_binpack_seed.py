"""Seed 003 end to end, with this product as the "third-party component" that writes
`controller.kubernetes.io/pod-deletion-cost`: the seed's ModelServing `sample` (two
ServingGroups, roles prefill and decode of two replicas each) on the simulated
cluster's Kthena controller, costs written by the binpack service through the real
client, then the seed's two scale-downs (ServingGroups 2 -> 1, decode replicas 2 -> 1).

Placement (bound by the scenario's own scheduler, see `binpack_world.PLACER`):
    n0: sample-0 (all four pods)                 -> the group that frees a node
    n1: sample-1 prefill-0, prefill-1, decode-1, and `other` (another model)
    n2: sample-1 decode-0, alone                 -> the role replica that frees a node
Kthena's default order (highest index first) would remove sample-1 and then decode-1,
freeing nothing; with the costs the seed's own outcome follows (sample-0 goes, then
decode-0) and each step frees a whole GPU node."""
from __future__ import annotations

import pytest

from binpack_world import GROUP, PLACER, PLURAL, POOL, VERSION, World, cluster_docs, node_name
from capacity.binpack import planning as bp
from clusters import labels
from capacity.binpack.services import pod_deletion_costs_apply

pytestmark = pytest.mark.django_db
TAG = "seed"
PLACEMENT = {"sample-0-prefill-0-0": 0, "sample-0-prefill-1-0": 0, "sample-0-decode-0-0": 0,
             "sample-0-decode-1-0": 0, "sample-1-prefill-0-0": 1, "sample-1-prefill-1-0": 1,
             "sample-1-decode-1-0": 1, "other-0-serve-0-0": 1, "sample-1-decode-0-0": 2}


def _template(role: str) -> dict:
    return {"metadata": {"labels": {"app": f"sample-{role}"}},
            "spec": {"schedulerName": PLACER, "nodeSelector": {POOL: TAG},
                     "containers": [{"name": role, "image": "vllm/vllm-openai:v0.6",
                                     "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}}


def modelserving(name: str, groups: int, roles: dict[str, int]) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelServing", "metadata": {"name": name, "namespace": TAG},
            "spec": {"replicas": groups, "template": {"roles": [
                {"name": role, "replicas": n, "entryTemplate": _template(role), "workerReplicas": 0}
                for role, n in roles.items()]}}}


def live_pods(world: World) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in world.core.list_namespaced_pod(TAG).items
            if not p.metadata.deletion_timestamp}


@pytest.fixture
def seed_world(sim_cluster_factory):
    handle = sim_cluster_factory(cluster_docs({TAG: 3}))
    world = World(handle)
    world.crd.create_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL,
                                              modelserving("sample", 2, {"prefill": 2, "decode": 2}))
    world.crd.create_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL, modelserving("other", 1, {"serve": 1}))
    handle.advance(0)
    for name, node in PLACEMENT.items():
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node_name(TAG, node)}}
        world.core.create_namespaced_pod_binding(name, TAG, body, _preload_content=False)
    handle.advance(30)
    assert live_pods(world) == {name: node_name(TAG, node) for name, node in PLACEMENT.items()}
    yield handle, world
    world.close()


def test_seed_003_walkthrough_with_the_costs_written_by_the_binpack_service(seed_world):
    handle, world = seed_world
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert run.errors == [] and run.written == len(PLACEMENT)
    ranks = {g.group: g.rank for g in plan.groups if g.workload == f"{TAG}/ModelServing/sample"}
    assert ranks == {"sample-0": 0, "sample-1": 1}          # the plan says which group goes first

    # ServingGroups 2 -> 1: sample-0 goes, as in the seed, and frees n0.
    world.crd.patch_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL, "sample", {"spec": {"replicas": 1}})
    handle.advance(120)
    assert sorted(live_pods(world)) == ["other-0-serve-0-0", "sample-1-decode-0-0", "sample-1-decode-1-0",
                                        "sample-1-prefill-0-0", "sample-1-prefill-1-0"]
    assert world.freed(TAG, 3) == 1

    # Nothing about the pods left changed: a second run writes nothing.
    again, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    assert (again.written, again.unchanged) == (0, 5)

    # decode replicas 2 -> 1: decode-0, alone on n2, goes (the seed's outcome) and frees n2.
    ms = world.crd.get_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL, "sample")
    ms["spec"]["template"]["roles"][1]["replicas"] = 1
    world.crd.replace_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL, "sample", ms)
    handle.advance(120)
    assert sorted(live_pods(world)) == ["other-0-serve-0-0", "sample-1-decode-1-0",
                                        "sample-1-prefill-0-0", "sample-1-prefill-1-0"]
    assert world.freed(TAG, 3) == 2


def test_the_seeds_hand_set_cost_is_kept_and_still_counts_in_its_groups_sum(seed_world):
    """The seed's `kubectl edit pod sample-1-decode-1-0`: the service leaves that cost
    alone, and Kthena still sums it with the costs the service wrote for the others."""
    handle, world = seed_world
    world.core.patch_namespaced_pod("sample-0-decode-1-0", TAG,
                                    {"metadata": {"annotations": {labels.DELETION_COST: "2000000"}}})
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert [s.name for s in plan.skipped] == ["sample-0-decode-1-0"]
    assert run.written == len(PLACEMENT) - 1
    ranks = {g.group: g.rank for g in plan.groups if g.workload == f"{TAG}/ModelServing/sample"}
    assert ranks == {"sample-1": 0, "sample-0": 1}          # the hand-set cost counts in sample-0's sum
    annotations = world.core.read_namespaced_pod("sample-0-decode-1-0", TAG).metadata.annotations
    assert annotations[labels.DELETION_COST] == "2000000" and labels.BINPACK_MARKER not in annotations
    # The operator made sample-0 the costlier group: sample-1 goes, as they asked.
    world.crd.patch_namespaced_custom_object(GROUP, VERSION, TAG, PLURAL, "sample", {"spec": {"replicas": 1}})
    handle.advance(120)
    assert not [n for n in live_pods(world) if n.startswith("sample-1-")]
    assert len([n for n in live_pods(world) if n.startswith("sample-0-")]) == 4
