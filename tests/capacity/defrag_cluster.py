"""A simulated GPU cluster for the defrag tests, and helpers that read it as a user would
(through the official `kubernetes` client, over HTTP)."""
from __future__ import annotations

import kubernetes.client
import kubernetes.config

from defrag_builders import make_node

NS = "org-a"
SERVICE = "bt-deployment-qvr7e9w"
REVISION = f"{SERVICE}-00001"


def knative_service(name: str = SERVICE, *, namespace: str = NS, min_scale: int = 3, gpus: int = 1,
                    annotations: dict | None = None) -> dict:
    return {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {
            "metadata": {"annotations": {"autoscaling.knative.dev/min-scale": str(min_scale),
                                         "autoscaling.knative.dev/max-scale": "10", **(annotations or {})}},
            "spec": {"containers": [{"name": "model", "image": "registry.example.com/model:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                   "requests": {"nvidia.com/gpu": str(gpus)}}}]}}},
    }


def scenario(*objects: dict, nodes: int = 3, namespaces=(NS,)) -> list[dict]:
    return ([make_node(f"n{i}") for i in range(1, nodes + 1)]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
            + list(objects))


class Kube:
    """What an operator would look at with kubectl, through the official client."""

    def __init__(self, kubeconfig_path: str):
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig_path, client_configuration=config)
        self.api = kubernetes.client.ApiClient(config)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.apps = kubernetes.client.AppsV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.policy = kubernetes.client.PolicyV1Api(self.api)

    def pods(self, namespace: str = NS, *, node: str | None = None, revision: str | None = None):
        kwargs = {}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        if revision:
            kwargs["label_selector"] = f"serving.knative.dev/revision={revision}"
        return self.core.list_namespaced_pod(namespace, **kwargs).items

    def pod_exists(self, namespace: str, name: str) -> bool:
        return any(p.metadata.name == name for p in self.core.list_namespaced_pod(namespace).items)

    def node_cordoned(self, name: str) -> bool:
        return bool(self.core.read_node(name).spec.unschedulable)

    def actual_scale(self, revision: str = REVISION, namespace: str = NS) -> int:
        pa = self.custom.get_namespaced_custom_object("autoscaling.internal.knative.dev", "v1alpha1", namespace,
                                                      "podautoscalers", revision)
        return int((pa.get("status") or {}).get("actualScale") or 0)

    def events(self, namespace: str, reason: str | None = None):
        return [e for e in self.core.list_namespaced_event(namespace).items if reason in (None, e.reason)]

    def node_with_pods(self, revision: str = REVISION, namespace: str = NS, count: int = 1) -> str:
        by_node: dict[str, int] = {}
        for pod in self.pods(namespace, revision=revision):
            by_node[pod.spec.node_name] = by_node.get(pod.spec.node_name, 0) + 1
        return next(node for node, n in sorted(by_node.items()) if n == count)


def run_until(world, job, states, *, dt: float = 1.0, max_steps: int = 200):
    """Step `job` on `world`'s clock, `dt` seconds apart, until it rests in one of `states`."""
    from capacity.defrag.services import defrag_job_step

    for _ in range(max_steps):
        job = defrag_job_step(job=job, gateway=world.gateway, now=world.now())
        if job.state in states:
            return job
        world.advance(dt)
    raise AssertionError(f"job stuck in {job.state}: {job.log[-5:]} {job.error}")
