"""The eviction subresource against PodDisruptionBudgets, as kube-apiserver 1.32 decides
(pkg/registry/core/pod/storage/eviction.go): a Running pod that is not Ready may go when
the guarded app is whole (IfHealthyBudget, the default) or always (AlwaysAllow), without
spending a disruption; a Ready pod needs an allowance; a budget not yet computed answers
429 until the disruption controller has seen it. Driven through the official client."""
from __future__ import annotations

import pytest
from kubernetes.client import ApiException

from simcluster_helpers import status_of

NS = "team-a"


def deployment(name: str, replicas: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}}}}


def budget(name: str, *, min_available: int, policy: str | None = None) -> dict:
    spec: dict = {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def pods(kube, app: str) -> list:
    return sorted((p for p in kube.core.list_namespaced_pod(NS, label_selector=f"app={app}").items
                   if not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)


def crash_loop(kube, pod_name: str) -> None:
    """What a kubelet reports for a container that keeps failing its readiness: still
    Running, not Ready."""
    kube.core.patch_namespaced_pod_status(pod_name, NS, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"}]}})


def evict(kube, name: str, *, dry_run: bool = False) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
    if dry_run:
        body["deleteOptions"] = {"dryRun": ["All"]}
    kube.core.create_namespaced_pod_eviction(name, NS, body)


def refused(kube, name: str) -> dict:
    with pytest.raises(ApiException) as caught:
        evict(kube, name)
    return status_of(caught.value)


def world(kube, app: str, *, replicas: int, min_available: int, unready: int, policy: str | None = None):
    kube.apps.create_namespaced_deployment(NS, deployment(app, replicas))
    kube.control.advance(30)
    running = pods(kube, app)
    assert len(running) == replicas and all(p.status.phase == "Running" for p in running)
    for pod in running[:unready]:
        crash_loop(kube, pod.metadata.name)
    kube.policy.create_namespaced_pod_disruption_budget(NS, budget(app, min_available=min_available, policy=policy))
    kube.control.advance(0)
    return [p.metadata.name for p in running[:unready]], [p.metadata.name for p in running[unready:]]


def test_an_unready_pod_goes_when_the_app_is_whole_and_spends_no_disruption(kube):
    [sick], ready = world(kube, "web", replicas=3, min_available=2, unready=1)
    pdb = kube.policy.read_namespaced_pod_disruption_budget("web", NS)
    assert (pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.disruptions_allowed) == (2, 2, 0)

    # A Ready pod would break the budget: 429, and the pod stays.
    status = refused(kube, ready[0])
    assert status["code"] == 429
    assert status["details"]["causes"][0]["message"] == "The disruption budget web needs 2 healthy pods and has 2 currently"
    assert not kube.core.read_namespaced_pod(ready[0], NS).metadata.deletion_timestamp

    # The crash-looping pod serves nothing: currentHealthy 2 >= desiredHealthy 2 > 0, it may go.
    evict(kube, sick)
    gone = kube.core.read_namespaced_pod(sick, NS)
    assert gone.metadata.deletion_timestamp
    marked = {c.type: c for c in gone.status.conditions}["DisruptionTarget"]
    assert (marked.status, marked.reason) == ("True", "EvictionByEvictionAPI")
    pdb = kube.policy.read_namespaced_pod_disruption_budget("web", NS)
    assert pdb.status.disruptions_allowed == 0 and not pdb.status.disrupted_pods


def test_if_healthy_budget_keeps_unready_pods_while_the_app_is_short_and_always_allow_lets_them_go(kube):
    sick, [well] = world(kube, "model", replicas=3, min_available=2, unready=2)
    pdb = kube.policy.read_namespaced_pod_disruption_budget("model", NS)
    assert (pdb.status.current_healthy, pdb.status.desired_healthy) == (1, 2)
    status = refused(kube, sick[0])
    assert status["code"] == 429
    assert status["details"]["causes"] == [{"reason": "DisruptionBudget",
                                            "message": "The disruption budget model needs 2 healthy pods and has 1 currently"}]

    kube.policy.patch_namespaced_pod_disruption_budget("model", NS, {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})
    # The policy is read from the spec as it stands: no controller pass is needed.
    evict(kube, sick[0], dry_run=True)
    assert not kube.core.read_namespaced_pod(sick[0], NS).metadata.deletion_timestamp
    for name in sick:
        evict(kube, name)
        assert kube.core.read_namespaced_pod(name, NS).metadata.deletion_timestamp
    # The one Ready pod is still guarded by the budget (the spec change is not yet observed).
    status = refused(kube, well)
    assert status["code"] == 429 and "is still being processed by the server" in status["details"]["causes"][0]["message"]
    kube.control.advance(0)
    assert refused(kube, well)["details"]["causes"][0]["message"].startswith("The disruption budget model needs 2")


def test_with_no_healthy_pod_wanted_an_unready_pod_still_asks_the_budget(kube):
    # desiredHealthy 0 is not "> 0": the unready pod falls through to the allowance check,
    # which minAvailable 0 grants (and spends).
    [sick], _ = world(kube, "tiny", replicas=2, min_available=0, unready=1)
    evict(kube, sick)
    pdb = kube.policy.read_namespaced_pod_disruption_budget("tiny", NS)
    assert pdb.status.disruptions_allowed == 0 and sick in pdb.status.disrupted_pods


def test_a_budget_not_yet_computed_answers_429_until_the_controller_has_seen_it(kube):
    kube.apps.create_namespaced_deployment(NS, deployment("web", 2))
    kube.control.advance(30)
    victim = pods(kube, "web")[0].metadata.name
    kube.policy.create_namespaced_pod_disruption_budget(NS, budget("web", min_available=1))
    status = refused(kube, victim)
    assert status["code"] == 429 and status["details"]["retryAfterSeconds"] == 10
    assert status["details"]["causes"][0]["message"] == "The disruption budget web is still being processed by the server."
    kube.control.advance(0)
    evict(kube, victim)
    assert kube.core.read_namespaced_pod(victim, NS).metadata.deletion_timestamp


def test_a_pending_pod_is_evicted_without_asking_any_budget(kube):
    kube.apps.create_namespaced_deployment(NS, deployment("web", 1))
    kube.policy.create_namespaced_pod_disruption_budget(NS, budget("web", min_available=1))
    kube.control.advance(0)
    [pending] = pods(kube, "web")
    assert pending.status.phase == "Pending"
    evict(kube, pending.metadata.name)
    assert kube.core.read_namespaced_pod(pending.metadata.name, NS).metadata.deletion_timestamp


def test_an_unknown_unhealthy_pod_eviction_policy_is_422_naming_the_field(kube):
    with pytest.raises(ApiException) as caught:
        kube.policy.create_namespaced_pod_disruption_budget(NS, budget("web", min_available=1, policy="Sometimes"))
    status = status_of(caught.value)
    assert status["code"] == 422
    assert status["details"]["causes"][0]["field"] == "spec.unhealthyPodEvictionPolicy"
    assert 'supported values: "AlwaysAllow", "IfHealthyBudget"' in status["message"]
    assert kube.policy.list_namespaced_pod_disruption_budget(NS).items == []


def test_kubectl_drain_evicts_a_crash_looping_pod_under_always_allow(kube):
    sick, well = world(kube, "gpu", replicas=1, min_available=1, unready=1, policy="AlwaysAllow")
    node = kube.core.read_namespaced_pod(sick[0], NS).spec.node_name
    result = kube.kubectl("drain", node, "--ignore-daemonsets", "--grace-period=0", "--timeout=20s")
    assert f"pod/{sick[0]} evicted" in result.stdout
    assert kube.core.read_node(node).spec.unschedulable
