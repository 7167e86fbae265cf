"""Kthena ModelServing in the simulated cluster, driven like seed 003 drives a real one:
through the official `kubernetes` client and `kubectl` over HTTP."""
from __future__ import annotations

import subprocess

import kubernetes
import pytest

GROUP, VERSION, PLURAL = "workload.serving.volcano.sh", "v1alpha1", "modelservings"
NS = "default"

SCENARIO = """
apiVersion: v1
kind: Node
metadata: {name: gpu-node-1, labels: {nvidia.com/gpu.product: NVIDIA-H100}}
status:
  capacity: {cpu: "192", memory: 2000Gi, nvidia.com/gpu: "8", pods: "110"}
  allocatable: {cpu: "192", memory: 2000Gi, nvidia.com/gpu: "8", pods: "110"}
---
apiVersion: v1
kind: Namespace
metadata: {name: default}
"""


def _template(role: str) -> dict:
    return {"metadata": {"labels": {"app": f"sample-{role}"}},
            "spec": {"containers": [{"name": role, "image": "vllm/vllm-openai:v0.6",
                                     "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}}


def sample(replicas=2, *, prefill=2, decode=2, workers=0) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelServing",
            "metadata": {"name": "sample", "namespace": NS},
            "spec": {"replicas": replicas, "template": {"roles": [
                {"name": "prefill", "replicas": prefill, "entryTemplate": _template("prefill"),
                 "workerReplicas": workers, "workerTemplate": _template("prefill-worker")},
                {"name": "decode", "replicas": decode, "entryTemplate": _template("decode"),
                 "workerReplicas": workers, "workerTemplate": _template("decode-worker")}]}}}


@pytest.fixture
def kthena(sim_cluster):
    api = kubernetes.config.new_client_from_config(config_file=sim_cluster.kubeconfig_path)
    crd, core = kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)
    yield sim_cluster, crd, core
    api.close()


def pod_names(core) -> list[str]:
    return sorted(p.metadata.name for p in core.list_namespaced_pod(NS).items if not p.metadata.deletion_timestamp)


def scale(crd, *, replicas=None, decode=None) -> None:
    ms = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "sample")
    if replicas is not None:
        ms["spec"]["replicas"] = replicas
    if decode is not None:
        ms["spec"]["template"]["roles"][1]["replicas"] = decode
    crd.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "sample", ms)


SEED_PODS = ["sample-0-decode-0-0", "sample-0-decode-1-0", "sample-0-prefill-0-0", "sample-0-prefill-1-0",
             "sample-1-decode-0-0", "sample-1-decode-1-0", "sample-1-prefill-0-0", "sample-1-prefill-1-0"]


def test_seed_003_walkthrough_annotated_group_survives_and_decode_0_goes(kthena):
    sim, crd, core = kthena
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, sample())
    sim.advance(60)
    assert pod_names(core) == SEED_PODS
    pod = core.read_namespaced_pod("sample-1-decode-1-0", NS)
    assert pod.metadata.labels["modelserving.volcano.sh/name"] == "sample"
    assert pod.metadata.labels["modelserving.volcano.sh/group-name"] == "sample-1"
    assert pod.metadata.labels["modelserving.volcano.sh/role"] == "decode"
    assert pod.metadata.labels["modelserving.volcano.sh/role-id"] == "decode-1"

    # The seed's `kubectl edit pod sample-1-decode-1-0`, as an annotate.
    subprocess.run(["kubectl", "--kubeconfig", sim.kubeconfig_path, "-n", NS, "annotate", "pod",
                    "sample-1-decode-1-0", "controller.kubernetes.io/pod-deletion-cost=100"],
                   check=True, capture_output=True, timeout=30)
    scale(crd, replicas=1)
    sim.advance(60)
    assert pod_names(core) == ["sample-1-decode-0-0", "sample-1-decode-1-0",
                               "sample-1-prefill-0-0", "sample-1-prefill-1-0"]

    scale(crd, decode=1)
    sim.advance(60)
    assert pod_names(core) == ["sample-1-decode-1-0", "sample-1-prefill-0-0", "sample-1-prefill-1-0"]


def test_without_costs_the_highest_index_goes_first(kthena):
    sim, crd, core = kthena
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, sample())
    sim.advance(60)
    scale(crd, replicas=1)
    sim.advance(60)
    assert pod_names(core) == ["sample-0-decode-0-0", "sample-0-decode-1-0",
                               "sample-0-prefill-0-0", "sample-0-prefill-1-0"]


def test_an_invalid_cost_counts_as_zero(kthena):
    sim, crd, core = kthena
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, sample(prefill=1, decode=1))
    sim.advance(60)
    # "+100" is not a valid pod-deletion-cost: the API server refuses it on a pod.
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.patch_namespaced_pod("sample-1-decode-0-0", NS, {"metadata": {"annotations": {
            "controller.kubernetes.io/pod-deletion-cost": "+100"}}})
    assert refused.value.status == 422
    core.patch_namespaced_pod("sample-0-decode-0-0", NS, {"metadata": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "-5"}}})
    scale(crd, replicas=1)
    sim.advance(60)
    assert pod_names(core) == ["sample-1-decode-0-0", "sample-1-prefill-0-0"]


# Three groups of four one-GPU pods need 12 GPUs: on an 8-GPU node one group would stay
# Pending ("Creating"), and Kthena removes a not-Running group before any Running one,
# whatever the costs. With room for all, the cost is what picks group 1.
@pytest.mark.scenario(SCENARIO.replace('nvidia.com/gpu: "8"', 'nvidia.com/gpu: "16"'))
def test_scale_up_fills_the_lowest_free_index_and_workers_are_named_by_position(kthena):
    sim, crd, core = kthena
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, sample(3, prefill=1, decode=1, workers=1))
    sim.advance(60)
    core.patch_namespaced_pod("sample-1-prefill-0-1", NS, {"metadata": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "-10"}}})
    scale(crd, replicas=2)
    sim.advance(60)
    assert {n.rsplit("-", 3)[0] for n in pod_names(core)} == {"sample-0", "sample-2"}
    scale(crd, replicas=3)
    sim.advance(60)
    names = pod_names(core)
    assert "sample-1-prefill-0-0" in names and "sample-1-prefill-0-1" in names and "sample-1-decode-0-1" in names
    assert len(names) == 3 * 2 * 2
    status = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "sample")["status"]
    assert status["replicas"] == 3


def test_a_bad_spec_is_reported_on_the_status(kthena):
    sim, crd, core = kthena
    bad = sample()
    bad["spec"]["template"]["roles"][0].pop("entryTemplate")
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad)
    sim.advance(5)
    status = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "sample")["status"]
    assert "spec.template.roles[0].entryTemplate is required" in status["conditions"][0]["message"]
    assert pod_names(core) == []
