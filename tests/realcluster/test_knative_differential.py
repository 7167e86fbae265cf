"""Differential checks of Knative Serving: the real controllers (1.15, v0.42.2) against
simcluster told to model 1.15 — what a Revision's min-scale patch and a direct
PodAutoscaler patch do to a running model."""
from __future__ import annotations

from kubernetes import client

from .backends import Backend
from .test_differential import _ready

MIN_SCALE = "autoscaling.knative.dev/min-scale"
SERVING = ("serving.knative.dev", "v1")
AUTOSCALING = ("autoscaling.internal.knative.dev", "v1alpha1")


def _custom(kube: Backend) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client)


def _ready_condition(obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _revision_pods(kube: Backend, ns: str, revision: str) -> list[client.V1Pod]:
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"serving.knative.dev/revision={revision}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _rolled_out(kube: Backend, ns: str, name: str, replicas: int):
    deployment = kube.apps.read_namespaced_deployment(name, ns)
    status = deployment.status
    done = (deployment.metadata.generation == status.observed_generation and deployment.spec.replicas == replicas
            and status.updated_replicas == replicas and status.ready_replicas == replicas
            and (status.replicas or 0) == replicas)
    return deployment if done else None


def min_scale_patches(kube: Backend) -> dict:
    custom = _custom(kube)
    ns = kube.namespace_create("knative")
    custom.create_namespaced_custom_object(*SERVING, ns, "services", {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "model"},
        "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1"}},
                              "spec": {"containers": [{"image": "dev.local/model:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    kube.settle(lambda: _ready_condition(custom.get_namespaced_custom_object(*SERVING, ns, "services", "model")),
                what="Knative Service model Ready", seconds=60)
    revision = custom.get_namespaced_custom_object(*SERVING, ns, "services", "model")["status"][
        "latestReadyRevisionName"]
    deployment = f"{revision}-deployment"
    first = kube.settle(lambda: (lambda pods: pods if len(pods) == 1 and _ready(pods[0]) else None)(
        _revision_pods(kube, ns, revision)), what="one ready model pod")[0].metadata.name
    observed = {}

    # The product's dormancy switch on Knative >= 1.21: the Revision's annotation.
    custom.patch_namespaced_custom_object(*SERVING, ns, "revisions", revision,
                                          {"metadata": {"annotations": {MIN_SCALE: "2"}}})

    def template_follows():
        found = kube.apps.read_namespaced_deployment(deployment, ns)
        annotations = found.spec.template.metadata.annotations or {}
        return annotations.get(MIN_SCALE) == "2" and _rolled_out(kube, ns, deployment, found.spec.replicas)
    kube.settle(template_follows, what="the Deployment's template carrying min-scale 2, rolled out", seconds=60)
    kube.wait(5)
    pa = custom.get_namespaced_custom_object(*AUTOSCALING, ns, "podautoscalers", revision)
    pods = _revision_pods(kube, ns, revision)
    replica_sets = kube.apps.list_namespaced_replica_set(
        ns, label_selector=f"serving.knative.dev/revision={revision}").items
    observed["revision patch: running pod replaced"] = first not in {p.metadata.name for p in pods}
    observed["revision patch: ReplicaSets"] = len(replica_sets)
    observed["revision patch: PA min-scale"] = (pa["metadata"].get("annotations") or {}).get(MIN_SCALE)
    observed["revision patch: Deployment replicas"] = kube.apps.read_namespaced_deployment(
        deployment, ns).spec.replicas

    # The lever on 1.15: the PodAutoscaler's own annotation.
    custom.patch_namespaced_custom_object(*AUTOSCALING, ns, "podautoscalers", revision,
                                          {"metadata": {"annotations": {MIN_SCALE: "2"}}})
    kube.settle(lambda: _rolled_out(kube, ns, deployment, 2), what="the Deployment at 2 ready replicas", seconds=60)
    kube.wait(5)
    pa = custom.get_namespaced_custom_object(*AUTOSCALING, ns, "podautoscalers", revision)
    observed["PA patch: PA min-scale after 5 s"] = (pa["metadata"].get("annotations") or {}).get(MIN_SCALE)
    observed["PA patch: Deployment replicas"] = kube.apps.read_namespaced_deployment(deployment, ns).spec.replicas
    observed["PA patch: ReplicaSets"] = len(kube.apps.list_namespaced_replica_set(
        ns, label_selector=f"serving.knative.dev/revision={revision}").items)
    return observed


def test_min_scale_on_the_revision_rolls_the_model_and_on_the_pa_scales_it(sim_tier, real_tier):
    seen = {name: min_scale_patches(kube) for name, kube in (("simcluster", sim_tier), ("real", real_tier))}
    assert seen["real"] == {
        # Every Revision annotation is copied into the pod template: a rolling restart...
        "revision patch: running pod replaced": True,
        "revision patch: ReplicaSets": 2,
        # ...and no new bound: the PodAutoscaler keeps the annotation it was created with.
        "revision patch: PA min-scale": "1",
        "revision patch: Deployment replicas": 1,
        # The PodAutoscaler's annotation is not reverted, and the autoscaler follows it.
        "PA patch: PA min-scale after 5 s": "2",
        "PA patch: Deployment replicas": 2,
        "PA patch: ReplicaSets": 2,
    }
    assert seen["simcluster"] == seen["real"]
