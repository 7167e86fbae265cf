"""Binpack end to end on both backends: the product writes pod-deletion-costs, and the
ReplicaSet controller (upstream kube-controller-manager's on the real tier) chooses by
them when a Deployment scales down — freeing a whole GPU node.

Two Deployments of three GPU pods, each laid out two on one node and one on another
(bound by the test, as a scheduler would). Without costs the ReplicaSet controller
removes a pod from the node where the Deployment is doubled up (upstream's
`ActivePodsWithRanks`: after phase and readiness, pods on nodes with more of their own
kind go first) and frees nothing; with the costs, lower cost comes before that rank and
the lone pod goes, its node left empty. One Deployment opts out of binpack
(`capacity.io/binpack: "false"`) and shows the default.
"""
from __future__ import annotations

import pytest

from capacity.binpack import planning as bp
from clusters import labels
from capacity.binpack.services import pod_deletion_costs_apply

from .pool import GpuPool, ready

PLACER = "binpack-test-placer"   # the default scheduler leaves these pods to the test
SECONDS = 30                     # simulated on simcluster, wall time on the real tier


@pytest.fixture
def gpus(tier_cluster):
    _, backend = tier_cluster
    pool = GpuPool(backend, "binpack")
    yield pool
    pool.close()


def lay_out(pool: GpuPool, app: str, doubled: str, alone: str) -> dict[str, str]:
    """Bind the Deployment's three pods: two on `doubled`, one on `alone`; all Ready."""
    pods = pool.backend.settle(lambda: (lambda found: found if len(found) == 3 else None)(pool.pods(app=app)),
                               what=f"3 pods of {app}", seconds=SECONDS)
    names = sorted(p.metadata.name for p in pods)
    placement = {names[0]: doubled, names[1]: doubled, names[2]: alone}
    for pod, node in placement.items():
        pool.bind(pod, node)
    pool.backend.settle(lambda: all(ready(p) for p in pool.pods(app=app)) and len(pool.pods(app=app)) == 3,
                        what=f"3 Ready pods of {app}", seconds=SECONDS)
    return placement


def nodes_after_scale_down(pool: GpuPool, app: str) -> dict[str, str]:
    pool.apps.patch_namespaced_deployment_scale(app, pool.ns, {"spec": {"replicas": 2}})
    survivors = pool.backend.settle(
        lambda: (lambda live: live if len(live) == 2 else None)(pool.pods(app=app)),
        what=f"{app} scaled down to 2", seconds=SECONDS)
    return {p.metadata.name: p.spec.node_name for p in survivors}


def test_the_replicaset_controller_frees_a_gpu_node_by_the_costs_binpack_wrote(tier_cluster, gpus):
    cluster, backend = tier_cluster
    n1, n2, n3, n4 = (gpus.node_add(f"n{i}") for i in range(1, 5))
    gpus.deployment("packed", replicas=3, scheduler=PLACER)
    gpus.deployment("default", replicas=3, scheduler=PLACER, annotations={labels.BINPACK_OPT_OUT: "false"})
    packed = lay_out(gpus, "packed", n1, n2)
    default = lay_out(gpus, "default", n3, n4)

    run, plan = pod_deletion_costs_apply(cluster=cluster)
    assert not run.errors
    costs = {p.metadata.name: (p.metadata.annotations or {}).get(labels.DELETION_COST) for p in gpus.pods()}
    lone = next(name for name, node in packed.items() if node == n2)
    assert all(costs[name] is not None for name in packed)
    assert all(int(costs[lone]) < int(costs[name]) for name in packed if name != lone)
    assert all(costs[name] is None for name in default)                 # opted out: left alone
    assert {s.name: s.reason for s in plan.skipped if s.name in default} == {
        name: "workload opted out" for name in default}

    assert sorted(nodes_after_scale_down(gpus, "packed").values()) == [n1, n1]    # n2 freed
    assert gpus.pods(node=n2) == []
    # Without costs the controller thins the doubled-up node instead: no node freed.
    assert sorted(nodes_after_scale_down(gpus, "default").values()) == [n3, n4]
