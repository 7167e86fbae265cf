"""KServe InferenceService in the simulated cluster."""
from __future__ import annotations

from simcluster.controllers import default_controllers
from simcluster.resources import DEPLOYMENTS, INFERENCESERVICES, KSERVICES, NAMESPACES, PODAUTOSCALERS, REVISIONS
from simcluster.sim import SimSettings, Simulation
from simcluster.store import copy

NS = "org-acme"


def make_sim(**settings) -> Simulation:
    sim = Simulation(settings=SimSettings(**settings), controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    return sim


def isvc(name="llama", *, annotations=None, **predictor) -> dict:
    body = {"metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "vllm"}, "storageUri": "s3://m/llama",
                                             "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4"}}},
                                   **predictor}}}
    return body


def annotate(sim, name, **annotations) -> None:
    new = copy(sim.store.get(INFERENCESERVICES, NS, name))
    new["metadata"].setdefault("annotations", {}).update(annotations)
    sim.store.put(INFERENCESERVICES, new)


def template_annotations(sim, name="llama") -> dict:
    return sim.store.get(KSERVICES, NS, f"{name}-predictor")["spec"]["template"]["metadata"]["annotations"]


def test_serverless_mode_makes_a_predictor_knative_service_with_scale_annotations():
    sim = make_sim()
    sim.store.create(INFERENCESERVICES, isvc(minReplicas=0, maxReplicas=3, scaleTarget=5))
    sim.run_to_rest()
    service = sim.store.get(KSERVICES, NS, "llama-predictor")
    assert service["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    annotations = template_annotations(sim)
    assert annotations["autoscaling.knative.dev/min-scale"] == "0"
    assert annotations["autoscaling.knative.dev/max-scale"] == "3"
    assert annotations["autoscaling.knative.dev/target"] == "5"
    labels = service["spec"]["template"]["metadata"]["labels"]
    assert labels["serving.kserve.io/inferenceservice"] == "llama"
    assert labels["component"] == "predictor"
    container = service["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "kserve-container"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # ... and the chain below it: revision, deployment, PA with the same bounds.
    assert sim.store.get(REVISIONS, NS, "llama-predictor-00001") is not None
    pod_labels = sim.store.get(DEPLOYMENTS, NS, "llama-predictor-00001-deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["serving.kserve.io/inferenceservice"] == "llama"
    assert sim.store.get(PODAUTOSCALERS, NS, "llama-predictor-00001")["metadata"]["annotations"][
        "autoscaling.knative.dev/min-scale"] == "0"
    status = sim.store.get(INFERENCESERVICES, NS, "llama")["status"]
    assert status["components"]["predictor"]["latestCreatedRevision"] == "llama-predictor-00001"


def test_min_replicas_defaults_to_one_and_max_zero_means_unlimited():
    sim = make_sim()
    sim.store.create(INFERENCESERVICES, isvc(maxReplicas=0))
    sim.run_to_rest()
    annotations = template_annotations(sim)
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    assert "autoscaling.knative.dev/max-scale" not in annotations


def test_containers_resources_are_used_without_a_model():
    sim = make_sim()
    body = isvc()
    del body["spec"]["predictor"]["model"]
    body["spec"]["predictor"]["containers"] = [{"name": "custom", "image": "me/server:1",
                                                "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    sim.store.create(INFERENCESERVICES, body)
    sim.run_to_rest()
    container = sim.store.get(KSERVICES, NS, "llama-predictor")["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["resources"]["limits"]["nvidia.com/gpu"]) == ("me/server:1", "2")


def test_kserve_reverts_a_manual_edit_of_the_predictor_template_but_follows_min_replicas():
    sim = make_sim()
    sim.store.create(INFERENCESERVICES, isvc(minReplicas=1))
    sim.run_to_rest()
    edited = copy(sim.store.get(KSERVICES, NS, "llama-predictor"))
    edited["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] = "0"
    sim.store.put(KSERVICES, edited)
    sim.run_to_rest()
    assert template_annotations(sim)["autoscaling.knative.dev/min-scale"] == "1"
    assert [r["metadata"]["name"] for r in sim.store.all(REVISIONS, NS)] == ["llama-predictor-00001"]

    new = copy(sim.store.get(INFERENCESERVICES, NS, "llama"))
    new["spec"]["predictor"]["minReplicas"] = 0
    sim.store.put(INFERENCESERVICES, new)
    sim.run_to_rest()
    assert template_annotations(sim)["autoscaling.knative.dev/min-scale"] == "0"
    assert sim.store.get(REVISIONS, NS, "llama-predictor-00002") is not None


def test_stop_annotation_removes_the_predictor_from_kserve_0_15():
    sim = make_sim(kserve_version="0.15")
    sim.store.create(INFERENCESERVICES, isvc())
    sim.run_to_rest()
    annotate(sim, "llama", **{"serving.kserve.io/stop": "true"})
    sim.run_to_rest()
    assert sim.store.get(KSERVICES, NS, "llama-predictor") is None
    conditions = {c["type"]: c for c in sim.store.get(INFERENCESERVICES, NS, "llama")["status"]["conditions"]}
    assert conditions["Stopped"]["status"] == "True"
    assert conditions["Ready"]["status"] == "False"

    annotate(sim, "llama", **{"serving.kserve.io/stop": "false"})
    sim.run_to_rest()
    assert sim.store.get(KSERVICES, NS, "llama-predictor") is not None


def test_stop_annotation_is_ignored_before_kserve_0_15():
    sim = make_sim(kserve_version="0.14")
    sim.store.create(INFERENCESERVICES, isvc(annotations={"serving.kserve.io/stop": "true"}))
    sim.run_to_rest()
    assert sim.store.get(KSERVICES, NS, "llama-predictor") is not None


def test_raw_deployment_mode_makes_a_deployment_that_never_scales_to_zero():
    sim = make_sim()
    sim.store.create(INFERENCESERVICES, isvc(annotations={"serving.kserve.io/deploymentMode": "RawDeployment",
                                                          "simcluster.io/gpu-utilization": "0"},
                                             minReplicas=2))
    sim.run_to_rest()
    assert sim.store.get(KSERVICES, NS, "llama-predictor") is None
    # The InferenceService's annotations reach the pods in raw mode as in Knative mode.
    template = sim.store.get(DEPLOYMENTS, NS, "llama-predictor")["spec"]["template"]
    assert template["metadata"]["annotations"]["simcluster.io/gpu-utilization"] == "0"
    deployment = sim.store.get(DEPLOYMENTS, NS, "llama-predictor")
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["serving.kserve.io/inferenceservice"] == "llama" and labels["component"] == "predictor"

    new = copy(sim.store.get(INFERENCESERVICES, NS, "llama"))
    new["spec"]["predictor"]["minReplicas"] = 0
    sim.store.put(INFERENCESERVICES, new)
    sim.run_to_rest()
    assert sim.store.get(DEPLOYMENTS, NS, "llama-predictor")["spec"]["replicas"] == 1


def test_an_unknown_deployment_mode_is_reported_on_the_status():
    sim = make_sim()
    sim.store.create(INFERENCESERVICES, isvc(annotations={"serving.kserve.io/deploymentMode": "Magic"}))
    sim.run_to_rest()
    ready = sim.store.get(INFERENCESERVICES, NS, "llama")["status"]["conditions"][0]
    assert ready["status"] == "False" and "'Magic'" in ready["message"]
