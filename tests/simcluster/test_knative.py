"""Knative Serving in the simulated cluster: revisions, Deployment/PA naming, the KPA."""
from __future__ import annotations

import pytest

from simcluster.controllers import default_controllers
from simcluster.resources import (CONFIGURATIONS, DEPLOYMENTS, KSERVICES, NAMESPACES, NODES,
                                  PODAUTOSCALERS, PODS, REVISIONS)
from simcluster.sim import SimSettings, Simulation
from simcluster.store import copy

NS = "org-acme"


def make_sim(**settings) -> Simulation:
    sim = Simulation(settings=SimSettings(**settings), controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    return sim


def ksvc(name="pynode", annotations=None, labels=None) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": {"template": {"metadata": {"annotations": annotations or {}, "labels": dict(labels or {})},
                                  "spec": {"containers": [{"image": "registry.example.com/pynode:1"}]}}}}


def edit_template(sim, name, **annotations) -> None:
    new = copy(sim.store.get(KSERVICES, NS, name))
    new["spec"]["template"]["metadata"].setdefault("annotations", {}).update(annotations)
    sim.store.put(KSERVICES, new)


def revision_pods_ready(sim, revision: str, count: int, *, owned=True) -> list[dict]:
    """Ready pods carrying the revision's labels, as the Deployment's pods would be."""
    deployment = sim.store.get(DEPLOYMENTS, NS, f"{revision}-deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pods = []
    for i in range(count):
        meta = {"name": f"{revision}-deployment-pod{i}-{sim.store.resource_version}", "namespace": NS,
                "labels": dict(labels)}
        if owned:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                        "uid": "rs-uid", "controller": True}]
        pods.append(sim.store.create(PODS, {"metadata": meta, "spec": {"nodeName": "n1", "containers": []},
                                            "status": {"phase": "Running",
                                                       "conditions": [{"type": "Ready", "status": "True"}]}}))
    return pods


def pa(sim, name) -> dict:
    return sim.store.get(PODAUTOSCALERS, NS, name)


def replicas(sim, revision) -> int:
    return sim.store.get(DEPLOYMENTS, NS, f"{revision}-deployment")["spec"]["replicas"]


def test_service_makes_configuration_revision_deployment_and_pa_with_knative_names_and_labels():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc(labels={"capacity.io/component": "pynode"}))
    sim.run_to_rest()

    config = sim.store.get(CONFIGURATIONS, NS, "pynode")
    assert config["metadata"]["ownerReferences"][0]["kind"] == "Service"
    assert config["metadata"]["labels"]["capacity.io/component"] == "pynode"
    rev = sim.store.get(REVISIONS, NS, "pynode-00001")
    assert rev["metadata"]["labels"]["serving.knative.dev/configuration"] == "pynode"
    assert rev["metadata"]["labels"]["serving.knative.dev/service"] == "pynode"
    assert rev["metadata"]["labels"]["serving.knative.dev/configurationGeneration"] == "1"

    deployment = sim.store.get(DEPLOYMENTS, NS, "pynode-00001-deployment")
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == rev["metadata"]["uid"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["serving.knative.dev/revision"] == "pynode-00001"
    assert pod_labels["serving.knative.dev/revisionUID"] == rev["metadata"]["uid"]
    assert pod_labels["serving.knative.dev/configuration"] == "pynode"
    assert pod_labels["serving.knative.dev/service"] == "pynode"
    assert pod_labels["app"] == "pynode-00001"
    assert pod_labels["capacity.io/component"] == "pynode"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/pynode:1"

    autoscaler = pa(sim, "pynode-00001")
    assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                   "name": "pynode-00001-deployment"}
    assert autoscaler["spec"]["protocolType"] == "http1"
    assert autoscaler["spec"]["reachability"] in ("Reachable", "Unknown")


def test_a_template_annotation_change_makes_a_new_revision_and_traffic_moves_when_it_is_ready():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc())
    sim.run_to_rest()
    revision_pods_ready(sim, "pynode-00001", 1)
    sim.run_to_rest()
    service = sim.store.get(KSERVICES, NS, "pynode")
    assert service["status"]["latestReadyRevisionName"] == "pynode-00001"
    assert service["status"]["url"] == f"http://pynode.{NS}.example.com"

    edit_template(sim, "pynode", **{"autoscaling.knative.dev/min-scale": "2"})
    sim.run_to_rest()
    assert sorted(r["metadata"]["name"] for r in sim.store.all(REVISIONS, NS)) == ["pynode-00001", "pynode-00002"]
    service = sim.store.get(KSERVICES, NS, "pynode")
    assert service["status"]["latestCreatedRevisionName"] == "pynode-00002"
    assert service["status"]["traffic"][0]["revisionName"] == "pynode-00001"   # not ready yet

    revision_pods_ready(sim, "pynode-00002", 2)
    sim.run_to_rest()
    service = sim.store.get(KSERVICES, NS, "pynode")
    assert service["status"]["traffic"] == [{"revisionName": "pynode-00002", "latestRevision": True, "percent": 100}]
    assert pa(sim, "pynode-00001")["spec"]["reachability"] == "Unreachable"


def test_a_named_template_gives_the_revision_that_name():
    sim = make_sim()
    body = ksvc()
    body["spec"]["template"]["metadata"]["name"] = "pynode-blue"
    sim.store.create(KSERVICES, body)
    sim.run_to_rest()
    assert [r["metadata"]["name"] for r in sim.store.all(REVISIONS, NS)] == ["pynode-blue"]
    assert sim.store.get(DEPLOYMENTS, NS, "pynode-blue-deployment") is not None


def test_kpa_scales_with_load_and_to_zero_only_after_window_and_grace():
    sim = make_sim(stable_window_seconds=60, scale_to_zero_grace_seconds=30)
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/target": "10"}))
    sim.run_to_rest()
    assert replicas(sim, "pynode-00001") == 1            # initial scale
    (pod,) = revision_pods_ready(sim, "pynode-00001", 1)

    sim.load[(NS, "pynode-00001")] = 35
    sim.advance(0)
    assert pa(sim, "pynode-00001")["status"]["desiredScale"] == 4
    assert replicas(sim, "pynode-00001") == 4

    sim.load[(NS, "pynode-00001")] = 0
    sim.advance(59)
    assert replicas(sim, "pynode-00001") == 4            # the stable window remembers the peak
    sim.advance(2)
    assert replicas(sim, "pynode-00001") == 1            # no traffic, but inside the grace
    sim.advance(30)
    assert replicas(sim, "pynode-00001") == 0
    sim.store.remove(PODS, NS, pod["metadata"]["name"])   # what the ReplicaSet then does
    sim.run_to_rest()
    autoscaler = pa(sim, "pynode-00001")
    assert autoscaler["status"]["desiredScale"] == 0
    active = next(c for c in autoscaler["status"]["conditions"] if c["type"] == "Active")
    assert (active["status"], active["reason"]) == ("False", "NoTraffic")


@pytest.mark.parametrize("key", ["autoscaling.knative.dev/min-scale", "autoscaling.knative.dev/minScale"])
def test_min_scale_keeps_pods_without_traffic(key):
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc(annotations={key: "2"}))
    sim.run_to_rest()
    sim.advance(3600)
    assert replicas(sim, "pynode-00001") == 2


def test_max_scale_caps_the_load():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/max-scale": "3",
                                                  "autoscaling.knative.dev/target": "1"}))
    sim.run_to_rest()
    sim.load[(NS, "pynode-00001")] = 50
    sim.advance(0)
    assert replicas(sim, "pynode-00001") == 3


def test_actual_scale_counts_an_orphaned_pod_and_desired_scale_does_not_drop():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/min-scale": "3"}))
    sim.run_to_rest()
    pods = revision_pods_ready(sim, "pynode-00001", 3)
    sim.run_to_rest()
    assert pa(sim, "pynode-00001")["status"]["actualScale"] == 3

    # Orphan one pod as the defrag seed does (ownerReference and pod-template-hash gone);
    # its ReplicaSet makes a replacement, so four labelled Ready pods exist for a while.
    orphan = copy(pods[0])
    orphan["metadata"].pop("ownerReferences")
    orphan["metadata"]["labels"].pop("pod-template-hash", None)
    sim.store.put(PODS, orphan)
    revision_pods_ready(sim, "pynode-00001", 1)
    sim.advance(120)
    status = pa(sim, "pynode-00001")["status"]
    assert status["actualScale"] == 4
    assert status["desiredScale"] == 3
    assert replicas(sim, "pynode-00001") == 3


def test_terminating_and_unready_pods_are_not_counted():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/min-scale": "2"}))
    sim.run_to_rest()
    first, second = revision_pods_ready(sim, "pynode-00001", 2)
    terminating = copy(first)
    terminating["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    sim.store.put(PODS, terminating)
    unready = copy(second)
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    sim.store.put(PODS, unready)
    sim.run_to_rest()
    assert pa(sim, "pynode-00001")["status"]["actualScale"] == 0


def _patch_pa_min_scale(sim, value: str) -> None:
    new = copy(pa(sim, "pynode-00001"))
    new["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] = value
    sim.store.put(PODAUTOSCALERS, new)


def test_knative_1_21_reverts_a_direct_pa_patch():
    sim = make_sim(knative_version="1.21")
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/min-scale": "1"}))
    sim.run_to_rest()
    _patch_pa_min_scale(sim, "0")
    sim.advance(0)
    assert pa(sim, "pynode-00001")["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "1"


def test_knative_1_20_keeps_a_direct_pa_patch_and_the_kpa_follows_it():
    sim = make_sim(knative_version="1.20")
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/min-scale": "1"}))
    sim.run_to_rest()
    revision_pods_ready(sim, "pynode-00001", 1)
    _patch_pa_min_scale(sim, "0")
    sim.advance(200)
    assert pa(sim, "pynode-00001")["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"
    assert replicas(sim, "pynode-00001") == 0


def test_the_knative_serving_namespace_label_wins_over_the_settings():
    sim = Simulation(settings=SimSettings(knative_version="1.21"), controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    sim.store.create(NAMESPACES, {"metadata": {"name": "knative-serving", "labels": {
        "app.kubernetes.io/name": "knative-serving", "app.kubernetes.io/version": "1.20.3"}}})
    sim.store.create(KSERVICES, ksvc(annotations={"autoscaling.knative.dev/min-scale": "1"}))
    sim.run_to_rest()
    _patch_pa_min_scale(sim, "0")
    sim.advance(0)
    assert pa(sim, "pynode-00001")["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"


def test_install_namespaces_carry_the_versions():
    sim = make_sim(knative_version="1.21", kserve_version="0.15")
    sim.run_to_rest()
    knative = sim.store.get(NAMESPACES, None, "knative-serving")["metadata"]["labels"]
    kserve = sim.store.get(NAMESPACES, None, "kserve")["metadata"]["labels"]
    assert knative["app.kubernetes.io/version"] == "1.21.0"
    assert kserve["app.kubernetes.io/version"] == "v0.15.0"


def test_unschedulable_pods_make_the_revision_not_ready_with_the_reason():
    sim = make_sim()
    sim.store.create(KSERVICES, ksvc())
    sim.run_to_rest()
    labels = sim.store.get(DEPLOYMENTS, NS, "pynode-00001-deployment")["spec"]["template"]["metadata"]["labels"]
    # The scheduler writes the pod's PodScheduled condition itself: give it a node where a
    # GPU pod does not fit, so that it says so.
    sim.store.create(NODES, {"metadata": {"name": "cpu-1"}, "status": {
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}]}})
    sim.store.create(PODS, {"metadata": {"name": "pending", "namespace": NS, "labels": labels},
                            "spec": {"containers": [{"name": "main", "image": "vllm", "resources": {
                                "limits": {"nvidia.com/gpu": "1"}}}]},
                            "status": {"phase": "Pending", "conditions": [{
                                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."}]}})
    sim.run_to_rest()
    rev = sim.store.get(REVISIONS, NS, "pynode-00001")
    ready = next(c for c in rev["status"]["conditions"] if c["type"] == "Ready")
    resources = next(c for c in rev["status"]["conditions"] if c["type"] == "ResourcesAvailable")
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert resources["status"] == "False" and "Insufficient nvidia.com/gpu" in resources["message"]
    assert "latestReadyRevisionName" not in sim.store.get(KSERVICES, NS, "pynode")["status"]


def test_a_deployment_real_knative_rendered_rolls_nothing_but_a_revision_change_still_does():
    """A dump of a real cluster carries Deployments real Knative made: a queue-proxy container
    beside the user's, whose readinessProbe Knative moved into it. Loaded here, they must keep
    their ReplicaSet; a change of the Revision's annotations must still roll the pods."""
    sim = make_sim()
    svc = ksvc()
    svc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 0},
                                                                          "successThreshold": 1}
    sim.store.create(KSERVICES, svc)
    sim.advance(0)
    rendered = copy(sim.store.get(DEPLOYMENTS, NS, "pynode-00001-deployment"))
    containers = rendered["spec"]["template"]["spec"]["containers"]
    containers[0].pop("readinessProbe")
    containers.append({"name": "queue-proxy", "image": "gcr.io/knative-releases/queue:1.15",
                       "readinessProbe": {"httpGet": {"path": "/", "port": 8012}}})
    real = sim.store.put(DEPLOYMENTS, rendered)
    sim.advance(5)
    kept = sim.store.get(DEPLOYMENTS, NS, "pynode-00001-deployment")
    assert kept["spec"]["template"] == real["spec"]["template"]
    assert [c["name"] for c in kept["spec"]["template"]["spec"]["containers"]] == ["user-container", "queue-proxy"]

    revision = copy(sim.store.get(REVISIONS, NS, "pynode-00001"))
    revision["metadata"].setdefault("annotations", {})["autoscaling.knative.dev/min-scale"] = "2"
    sim.store.put(REVISIONS, revision)
    sim.advance(0)
    template = sim.store.get(DEPLOYMENTS, NS, "pynode-00001-deployment")["spec"]["template"]
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "2"
