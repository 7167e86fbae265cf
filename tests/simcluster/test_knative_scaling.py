"""Knative scaling as the product's dormancy switch meets it, through the official client:
what a Revision or a PodAutoscaler patch does on Knative 1.15 (as measured on the real
controllers, /work/shared/REALTIER.md), and the KPA's initial-scale, scale-down-delay and
scale-to-zero-pod-retention-period with config-autoscaler's defaults."""
from __future__ import annotations

import pytest

from conftest import NODES_AND_NAMESPACE

NS = "team-a"
KN = ("serving.knative.dev", "v1")
PA = ("autoscaling.internal.knative.dev", "v1alpha1")
MIN = "autoscaling.knative.dev/min-scale"


def scenario(knative_version: str) -> str:
    return f"""apiVersion: simcluster.io/v1alpha1
kind: Simulation
metadata: {{name: knative}}
spec: {{knative_version: '{knative_version}'}}
---
""" + NODES_AND_NAMESPACE


def create_ksvc(kube, name: str, **annotations: str) -> None:
    kube.custom.create_namespaced_custom_object(*KN, NS, "services", {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"template": {"metadata": {"annotations": annotations},
                              "spec": {"containers": [{"image": "registry.example.com/pynode:1"}]}}}})


def get(kube, group_version: tuple[str, str], plural: str, name: str) -> dict:
    return kube.custom.get_namespaced_custom_object(*group_version, NS, plural, name)


def patch_annotations(kube, group_version, plural: str, name: str, **annotations: str) -> None:
    kube.custom.patch_namespaced_custom_object(*group_version, NS, plural, name,
                                               {"metadata": {"annotations": annotations}})


def replicas(kube, revision: str) -> int:
    return kube.apps.read_namespaced_deployment(f"{revision}-deployment", NS).spec.replicas


def pods(kube, revision: str) -> list[str]:
    return sorted(p.metadata.name for p in kube.core.list_namespaced_pod(
        NS, label_selector=f"serving.knative.dev/revision={revision}").items if not p.metadata.deletion_timestamp)


def replicasets(kube, revision: str) -> list[str]:
    return [rs.metadata.name for rs in kube.apps.list_namespaced_replica_set(
        NS, label_selector=f"serving.knative.dev/revision={revision}").items]


def set_autoscaler_config(kube, **data: str) -> None:
    kube.core.patch_namespaced_config_map("config-autoscaler", "knative-serving", {"data": data})


@pytest.fixture
def knative_115(kube_factory):
    kube = kube_factory(scenario("1.15"))
    create_ksvc(kube, "pynode", **{MIN: "1"})
    kube.control.advance(60)
    assert len(pods(kube, "pynode-00001")) == 1
    return kube


def test_on_1_15_a_revision_annotation_patch_rolls_the_pods_and_the_pa_does_not_follow(knative_115):
    kube = knative_115
    [before] = pods(kube, "pynode-00001")
    patch_annotations(kube, KN, "revisions", "pynode-00001", **{MIN: "0"})
    kube.control.advance(1)
    template = kube.apps.read_namespaced_deployment("pynode-00001-deployment", NS).spec.template
    assert template.metadata.annotations[MIN] == "0"
    assert len(replicasets(kube, "pynode-00001")) == 2                 # a rollout: a new ReplicaSet
    assert get(kube, PA, "podautoscalers", "pynode-00001")["metadata"]["annotations"][MIN] == "1"
    kube.control.advance(300)
    [after] = pods(kube, "pynode-00001")
    assert after != before                                              # the pod was replaced
    pa = get(kube, PA, "podautoscalers", "pynode-00001")
    assert pa["metadata"]["annotations"][MIN] == "1" and pa["status"]["desiredScale"] == 1


def test_on_1_15_a_direct_pa_patch_stays_and_scales_without_replacing_a_pod(knative_115):
    kube = knative_115
    [first] = pods(kube, "pynode-00001")
    patch_annotations(kube, PA, "podautoscalers", "pynode-00001", **{MIN: "2"})
    kube.control.advance(60)
    assert get(kube, PA, "podautoscalers", "pynode-00001")["metadata"]["annotations"][MIN] == "2"
    assert replicas(kube, "pynode-00001") == 2
    assert first in pods(kube, "pynode-00001") and len(replicasets(kube, "pynode-00001")) == 1


def test_on_1_21_a_direct_pa_patch_is_reverted(kube_factory):
    kube = kube_factory(scenario("1.21"))
    create_ksvc(kube, "pynode", **{MIN: "1"})
    kube.control.advance(60)
    patch_annotations(kube, PA, "podautoscalers", "pynode-00001", **{MIN: "2"})
    kube.control.advance(0)
    assert get(kube, PA, "podautoscalers", "pynode-00001")["metadata"]["annotations"][MIN] == "1"


def test_scale_down_delay_holds_the_last_pod_after_window_and_grace(kube_factory):
    kube = kube_factory(scenario("1.15"))
    # No traffic ever: desired 0 after the 60 s window + 300 s delay, the pod goes 30 s
    # (the grace period) after that.
    create_ksvc(kube, "pynode", **{MIN: "0", "autoscaling.knative.dev/scale-down-delay": "5m"})
    kube.control.advance(385)
    assert replicas(kube, "pynode-00001") == 1
    kube.control.advance(10)
    assert replicas(kube, "pynode-00001") == 0


def test_config_autoscaler_pod_retention_keeps_the_last_pod_and_an_annotation_overrides_it(kube_factory):
    kube = kube_factory(scenario("1.15"))
    set_autoscaler_config(kube, **{"scale-to-zero-pod-retention-period": "10m"})
    create_ksvc(kube, "kept", **{MIN: "0"})
    create_ksvc(kube, "brief", **{MIN: "0", "autoscaling.knative.dev/scale-to-zero-pod-retention-period": "0s"})
    kube.control.advance(95)                      # 60 s window + 30 s grace, and a little
    assert (replicas(kube, "kept-00001"), replicas(kube, "brief-00001")) == (1, 0)
    kube.control.advance(570)                     # 60 s + 600 s retention
    assert replicas(kube, "kept-00001") == 0


def test_a_new_revision_starts_one_pod_unless_zero_initial_scale_is_allowed(kube_factory):
    kube = kube_factory(scenario("1.15"))
    # initial-scale "0" without allow-zero-initial-scale: the cluster's initial scale (1) applies.
    create_ksvc(kube, "refused", **{MIN: "0", "autoscaling.knative.dev/initial-scale": "0"})
    kube.control.advance(10)
    assert replicas(kube, "refused-00001") == 1 and len(pods(kube, "refused-00001")) == 1

    set_autoscaler_config(kube, **{"allow-zero-initial-scale": "true"})
    create_ksvc(kube, "asleep", **{MIN: "0", "autoscaling.knative.dev/initial-scale": "0"})
    kube.control.advance(10)
    assert replicas(kube, "asleep-00001") == 0 and pods(kube, "asleep-00001") == []
    pa = get(kube, PA, "podautoscalers", "asleep-00001")
    assert pa["status"]["desiredScale"] == 0
    assert {c["type"]: c["status"] for c in pa["status"]["conditions"]}["Active"] == "False"

    # The same switch made through the template of a running service: its new revision
    # starts no pod, and the old one's pods go once it is unrouted.
    create_ksvc(kube, "pynode", **{MIN: "1"})
    kube.control.advance(60)
    kube.custom.patch_namespaced_custom_object(*KN, NS, "services", "pynode", {"spec": {"template": {"metadata": {
        "annotations": {MIN: "0", "autoscaling.knative.dev/initial-scale": "0"}}}}})
    kube.control.advance(10)
    assert replicas(kube, "pynode-00002") == 0 and pods(kube, "pynode-00002") == []
    ksvc = get(kube, KN, "services", "pynode")
    assert ksvc["status"]["traffic"][0]["revisionName"] == "pynode-00002"
    kube.control.advance(120)
    assert replicas(kube, "pynode-00001") == 0 and pods(kube, "pynode-00001") == []
