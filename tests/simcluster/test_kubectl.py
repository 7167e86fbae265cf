"""Debian's `kubectl` against the simulated cluster, with the kubeconfig the server
writes: the commands an operator runs (get, cordon, annotate, delete), short names of
the serving resources, and bad input answered as kube-apiserver answers it."""
from __future__ import annotations

import json

import pytest

from conftest import KUBECTL, NODES_AND_NAMESPACE

NS = "team-a"
COST = "controller.kubernetes.io/pod-deletion-cost"

SCENARIO = NODES_AND_NAMESPACE + """---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: pynode, namespace: team-a, labels: {capacity.io/component: pynode}}
spec:
  template:
    metadata: {annotations: {autoscaling.knative.dev/min-scale: "1"}}
    spec:
      containers: [{image: registry.example.com/pynode:1}]
---
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama, namespace: team-a}
spec:
  predictor:
    minReplicas: 1
    model:
      modelFormat: {name: huggingface}
      resources: {limits: {nvidia.com/gpu: "1"}}
"""


@pytest.fixture
def cluster(kube_factory):
    kube = kube_factory(SCENARIO)
    kube.control.advance(60)
    return kube


def pod_names(kube) -> list[str]:
    return sorted(p.metadata.name for p in kube.core.list_namespaced_pod(NS).items
                  if not p.metadata.deletion_timestamp)


def test_the_kubeconfig_names_the_server_and_kubectl_finds_it(cluster):
    assert KUBECTL.endswith("kubectl")
    out = cluster.kubectl("config", "view", "--minify", "-o", "json").stdout
    assert json.loads(out)["clusters"][0]["cluster"]["server"] == cluster.url


def test_get_pods_in_all_namespaces_lists_the_running_serving_pods(cluster):
    table = cluster.kubectl("get", "pods", "-A").stdout.splitlines()
    assert table[0].split()[:3] == ["NAMESPACE", "NAME", "READY"]
    rows = [line.split() for line in table[1:]]
    assert {row[0] for row in rows} == {NS}
    assert len(rows) == len(pod_names(cluster)) >= 2
    assert all(row[3] == "Running" for row in rows)
    listed = cluster.kubectl_json("get", "pods", "-A")
    assert sorted(p["metadata"]["name"] for p in listed["items"]) == pod_names(cluster)


def test_get_nodes_shows_them_ready(cluster):
    rows = [line.split() for line in cluster.kubectl("get", "nodes").stdout.splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == [("gpu-1", "Ready"), ("gpu-2", "Ready")]
    labelled = cluster.kubectl("get", "nodes", "-l", "nvidia.com/gpu.product=NVIDIA-A10G", "-o", "name").stdout
    assert labelled.split() == ["node/gpu-2"]


def test_cordon_and_uncordon(cluster):
    assert "cordoned" in cluster.kubectl("cordon", "gpu-1").stdout
    assert cluster.core.read_node("gpu-1").spec.unschedulable is True
    assert "Ready,SchedulingDisabled" in cluster.kubectl("get", "node", "gpu-1").stdout
    cluster.kubectl("uncordon", "gpu-1")
    assert not cluster.core.read_node("gpu-1").spec.unschedulable


def test_annotate_a_pod_with_a_deletion_cost(cluster):
    name = pod_names(cluster)[0]
    cluster.kubectl("-n", NS, "annotate", "pod", name, f"{COST}=-5")
    assert cluster.core.read_namespaced_pod(name, NS).metadata.annotations[COST] == "-5"
    cluster.kubectl("-n", NS, "annotate", "--overwrite", "pod", name, f"{COST}=10")
    assert cluster.core.read_namespaced_pod(name, NS).metadata.annotations[COST] == "10"


@pytest.mark.parametrize("bad", ["+5", "05", "1.5", "99999999999"])
def test_an_invalid_deletion_cost_is_refused_and_nothing_changes(cluster, bad):
    name = pod_names(cluster)[0]
    result = cluster.kubectl("-n", NS, "annotate", "pod", name, f"{COST}={bad}", check=False)
    assert result.returncode != 0
    assert "Invalid value" in result.stderr and COST in result.stderr
    assert COST not in (cluster.core.read_namespaced_pod(name, NS).metadata.annotations or {})


def test_delete_a_pod_and_its_replicaset_replaces_it(cluster):
    victim = pod_names(cluster)[0]
    out = cluster.kubectl("-n", NS, "delete", "pod", victim, "--wait=false").stdout
    assert f'pod "{victim}" deleted' in out
    cluster.control.advance(400)
    names = pod_names(cluster)
    assert victim not in names and len(names) >= 2


def test_delete_of_a_missing_pod_is_not_found(cluster):
    result = cluster.kubectl("-n", NS, "delete", "pod", "no-such-pod", check=False)
    assert result.returncode != 0 and 'pods "no-such-pod" not found' in result.stderr


def test_get_ksvc_and_isvc_by_short_name(cluster):
    ksvc = cluster.kubectl("-n", NS, "get", "ksvc", "-o", "name").stdout.split()
    assert "service.serving.knative.dev/pynode" in ksvc
    assert "service.serving.knative.dev/llama-predictor" in ksvc
    isvc = cluster.kubectl_json("-n", NS, "get", "isvc", "llama")
    assert isvc["kind"] == "InferenceService" and isvc["metadata"]["name"] == "llama"
    assert cluster.kubectl("get", "isvc", "-A").stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]


def test_an_unknown_resource_type_is_an_error(cluster):
    result = cluster.kubectl("get", "flux-capacitors", check=False)
    assert result.returncode != 0
    assert "the server doesn't have a resource type" in result.stderr
