"""The simulated DCGM exporter: what a Prometheus scrape of `/metrics` would see."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from simcluster.controllers import default_controllers
from simcluster.generate import node
from simcluster.metrics import gpu_uuid, render_metrics
from simcluster.resources import DEPLOYMENTS, KSERVICES, NAMESPACES, NODES, PODS
from simcluster.sim import Simulation
from simcluster.store import copy

NS = "org-acme"
H100 = "NVIDIA-H100-80GB-HBM3"


def make_sim() -> Simulation:
    sim = Simulation(controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    sim.store.create(NODES, node("gpu-0", pool="h100", product=H100, gpus=8))
    return sim


def running_pod(sim, name, indices, *, annotations=None, labels=None) -> dict:
    """A pod as the kubelet leaves it: bound, Running, Ready, its GPU indices noted."""
    meta = {"name": name, "namespace": NS, "labels": labels or {},
            "annotations": {"simcluster.io/gpu-indices": ",".join(map(str, indices)), **(annotations or {})}}
    return sim.store.create(PODS, {"metadata": meta, "spec": {"nodeName": "gpu-0", "containers": [
        {"name": "sidecar", "image": "s"},
        {"name": "model", "image": "m", "resources": {"limits": {"nvidia.com/gpu": str(len(indices))}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})


def scrape(sim) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(render_metrics(sim))}


def by_gpu(samples) -> dict[str, object]:
    return {s.labels["gpu"]: s for s in samples}


def test_one_series_per_gpu_labelled_like_dcgm_exporter():
    sim = make_sim()
    running_pod(sim, "llama-0", [2, 3], annotations={"simcluster.io/gpu-utilization": "90,0"})
    metrics = scrape(sim)
    assert set(metrics) >= {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    util = by_gpu(metrics["DCGM_FI_DEV_GPU_UTIL"])
    assert sorted(util, key=int) == [str(i) for i in range(8)]
    busy = util["2"]
    assert busy.labels == {"gpu": "2", "UUID": gpu_uuid("gpu-0", 2), "device": "nvidia2", "modelName": "NVIDIA H100 80GB HBM3",
                           "Hostname": "gpu-0", "namespace": NS, "pod": "llama-0", "container": "model"}
    assert busy.value == 90
    assert util["3"].value == 0 and util["3"].labels["pod"] == "llama-0"    # the idle half of the pod
    assert "pod" not in util["0"].labels                                   # nobody holds GPU 0
    assert by_gpu(metrics["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])["2"].value == 0.9
    assert by_gpu(metrics["DCGM_FI_DEV_FB_USED"])["2"].value > 0
    assert gpu_uuid("gpu-0", 2) != gpu_uuid("gpu-0", 3) != gpu_uuid("gpu-1", 2)


def test_pending_and_cpu_only_nodes_export_nothing_for_pods():
    sim = make_sim()
    sim.store.create(NODES, node("cpu-0", pool="cpu"))
    pending = copy(running_pod(sim, "waiting", [0]))
    pending["status"] = {"phase": "Pending"}
    sim.store.put(PODS, pending)
    metrics = scrape(sim)
    assert {s.labels["Hostname"] for s in metrics["DCGM_FI_DEV_GPU_UTIL"]} == {"gpu-0"}
    assert all("pod" not in s.labels for s in metrics["DCGM_FI_DEV_GPU_UTIL"])


def test_utilization_follows_the_revision_load():
    sim = make_sim()
    sim.store.create(KSERVICES, {"metadata": {"name": "chat", "namespace": NS}, "spec": {"template": {
        "metadata": {"annotations": {"autoscaling.knative.dev/target": "10",
                                     "autoscaling.knative.dev/min-scale": "2"}},
        "spec": {"containers": [{"name": "model", "image": "m"}]}}}})
    sim.run_to_rest()
    labels = sim.store.get(DEPLOYMENTS, NS, "chat-00001-deployment")["spec"]["template"]["metadata"]["labels"]
    running_pod(sim, "chat-a", [0], labels=labels)
    running_pod(sim, "chat-b", [1], labels=labels)
    assert by_gpu(scrape(sim)["DCGM_FI_DEV_GPU_UTIL"])["0"].value == 0

    sim.load[(NS, "chat-00001")] = 10          # 10 requests over 2 pods of target 10: 50%
    util = by_gpu(scrape(sim)["DCGM_FI_DEV_GPU_UTIL"])
    assert util["0"].value == 50 and util["1"].value == 50

    sim.load[(NS, "chat-00001")] = 500         # capped
    assert by_gpu(scrape(sim)["DCGM_FI_DEV_GPU_UTIL"])["0"].value == 100
