"""Deployments, ReplicaSets, StatefulSets, DaemonSets, PDBs and garbage collection in the
simulated cluster, driven through the official `kubernetes` client as KUBERNETES.md
describes them (claiming, release, scale-down order, eviction, propagation policies)."""
from __future__ import annotations

import pytest
from kubernetes.client import ApiException

from simcluster_helpers import status_of

NS = "team-a"
HASH = "pod-template-hash"
COST = "controller.kubernetes.io/pod-deletion-cost"


def deployment(name="web", replicas=2, *, image="vllm:1", max_surge=1, max_unavailable=0) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": image}]}}}}


def live_pods(kube, selector="app=web") -> list:
    return [p for p in kube.core.list_namespaced_pod(NS, label_selector=selector).items
            if not p.metadata.deletion_timestamp]


def replicasets(kube, selector="app=web") -> list:
    return sorted(kube.apps.list_namespaced_replica_set(NS, label_selector=selector).items,
                  key=lambda rs: rs.metadata.creation_timestamp)


def controller_uid(obj) -> str | None:
    return next((r.uid for r in obj.metadata.owner_references or () if r.controller), None)


def running_deployment(kube, **options):
    kube.apps.create_namespaced_deployment(NS, deployment(**options))
    kube.control.advance(30)
    return kube.apps.read_namespaced_deployment(options.get("name", "web"), NS)


# ---- Deployment → ReplicaSet → Pods --------------------------------------------------------
def test_a_deployment_makes_a_replicaset_with_the_pod_template_hash_and_its_pods_run(kube):
    dep = running_deployment(kube, replicas=3)
    [rs] = replicasets(kube)
    pod_hash = rs.metadata.labels[HASH]
    assert rs.metadata.name == f"web-{pod_hash}"
    assert controller_uid(rs) == dep.metadata.uid
    assert rs.spec.selector.match_labels == {"app": "web", HASH: pod_hash}
    assert rs.spec.template.metadata.labels[HASH] == pod_hash
    pods = live_pods(kube)
    assert len(pods) == 3
    assert all(p.metadata.labels[HASH] == pod_hash and controller_uid(p) == rs.metadata.uid for p in pods)
    assert all(p.status.phase == "Running" and p.spec.node_name for p in pods)
    assert (dep.status.replicas, dep.status.ready_replicas, dep.status.available_replicas) == (3, 3, 3)


def test_a_template_change_rolls_to_a_new_replicaset_within_max_surge_and_max_unavailable(kube):
    running_deployment(kube, replicas=4, max_surge=1, max_unavailable=0)
    kube.apps.patch_namespaced_deployment("web", NS, {"spec": {"template": {"spec": {
        "containers": [{"name": "main", "image": "vllm:2"}]}}}})
    kube.control.advance(0)
    old, new = replicasets(kube)
    # maxSurge 1 and maxUnavailable 0: one new pod first, no old pod goes before it is Ready.
    assert (old.spec.replicas, new.spec.replicas) == (4, 1)
    assert new.metadata.labels[HASH] != old.metadata.labels[HASH]
    assert new.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    assert len(kube.core.list_namespaced_pod(NS, label_selector="app=web").items) == 5
    kube.control.advance(120)
    old, new = replicasets(kube)
    assert (old.spec.replicas, new.spec.replicas) == (0, 4)
    pods = live_pods(kube)
    assert len(pods) == 4 and {p.spec.containers[0].image for p in pods} == {"vllm:2"}
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.status.updated_replicas == 4 and dep.status.available_replicas == 4


# ---- claiming: adoption and release -------------------------------------------------------
def test_removing_only_the_owner_reference_gets_the_pod_adopted_again(kube):
    running_deployment(kube, replicas=2)
    [rs] = replicasets(kube)
    pod = live_pods(kube)[0]
    kube.core.patch_namespaced_pod(pod.metadata.name, NS, [{"op": "remove", "path": "/metadata/ownerReferences"}])
    assert kube.core.read_namespaced_pod(pod.metadata.name, NS).metadata.owner_references is None
    kube.control.advance(60)
    # Its labels still match the selector, pod-template-hash included: the ReplicaSet claims it back.
    again = kube.core.read_namespaced_pod(pod.metadata.name, NS)
    assert controller_uid(again) == rs.metadata.uid and again.metadata.uid == pod.metadata.uid
    assert len(live_pods(kube)) == 2


def test_removing_owner_reference_and_hash_releases_the_pod_and_a_replacement_is_made(kube):
    running_deployment(kube, replicas=2)
    [rs] = replicasets(kube)
    orphan = live_pods(kube)[0]
    kube.core.patch_namespaced_pod(orphan.metadata.name, NS, [
        {"op": "remove", "path": "/metadata/ownerReferences"},
        {"op": "remove", "path": f"/metadata/labels/{HASH}"}])
    kube.control.advance(60)
    left = kube.core.read_namespaced_pod(orphan.metadata.name, NS)
    assert left.metadata.owner_references is None and left.status.phase == "Running"
    owned = [p for p in live_pods(kube) if controller_uid(p) == rs.metadata.uid]
    assert len(owned) == 2 and orphan.metadata.name not in {p.metadata.name for p in owned}
    # Nothing cleans an orphan up: it is still there much later.
    kube.control.advance(3600)
    assert kube.core.read_namespaced_pod(orphan.metadata.name, NS).metadata.owner_references is None


def test_an_orphan_matching_again_is_adopted_and_the_extra_pod_goes_by_the_scale_down_order(kube):
    running_deployment(kube, replicas=2)
    [rs] = replicasets(kube)
    orphan = live_pods(kube)[0]
    pod_hash = orphan.metadata.labels[HASH]
    kube.core.patch_namespaced_pod(orphan.metadata.name, NS, [
        {"op": "remove", "path": "/metadata/ownerReferences"},
        {"op": "remove", "path": f"/metadata/labels/{HASH}"}])
    kube.control.advance(0)
    [replacement] = [p for p in live_pods(kube) if p.metadata.name != orphan.metadata.name
                     and p.status.phase != "Running"]
    # The label comes back while the replacement is still starting: the ReplicaSet adopts
    # the orphan, has one too many, and deletes the Pending one first (rule 2).
    kube.core.patch_namespaced_pod(orphan.metadata.name, NS, {"metadata": {"labels": {HASH: pod_hash}}})
    kube.control.advance(0)
    assert controller_uid(kube.core.read_namespaced_pod(orphan.metadata.name, NS)) == rs.metadata.uid
    names = {p.metadata.name for p in live_pods(kube)}
    assert len(names) == 2 and orphan.metadata.name in names and replacement.metadata.name not in names
    events = kube.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={rs.metadata.name}").items
    assert any(e.reason == "SuccessfulDelete" and replacement.metadata.name in e.message for e in events)


def test_scale_down_deletes_the_lowest_pod_deletion_cost_first(kube):
    running_deployment(kube, replicas=3)
    cheap, dear, normal = sorted(p.metadata.name for p in live_pods(kube))
    kube.core.patch_namespaced_pod(cheap, NS, {"metadata": {"annotations": {COST: "-100"}}})
    kube.core.patch_namespaced_pod(dear, NS, {"metadata": {"annotations": {COST: "100"}}})
    kube.apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 2}})
    kube.control.advance(0)
    assert {p.metadata.name for p in live_pods(kube)} == {dear, normal}
    kube.apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 1}})
    kube.control.advance(0)
    assert {p.metadata.name for p in live_pods(kube)} == {dear}


def test_an_invalid_pod_deletion_cost_is_refused_with_422(kube):
    running_deployment(kube, replicas=1)
    name = live_pods(kube)[0].metadata.name
    for bad in ("+5", "007", "2147483648", "ten"):
        with pytest.raises(ApiException) as refused:
            kube.core.patch_namespaced_pod(name, NS, {"metadata": {"annotations": {COST: bad}}})
        assert refused.value.status == 422 and status_of(refused.value)["reason"] == "Invalid"


# ---- StatefulSet -----------------------------------------------------------------------------
def statefulset(replicas=3) -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": NS},
            "spec": {"replicas": replicas, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "main", "image": "postgres:16"}]}}}}


def test_a_statefulset_makes_ordinal_pods_one_at_a_time_and_removes_the_highest_first(kube):
    kube.apps.create_namespaced_stateful_set(NS, statefulset(3))
    kube.control.advance(0)
    assert [p.metadata.name for p in live_pods(kube, "app=db")] == ["db-0"]   # OrderedReady
    kube.control.advance(60)
    pods = live_pods(kube, "app=db")
    assert sorted(p.metadata.name for p in pods) == ["db-0", "db-1", "db-2"]
    assert {p.metadata.labels["statefulset.kubernetes.io/pod-name"] for p in pods} == {"db-0", "db-1", "db-2"}
    assert kube.apps.read_namespaced_stateful_set("db", NS).status.ready_replicas == 3
    kube.apps.patch_namespaced_stateful_set_scale("db", NS, {"spec": {"replicas": 1}})
    kube.control.advance(0)
    assert sorted(p.metadata.name for p in live_pods(kube, "app=db")) == ["db-0", "db-1"]
    kube.control.advance(120)
    assert [p.metadata.name for p in kube.core.list_namespaced_pod(NS, label_selector="app=db").items] == ["db-0"]
    # A deleted member comes back under its own name.
    kube.core.delete_namespaced_pod("db-0", NS)
    kube.control.advance(60)
    assert [p.metadata.name for p in live_pods(kube, "app=db")] == ["db-0"]


# ---- DaemonSet -------------------------------------------------------------------------------
def test_a_daemonset_runs_one_pod_per_node_cordoned_nodes_included(kube):
    kube.core.patch_node("gpu-2", {"spec": {"unschedulable": True}})
    kube.apps.create_namespaced_daemon_set(NS, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "dcgm", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "dcgm"}},
                 "template": {"metadata": {"labels": {"app": "dcgm"}},
                              "spec": {"containers": [{"name": "exporter", "image": "dcgm-exporter:3"}]}}}})
    kube.control.advance(30)
    pods = live_pods(kube, "app=dcgm")
    assert sorted(p.spec.node_name for p in pods) == ["gpu-1", "gpu-2"]
    assert all(p.status.phase == "Running" for p in pods)
    status = kube.apps.read_namespaced_daemon_set("dcgm", NS).status
    assert (status.desired_number_scheduled, status.number_ready) == (2, 2)
    # An ordinary pod is not placed on the cordoned node.
    running_deployment(kube, replicas=3)
    assert {p.spec.node_name for p in live_pods(kube)} == {"gpu-1"}


# ---- PodDisruptionBudget and eviction --------------------------------------------------------
def evict(kube, name: str) -> None:
    kube.core.create_namespaced_pod_eviction(name, NS, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                        "metadata": {"name": name, "namespace": NS}})


def test_an_eviction_is_refused_with_429_while_the_budget_forbids_it_then_allowed(kube):
    running_deployment(kube, replicas=2)
    kube.policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": NS},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
    kube.control.advance(0)
    pdb = kube.policy.read_namespaced_pod_disruption_budget("web", NS)
    assert (pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.disruptions_allowed) == (2, 2, 0)
    victim = live_pods(kube)[0].metadata.name
    with pytest.raises(ApiException) as refused:
        evict(kube, victim)
    assert refused.value.status == 429
    assert "disruption budget" in status_of(refused.value)["message"]
    assert not kube.core.read_namespaced_pod(victim, NS).metadata.deletion_timestamp

    kube.policy.patch_namespaced_pod_disruption_budget("web", NS, {"spec": {"minAvailable": 1}})
    kube.control.advance(0)
    assert kube.policy.read_namespaced_pod_disruption_budget("web", NS).status.disruptions_allowed == 1
    evict(kube, victim)
    assert kube.core.read_namespaced_pod(victim, NS).metadata.deletion_timestamp
    # The allowance is spent at once: a second eviction before the pods recover is refused.
    other = next(p.metadata.name for p in live_pods(kube) if p.metadata.name != victim)
    with pytest.raises(ApiException) as again:
        evict(kube, other)
    assert again.value.status == 429


# ---- garbage collection: propagation policies ------------------------------------------------
def everything(kube) -> tuple[list, list]:
    return replicasets(kube), kube.core.list_namespaced_pod(NS, label_selector="app=web").items


def test_background_deletion_removes_the_deployment_now_and_its_dependents_after(kube):
    running_deployment(kube, replicas=2)
    kube.apps.delete_namespaced_deployment("web", NS, propagation_policy="Background")
    with pytest.raises(ApiException) as gone:
        kube.apps.read_namespaced_deployment("web", NS)
    assert gone.value.status == 404
    kube.control.advance(60)
    assert everything(kube) == ([], [])


def test_foreground_deletion_keeps_the_owner_until_its_dependents_are_gone(kube):
    running_deployment(kube, replicas=2)
    kube.apps.delete_namespaced_deployment("web", NS, propagation_policy="Foreground")
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.metadata.deletion_timestamp and "foregroundDeletion" in dep.metadata.finalizers
    kube.control.advance(0)
    # Pods terminate for their grace period; the Deployment waits for them.
    assert kube.apps.read_namespaced_deployment("web", NS).metadata.deletion_timestamp
    assert all(p.metadata.deletion_timestamp for p in everything(kube)[1])
    kube.control.advance(60)
    assert everything(kube) == ([], [])
    with pytest.raises(ApiException) as gone:
        kube.apps.read_namespaced_deployment("web", NS)
    assert gone.value.status == 404


def test_orphan_deletion_leaves_the_replicaset_and_pods_without_owner(kube):
    running_deployment(kube, replicas=2)
    [rs] = replicasets(kube)
    kube.apps.delete_namespaced_deployment("web", NS, propagation_policy="Orphan")
    kube.control.advance(60)
    [left], pods = everything(kube)
    assert left.metadata.uid == rs.metadata.uid and left.metadata.owner_references is None
    assert len(pods) == 2 and all(controller_uid(p) == rs.metadata.uid for p in pods)
    assert all(not p.metadata.deletion_timestamp for p in pods)


def test_an_unknown_propagation_policy_is_a_400(kube):
    running_deployment(kube, replicas=1)
    with pytest.raises(ApiException) as refused:
        kube.apps.delete_namespaced_deployment("web", NS, propagation_policy="Sideways")
    assert refused.value.status == 400


def test_pods_of_the_bin_packing_profile_fill_the_fullest_node_while_the_default_profile_spreads(kube_factory):
    """Two 8-GPU nodes under spread placement: pods naming `bin-packing-scheduler` go where
    most GPUs are taken already, default-scheduler pods where fewest are."""
    node = ("apiVersion: v1\nkind: Node\nmetadata: {{name: {}}}\nstatus:\n"
            "  allocatable: {{cpu: '64', memory: 512Gi, nvidia.com/gpu: '8', pods: '110'}}\n")
    kube = kube_factory("---\n".join([f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n",
                                      node.format("gpu-1"), node.format("gpu-2")]))

    def gpu_deployment(name: str, replicas: int, scheduler: str | None = None) -> dict:
        doc = deployment(name, replicas)
        spec = doc["spec"]["template"]["spec"]
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
        if scheduler:
            spec["schedulerName"] = scheduler
        return doc

    kube.apps.create_namespaced_deployment(NS, gpu_deployment("spread", 2))
    kube.control.advance(30)
    assert sorted(p.spec.node_name for p in live_pods(kube, "app=spread")) == ["gpu-1", "gpu-2"]
    kube.apps.create_namespaced_deployment(NS, gpu_deployment("packed", 3, "bin-packing-scheduler"))
    kube.control.advance(30)
    packed = [p.spec.node_name for p in live_pods(kube, "app=packed")]
    assert len(packed) == 3 and packed[0] in ("gpu-1", "gpu-2") and len(set(packed)) == 1, packed
