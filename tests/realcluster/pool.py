"""A test's own GPU nodes and namespace on a shared backend, and the user's view of them.

Both tiers live for the whole session and other tests leave their workloads on the
scenario's nodes; a feature that cordons, drains or deletes a node must not meet them.
Each test therefore gets nodes of its own, tainted so that nothing else lands there,
and pins its workloads to them (nodeSelector and a toleration), on both backends alike.
On the real tier the nodes carry KWOK's annotation, so KWOK plays their kubelet.
"""
from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from .backends import Backend

POOL_KEY = "capacity.test/pool"
REVISION_LABEL = "serving.knative.dev/revision"
SERVING = ("serving.knative.dev", "v1")
AUTOSCALING = ("autoscaling.internal.knative.dev", "v1alpha1")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


class GpuPool:
    def __init__(self, backend: Backend, prefix: str):
        self.backend = backend
        self.core, self.apps, self.policy = backend.core, backend.apps, backend.policy
        self.custom = client.CustomObjectsApi(backend.api_client)
        self.ns = backend.namespace_create(prefix)
        self.nodes: list[str] = []

    # --- set-up ------------------------------------------------------------------------------
    def node_add(self, suffix: str, *, gpus: int = 8) -> str:
        name = f"{self.ns}-{suffix}"
        allocatable = {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"}
        self.core.create_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok", POOL_KEY: self.ns,
                                    "nvidia.com/gpu.product": GPU_PRODUCT}},
            "spec": {"taints": [{"key": POOL_KEY, "value": self.ns, "effect": "NoSchedule"}]},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        self.nodes.append(name)
        self.backend.settle(lambda: self.node_ready(name), what=f"node {name} Ready")
        return name

    def pinning(self) -> dict:
        """The pod-spec fields that keep a workload on this pool's nodes."""
        return {"nodeSelector": {POOL_KEY: self.ns},
                "tolerations": [{"key": POOL_KEY, "operator": "Equal", "value": self.ns, "effect": "NoSchedule"}]}

    def knative_service(self, name: str, *, min_scale: int, gpus: int = 1, scheduler: str | None = None) -> None:
        # dev.local: a registry Knative does not resolve tags for (config-deployment's
        # registries-skipping-tag-resolving); the real tier has no way out to a registry.
        self.custom.create_namespaced_custom_object(*SERVING, self.ns, "services", {
            "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"template": {
                "metadata": {"annotations": {"autoscaling.knative.dev/min-scale": str(min_scale),
                                             "autoscaling.knative.dev/max-scale": "10"}},
                "spec": {**self.pinning(), **({"schedulerName": scheduler} if scheduler else {}),
                         "containers": [{"name": "model", "image": "dev.local/model:1",
                                         "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                       "requests": {"nvidia.com/gpu": str(gpus)}}}]}}}})

    def deployment(self, name: str, *, replicas: int, scheduler: str | None = None,
                   annotations: dict | None = None) -> None:
        """A GPU Deployment; its pods wait for `bind` when they name a `scheduler` of their own."""
        self.apps.create_namespaced_deployment(
            self.ns, self._workload("Deployment", name, replicas=replicas, scheduler=scheduler, annotations=annotations))

    def replicaset(self, name: str, *, replicas: int) -> None:
        """A GPU ReplicaSet of its own (no Deployment)."""
        self.apps.create_namespaced_replica_set(self.ns, self._workload("ReplicaSet", name, replicas=replicas))

    def daemonset(self, name: str) -> None:
        """A GPU-less DaemonSet on this pool's nodes (a DCGM exporter, say)."""
        workload = self._workload("DaemonSet", name, replicas=0)
        del workload["spec"]["replicas"]
        workload["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}}
        self.apps.create_namespaced_daemon_set(self.ns, workload)

    def _workload(self, kind: str, name: str, *, replicas: int, scheduler: str | None = None,
                  annotations: dict | None = None) -> dict:
        spec = {**self.pinning(), "containers": [{"name": "model", "image": "dev.local/model:1", "resources": {
            "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}
        if scheduler:
            spec["schedulerName"] = scheduler
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}

    def bind(self, pod: str, node: str) -> None:
        """What a scheduler does: the pod's `binding` subresource."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # The client cannot read back a Binding (its model wants fields the answer lacks).
        self.core.create_namespaced_pod_binding(pod, self.ns, body, _preload_content=False)

    def bare_pod(self, name: str, *, node: str, gpus: int) -> None:
        self.core.create_namespaced_pod(self.ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {**self.pinning(), "nodeName": node,
                     "containers": [{"name": "main", "image": "dev.local/hog:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                   "requests": {"nvidia.com/gpu": str(gpus)}}}]}})

    def close(self) -> None:
        _ignore_404(lambda: self.core.delete_namespace(self.ns))
        for node in self.nodes:
            _ignore_404(lambda: self.core.delete_node(node))

    # --- what a user reads -------------------------------------------------------------------
    def node_ready(self, name: str) -> bool:
        node = self.core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def node_cordoned(self, name: str) -> bool:
        return bool(self.core.read_node(name).spec.unschedulable)

    def node_names(self) -> list[str]:
        return [n.metadata.name for n in self.core.list_node().items]

    def pods(self, *, node: str | None = None, revision: str | None = None,
             app: str | None = None) -> list[client.V1Pod]:
        kwargs: dict[str, Any] = {}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        if revision:
            kwargs["label_selector"] = f"{REVISION_LABEL}={revision}"
        if app:
            kwargs["label_selector"] = f"app={app}"
        return [p for p in self.core.list_namespaced_pod(self.ns, **kwargs).items
                if p.metadata.deletion_timestamp is None]

    def pod_exists(self, name: str) -> bool:
        return any(p.metadata.name == name for p in self.pods())

    def actual_scale(self, revision: str) -> int:
        try:
            pa = self.custom.get_namespaced_custom_object(*AUTOSCALING, self.ns, "podautoscalers", revision)
        except ApiException as exc:
            if exc.status == 404:
                return 0
            raise
        return int((pa.get("status") or {}).get("actualScale") or 0)

    def events(self, namespace: str, reason: str, *, involving: str | None = None) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(namespace).items
                if e.reason == reason and involving in (None, e.involved_object.name)]

    def model_ready(self, revision: str, replicas: int) -> bool:
        """`replicas` owned pods Running and Ready, and the PodAutoscaler counting them."""
        owned = [p for p in self.pods(revision=revision) if p.metadata.owner_references and ready(p)]
        return len(owned) == replicas and self.actual_scale(revision) == replicas

    def node_with_pods(self, revision: str, count: int) -> str | None:
        by_node: dict[str, int] = {}
        for pod in self.pods(revision=revision):
            by_node[pod.spec.node_name] = by_node.get(pod.spec.node_name, 0) + 1
        return next((node for node, n in sorted(by_node.items()) if n == count), None)


def ready(pod: client.V1Pod) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _ignore_404(call) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise
