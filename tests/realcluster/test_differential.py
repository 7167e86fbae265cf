"""Differential checks: the same script on simcluster and on the real control plane,
comparing what an API client observes.

Each check is a function of a backend returning its observations as plain data; the
test runs it on both, asserts the real cluster's answer is the upstream behaviour a user
relies on, and asserts simcluster observed the same.
"""
from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .backends import Backend

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


@pytest.fixture
def tiers(sim_tier, real_tier) -> dict[str, Backend]:
    return {"simcluster": sim_tier, "real": real_tier}


def _replicaset(name: str, replicas: int, *, labels: dict | None = None) -> client.V1ReplicaSet:
    labels = labels or {"app": name}
    return client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ReplicaSetSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="model", image="dev.local/model:1",
                    resources=client.V1ResourceRequirements(requests={"cpu": "100m"}))]))))


def _ready(pod: client.V1Pod) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _live_pods(kube: Backend, namespace: str, selector: str) -> list[client.V1Pod]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
    return sorted((p for p in pods if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)


def _wait_ready(kube: Backend, namespace: str, selector: str, count: int) -> list[client.V1Pod]:
    def ready_pods():
        pods = _live_pods(kube, namespace, selector)
        return pods if len(pods) == count and all(_ready(p) for p in pods) else None
    return kube.settle(ready_pods, what=f"{count} ready pods {selector}")


def _error(exc: ApiException) -> dict:
    body = json.loads(exc.body) if exc.body else {}
    causes = (body.get("details") or {}).get("causes") or []
    return {"code": exc.status, "reason": body.get("reason"), "message": body.get("message"),
            "causes": [(c.get("reason"), c.get("message")) for c in causes]}


# --- ReplicaSet scale-down by pod-deletion-cost ---------------------------------------------------
def replicaset_scale_down_by_cost(kube: Backend) -> dict:
    """Three ready pods with deletion costs 100, -50 and 0; scale to 2, then to 1: which
    costs survive each step."""
    ns = kube.namespace_create("rs-cost")
    kube.apps.create_namespaced_replica_set(ns, _replicaset("model", 3))
    pods = _wait_ready(kube, ns, "app=model", 3)
    cost_of = {}
    for pod, cost in zip(pods, ("100", "-50", "0")):
        kube.core.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"annotations": {DELETION_COST: cost}}})
        cost_of[pod.metadata.name] = int(cost)
    observed = {}
    for replicas in (2, 1):
        kube.apps.patch_namespaced_replica_set_scale("model", ns, {"spec": {"replicas": replicas}})
        survivors = kube.settle(lambda: (lambda live: live if len(live) == replicas else None)(
            _live_pods(kube, ns, "app=model")), what=f"scale-down to {replicas}")
        observed[f"costs kept at {replicas}"] = sorted(cost_of[p.metadata.name] for p in survivors)
    return observed


def test_replicaset_scale_down_removes_the_lowest_deletion_cost_first(tiers):
    seen = {name: replicaset_scale_down_by_cost(kube) for name, kube in tiers.items()}
    assert seen["real"] == {"costs kept at 2": [0, 100], "costs kept at 1": [100]}
    assert seen["simcluster"] == seen["real"]


# --- orphaning a pod and re-adoption -----------------------------------------------------------------
def orphan_and_readopt(kube: Backend) -> dict:
    """Remove a pod's ownerReferences with a JSON patch guarded by a `test` of the owner's
    uid: (1) with a wrong uid the patch is refused; (2) labels unchanged, the ReplicaSet
    adopts it back; (3) labels changed in the same patch, it stays an orphan and the
    ReplicaSet makes a replacement."""
    ns = kube.namespace_create("orphan")
    kube.apps.create_namespaced_replica_set(ns, _replicaset("model", 2))
    pods = _wait_ready(kube, ns, "app=model", 2)
    rs_uid = kube.apps.read_namespaced_replica_set("model", ns).metadata.uid
    target = pods[0].metadata.name
    observed = {}

    try:
        kube.core.patch_namespaced_pod(target, ns, [
            {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "not-the-owner"},
            {"op": "remove", "path": "/metadata/ownerReferences"}])
        observed["wrong uid"] = "patched"
    except ApiException as exc:
        error = _error(exc)
        observed["wrong uid"] = {"code": error["code"], "reason": error["reason"]}
    observed["wrong uid: still owned"] = bool(kube.core.read_namespaced_pod(target, ns).metadata.owner_references)

    kube.core.patch_namespaced_pod(target, ns, [
        {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": rs_uid},
        {"op": "remove", "path": "/metadata/ownerReferences"}])

    def adopted():
        refs = kube.core.read_namespaced_pod(target, ns).metadata.owner_references or []
        return [(r.kind, r.name, r.uid == rs_uid, r.controller) for r in refs]
    observed["labels kept: owner after settling"] = kube.settle(adopted, what="re-adoption")
    observed["labels kept: pods"] = len(_live_pods(kube, ns, "app=model"))

    kube.core.patch_namespaced_pod(target, ns, [
        {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": rs_uid},
        {"op": "remove", "path": "/metadata/ownerReferences"},
        {"op": "replace", "path": "/metadata/labels/app", "value": "debug"}])
    owned = kube.settle(lambda: (lambda live: live if len(live) == 2 and all(_ready(p) for p in live) else None)(
        _live_pods(kube, ns, "app=model")), what="a replacement pod")
    observed["labels changed: owned ready pods"] = len(owned)
    observed["labels changed: replacement is new"] = target not in {p.metadata.name for p in owned}
    orphan = kube.core.read_namespaced_pod(target, ns)
    observed["labels changed: orphan owners"] = orphan.metadata.owner_references or []
    observed["labels changed: orphan still running"] = _ready(orphan)
    return observed


def test_orphaning_a_pod_and_the_replicaset_readopting_or_replacing_it(tiers):
    seen = {name: orphan_and_readopt(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "wrong uid": {"code": 422, "reason": "Invalid"},
        "wrong uid: still owned": True,
        "labels kept: owner after settling": [("ReplicaSet", "model", True, True)],
        "labels kept: pods": 2,
        "labels changed: owned ready pods": 2,
        "labels changed: replacement is new": True,
        "labels changed: orphan owners": [],
        "labels changed: orphan still running": True,
    }
    assert seen["simcluster"] == seen["real"]


# --- eviction with a PodDisruptionBudget, ready pods -------------------------------------------------
def _pdb_settled(kube: Backend, ns: str, allowed: int):
    def settled():
        pdb = kube.policy.read_namespaced_pod_disruption_budget("web", ns)
        status = pdb.status
        if status and status.observed_generation == pdb.metadata.generation and status.disruptions_allowed == allowed:
            return pdb
        return None
    return kube.settle(settled, what=f"PDB web allowing {allowed} disruptions")


def _evict(kube: Backend, ns: str, name: str) -> dict:
    try:
        kube.core.create_namespaced_pod_eviction(name, ns, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=ns)))
        return {"code": 201}
    except ApiException as exc:
        return _error(exc)


def evict_with_pdb_ready_pods(kube: Backend) -> dict:
    """Two ready pods under a PDB: minAvailable 2 refuses an eviction; minAvailable 1
    allows one, then refuses the next while the replacement cannot be scheduled (its
    template asks for a node nobody has, so the budget cannot recover behind our back)."""
    ns = kube.namespace_create("evict")
    kube.apps.create_namespaced_replica_set(ns, _replicaset("web", 2))
    pods = _wait_ready(kube, ns, "app=web", 2)
    kube.policy.create_namespaced_pod_disruption_budget(ns, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1PodDisruptionBudgetSpec(min_available=2,
                                              selector=client.V1LabelSelector(match_labels={"app": "web"}))))
    observed = {}
    pdb = _pdb_settled(kube, ns, 0)
    observed["minAvailable 2: healthy/desired/expected"] = (
        pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.expected_pods)
    observed["minAvailable 2: evict"] = _evict(kube, ns, pods[0].metadata.name)

    kube.apps.patch_namespaced_replica_set("web", ns, {"spec": {"template": {"spec": {
        "nodeSelector": {"realcluster.test/nowhere": "true"}}}}})
    kube.policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 1}})
    _pdb_settled(kube, ns, 1)
    observed["minAvailable 1: first evict"] = _evict(kube, ns, pods[0].metadata.name)
    at_once = _evict(kube, ns, pods[1].metadata.name)
    # Its cause names the healthy count the budget's status held at that instant: 2 or 1,
    # depending on whether the disruption controller had already seen the eviction.
    observed["minAvailable 1: second evict at once"] = {k: v for k, v in at_once.items() if k != "causes"}

    def replacement_pending():
        live = _live_pods(kube, ns, "app=web")
        # Pending and looked at by the scheduler (its PodScheduled condition written).
        pending = [p for p in live if p.status.phase == "Pending" and p.status.conditions]
        # Gone from the API, not only terminating: KWOK ends a pod at once, simcluster's
        # kubelet after its grace period; a terminating pod still counts as expected.
        everything = kube.core.list_namespaced_pod(ns, label_selector="app=web").items
        gone = pods[0].metadata.name not in {p.metadata.name for p in everything}
        pdb = kube.policy.read_namespaced_pod_disruption_budget("web", ns)
        return (pdb, pending) if gone and pending and pdb.status.expected_pods == 2 else None
    pdb, pending = kube.settle(replacement_pending, what="evicted pod gone, replacement Pending", seconds=90)
    observed["after: healthy/desired/expected/allowed"] = (
        pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.expected_pods,
        pdb.status.disruptions_allowed)
    observed["after: replacement"] = [(c.type, c.status, c.reason) for c in pending[0].status.conditions or []]
    observed["after: second evict"] = _evict(kube, ns, pods[1].metadata.name)
    return observed


def _refused(needs: int, has: int) -> dict:
    return {"code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "causes": [("DisruptionBudget", f"The disruption budget web needs {needs} healthy pods "
                                            f"and has {has} currently")]}


def test_eviction_respects_the_disruption_budget_of_ready_pods(tiers):
    seen = {name: evict_with_pdb_ready_pods(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "minAvailable 2: healthy/desired/expected": (2, 2, 2),
        "minAvailable 2: evict": _refused(2, 2),
        "minAvailable 1: first evict": {"code": 201},
        # The apiserver counts the first eviction against the budget before any controller runs.
        "minAvailable 1: second evict at once": {k: v for k, v in _refused(1, 1).items() if k != "causes"},
        "after: healthy/desired/expected/allowed": (1, 1, 2, 0),
        "after: replacement": [("PodScheduled", "False", "Unschedulable")],
        "after: second evict": _refused(1, 1),
    }
    assert seen["simcluster"] == seen["real"]


# --- a budget's expected pods: the owners' scale, not the pods selected ---------------------------------
def _status(kube: Backend, ns: str, name: str, healthy: int) -> tuple:
    def settled():
        pdb = kube.policy.read_namespaced_pod_disruption_budget(name, ns)
        status = pdb.status
        if status and status.observed_generation == pdb.metadata.generation and status.current_healthy == healthy:
            return (status.current_healthy, status.desired_healthy, status.expected_pods,
                    status.disruptions_allowed)
        return None
    return kube.settle(settled, what=f"PDB {name} seeing {healthy} healthy pods")


def pdb_expected_pods(kube: Backend) -> dict:
    """Three ready pods of a ReplicaSet and one orphan of it still Ready, all selected by a
    budget: what each kind of budget expects and allows (upstream's getExpectedPodCount);
    then a budget over DaemonSet pods, whose owner has no scale."""
    ns = kube.namespace_create("pdb-scale")
    rs = _replicaset("web", 3, labels={"app": "web", "tier": "gpu"})
    rs.spec.selector = client.V1LabelSelector(match_labels={"app": "web"})
    kube.apps.create_namespaced_replica_set(ns, rs)
    pods = _wait_ready(kube, ns, "app=web", 3)
    observed = {}
    kube.policy.create_namespaced_pod_disruption_budget(ns, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="gpu"),
        spec=client.V1PodDisruptionBudgetSpec(max_unavailable=0,
                                              selector=client.V1LabelSelector(match_labels={"tier": "gpu"}))))
    observed["maxUnavailable 0"] = _status(kube, ns, "gpu", 3)
    # Orphan one pod: it leaves the ReplicaSet's selector (which replaces it) but keeps the budget's.
    kube.core.patch_namespaced_pod(pods[0].metadata.name, ns, {"metadata": {"labels": {"app": None}}})
    _wait_ready(kube, ns, "app=web", 3)
    observed["maxUnavailable 0, orphan Ready"] = _status(kube, ns, "gpu", 4)
    for field, value in (("maxUnavailable", "50%"), ("minAvailable", "50%"), ("minAvailable", 2)):
        other = "minAvailable" if field == "maxUnavailable" else "maxUnavailable"
        kube.policy.patch_namespaced_pod_disruption_budget("gpu", ns, {"spec": {field: value, other: None}})
        observed[f"{field} {value}, orphan Ready"] = _status(kube, ns, "gpu", 4)
    observed["minAvailable 2: evict the orphan"] = _evict(kube, ns, pods[0].metadata.name)["code"]

    kube.apps.create_namespaced_daemon_set(ns, client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels={"app": "agent"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "agent"}),
                spec=client.V1PodSpec(node_selector={"kubernetes.io/hostname": "gpu-a"}, containers=[
                    client.V1Container(name="agent", image="dev.local/agent:1",
                                       resources=client.V1ResourceRequirements(requests={"cpu": "10m"}))])))))
    _wait_ready(kube, ns, "app=agent", 1)
    kube.policy.create_namespaced_pod_disruption_budget(ns, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1PodDisruptionBudgetSpec(max_unavailable=1,
                                              selector=client.V1LabelSelector(match_labels={"app": "agent"}))))

    def sync_failed():
        pdb = kube.policy.read_namespaced_pod_disruption_budget("agent", ns)
        conditions = {c.type: c for c in (pdb.status.conditions if pdb.status else None) or []}
        found = conditions.get("DisruptionAllowed")
        if found is not None and found.reason == "SyncFailed":
            return (pdb.status.disruptions_allowed, found.status, found.reason, found.message)
        return None
    observed["DaemonSet pods, maxUnavailable 1"] = kube.settle(sync_failed, what="PDB agent failing its sync")
    return observed


def test_a_budgets_expected_pods_come_from_the_owners_scale(tiers):
    # pkg/controller/disruption/disruption.go getExpectedPodCount: maxUnavailable and a
    # percentage minAvailable expect the controllers' scale (3; the orphan has none), an
    # integer minAvailable the pods selected (4).
    seen = {name: pdb_expected_pods(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "maxUnavailable 0": (3, 3, 3, 0),
        "maxUnavailable 0, orphan Ready": (4, 3, 3, 1),
        "maxUnavailable 50%, orphan Ready": (4, 1, 3, 3),
        "minAvailable 50%, orphan Ready": (4, 2, 3, 2),
        "minAvailable 2, orphan Ready": (4, 2, 4, 2),
        "minAvailable 2: evict the orphan": 201,
        "DaemonSet pods, maxUnavailable 1": (0, "False", "SyncFailed",
                                             "daemonsets.apps does not implement the scale subresource"),
    }
    assert seen["simcluster"] == seen["real"]


# --- eviction of a Running pod that is not Ready ------------------------------------------------------
def _mark_unready(kube: Backend, ns: str, name: str) -> None:
    # What a failing readiness probe does: the kubelet writes Ready=False into status.
    kube.core.patch_namespaced_pod_status(name, ns, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ProbeFailed"},
        {"type": "ContainersReady", "status": "False", "reason": "ProbeFailed"}]}})


def _budget(kube: Backend, ns: str, name: str, min_available: int, app: str, policy: str | None = None) -> None:
    kube.policy.create_namespaced_pod_disruption_budget(ns, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodDisruptionBudgetSpec(min_available=min_available, unhealthy_pod_eviction_policy=policy,
                                              selector=client.V1LabelSelector(match_labels={"app": app}))))


def _budget_settled(kube: Backend, ns: str, name: str, healthy: int):
    def settled():
        pdb = kube.policy.read_namespaced_pod_disruption_budget(name, ns)
        status = pdb.status
        if status and status.observed_generation == pdb.metadata.generation and status.current_healthy == healthy:
            return (status.current_healthy, status.desired_healthy, status.disruptions_allowed)
        return None
    return kube.settle(settled, what=f"PDB {name} seeing {healthy} healthy pods")


def evict_unready_pods(kube: Backend) -> dict:
    """A crash-looping pod (Running, not Ready) under a budget that allows no disruption:
    (1) IfHealthyBudget (the default) with the budget otherwise met; (2) IfHealthyBudget
    with the budget not met; (3) the same with AlwaysAllow."""
    ns = kube.namespace_create("unready")
    observed = {}
    kube.apps.create_namespaced_replica_set(ns, _replicaset("met", 3))
    met = _wait_ready(kube, ns, "app=met", 3)
    _budget(kube, ns, "met", 2, "met")
    _mark_unready(kube, ns, met[0].metadata.name)
    observed["met: healthy/desired/allowed"] = _budget_settled(kube, ns, "met", 2)
    observed["met: evict a ready pod"] = _evict(kube, ns, met[1].metadata.name)["code"]
    observed["met: evict the unready pod"] = _evict(kube, ns, met[0].metadata.name)["code"]

    kube.apps.create_namespaced_replica_set(ns, _replicaset("short", 2))
    short = _wait_ready(kube, ns, "app=short", 2)
    _budget(kube, ns, "short", 2, "short")
    _mark_unready(kube, ns, short[0].metadata.name)
    observed["not met: healthy/desired/allowed"] = _budget_settled(kube, ns, "short", 1)
    observed["not met, IfHealthyBudget: evict the unready pod"] = _evict(kube, ns, short[0].metadata.name)["code"]
    kube.policy.patch_namespaced_pod_disruption_budget("short", ns, {"spec": {"unhealthyPodEvictionPolicy":
                                                                              "AlwaysAllow"}})
    kube.settle(lambda: (lambda pdb: pdb.status.observed_generation == pdb.metadata.generation)(
        kube.policy.read_namespaced_pod_disruption_budget("short", ns)), what="PDB short observed")
    observed["not met, AlwaysAllow: evict the unready pod"] = _evict(kube, ns, short[0].metadata.name)["code"]
    observed["not met, AlwaysAllow: evict a ready pod"] = _evict(kube, ns, short[1].metadata.name)["code"]
    return observed


def test_eviction_of_unready_pods_follows_the_unhealthy_pod_eviction_policy(tiers):
    # pkg/registry/core/pod/storage/eviction.go: an unready pod goes when the budget is
    # otherwise met (IfHealthyBudget), and always under AlwaysAllow (GA in 1.31).
    seen = {name: evict_unready_pods(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "met: healthy/desired/allowed": (2, 2, 0),
        "met: evict a ready pod": 429,
        "met: evict the unready pod": 201,
        "not met: healthy/desired/allowed": (1, 2, 0),
        "not met, IfHealthyBudget: evict the unready pod": 429,
        "not met, AlwaysAllow: evict the unready pod": 201,
        "not met, AlwaysAllow: evict a ready pod": 429,
    }
    assert seen["simcluster"] == seen["real"]
