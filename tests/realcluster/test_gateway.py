"""The product's Kubernetes gateway against the real apiserver: what the features rely on
(field selectors, scale, JSON patch guards, eviction refusals as the product's errors)."""
from __future__ import annotations

import pytest

from clusters import kube
from clusters.errors import Invalid, TooManyRequests


def test_the_gateway_reads_scales_patches_and_is_refused_eviction_by_a_budget(real_cluster):
    cluster, backend = real_cluster
    gateway = kube.gateway_for(cluster)
    ns = backend.namespace_create("gateway")
    gateway.create(kube.REPLICASETS, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "model", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "model"}},
                 "template": {"metadata": {"labels": {"app": "model"}},
                              "spec": {"containers": [{"name": "model", "image": "dev.local/model:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    running = backend.settle(lambda: (lambda pods: pods if len(pods) == 2 else None)(
        gateway.list(kube.PODS, namespace=ns, field_selector="status.phase=Running")), what="2 Running pods")
    assert {pod["spec"]["nodeName"] for pod in running} <= {"gpu-a", "gpu-b"}
    on_node = gateway.list(kube.PODS, namespace=ns, field_selector=f"spec.nodeName={running[0]['spec']['nodeName']}")
    assert running[0]["metadata"]["name"] in {pod["metadata"]["name"] for pod in on_node}

    assert gateway.get_scale(kube.REPLICASETS, "model", namespace=ns)["spec"]["replicas"] == 2

    owner_uid = running[0]["metadata"]["ownerReferences"][0]["uid"]
    with pytest.raises(Invalid):
        gateway.patch(kube.PODS, running[0]["metadata"]["name"], [
            {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "someone-else"},
            {"op": "remove", "path": "/metadata/ownerReferences"}], namespace=ns, patch_type="json")
    assert gateway.get(kube.PODS, running[0]["metadata"]["name"], namespace=ns)["metadata"][
        "ownerReferences"][0]["uid"] == owner_uid

    gateway.create(kube.resource_for("policy/v1", "PodDisruptionBudget"), {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "model", "namespace": ns},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "model"}}}})
    backend.settle(lambda: (gateway.get(kube.resource_for("policy/v1", "PodDisruptionBudget"), "model",
                                        namespace=ns).get("status") or {}).get("currentHealthy") == 2,
                   what="the budget counting 2 healthy pods")
    with pytest.raises(TooManyRequests):
        gateway.evict(running[0]["metadata"]["name"], namespace=ns)
    assert gateway.get(kube.PODS, running[0]["metadata"]["name"], namespace=ns)["metadata"].get(
        "deletionTimestamp") is None
