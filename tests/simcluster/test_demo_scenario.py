"""The shipped demo scenario loads, settles, and shows what the demo needs to show."""
from __future__ import annotations

import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from simcluster.control import SimControl
from simcluster.testing import running_cluster

DEMO = Path(__file__).resolve().parents[2] / "simcluster" / "scenarios" / "demo.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"
# One demo cluster serves the module: its tests stay on one pytest-xdist worker (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("demo-scenario")


def gpus(pod) -> int:
    return sum(int((c.resources.limits or {}).get("nvidia.com/gpu", 0)) for c in pod.spec.containers
               if c.resources)


@pytest.fixture(scope="module")
def demo():
    started = time.monotonic()
    with running_cluster(str(DEMO)) as url:
        api = client.ApiClient(client.Configuration(host=url))
        control = SimControl(url)
        control.advance(60)
        yield url, api, control, time.monotonic() - started
        api.close()


def test_it_starts_and_settles_quickly(demo):
    *_, elapsed = demo
    assert elapsed < 30


def test_pools_orgs_and_workloads_are_there(demo):
    _, api, _, _ = demo
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    products = Counter(n.metadata.labels.get("nvidia.com/gpu.product") for n in core.list_node().items)
    assert products[H100] == 8 and products["NVIDIA-A10G"] == 4
    orgs = core.list_namespace(label_selector="capacity.io/org").items
    assert 25 <= len(orgs) <= 35
    pynodes = custom.list_cluster_custom_object("serving.knative.dev", "v1", "services",
                                                label_selector="capacity.io/component=pynode")["items"]
    assert {p["metadata"]["namespace"] for p in pynodes} == {o.metadata.name for o in orgs}
    models = Counter(i["metadata"]["namespace"] for i in custom.list_cluster_custom_object(
        "serving.kserve.io", "v1beta1", "inferenceservices")["items"])
    assert all(1 <= models[o.metadata.name] <= 4 for o in orgs)
    versions = {ns.metadata.name: ns.metadata.labels.get("app.kubernetes.io/version")
                for ns in core.list_namespace().items}
    assert versions["knative-serving"] == "1.15.0" and versions["kserve"] == "v0.15.0"


def test_everything_that_fits_is_running_after_a_minute(demo):
    _, api, _, _ = demo
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces().items
    assert pods
    not_running = [f"{p.metadata.namespace}/{p.metadata.name}: {p.status.phase}" for p in pods
                   if p.status.phase != "Running"]
    assert not_running == []
    isvcs = client.CustomObjectsApi(api).list_cluster_custom_object(
        "serving.kserve.io", "v1beta1", "inferenceservices")["items"]
    not_ready = [i["metadata"]["name"] for i in isvcs
                 if not any(c["type"] == "Ready" and c["status"] == "True"
                            for c in i.get("status", {}).get("conditions", []))]
    assert not_ready == []


def test_idle_gpu_holders_export_zero_utilization(demo):
    url, *_ = demo
    with urllib.request.urlopen(f"{url}/metrics") as response:
        text = response.read().decode()
    util = next(f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL")
    by_pod = defaultdict(list)
    for sample in util.samples:
        if "pod" in sample.labels:
            by_pod[sample.labels["pod"]].append(sample.value)
    notebook = [v for pod, v in by_pod.items() if pod.startswith("scratch-notebook")]
    embedder = [v for pod, v in by_pod.items() if pod.startswith("batch-embedder")]
    assert notebook == [[0.0]] and embedder == [[0.0, 0.0]]
    assert any(max(v) > 0 for v in by_pod.values())


def test_after_idle_models_scale_to_zero_the_h100_pool_is_fragmented(demo):
    _, api, control, _ = demo
    control.advance(180)
    core = client.CoreV1Api(api)
    used = defaultdict(int)
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name and pod.spec.node_name.startswith("gpu-h100") and pod.status.phase == "Running":
            used[pod.spec.node_name] += gpus(pod)
    free = {f"gpu-h100-{i:02d}": 8 - used[f"gpu-h100-{i:02d}"] for i in range(8)}
    # Room for a whole 8-GPU job in total, but on no single node.
    assert sum(free.values()) >= 8
    assert max(free.values()) < 8
    assert sum(1 for n in free.values() if 6 <= n < 8) >= 2    # nodes holding one or two small pods


def _switch_pynode_to_zero(api, control, namespace: str) -> list:
    """What the org switch writes to a pynode where the cluster allows it (min-scale and
    initial-scale "0"), then the pods of the Revision that write makes, 10 s later."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    custom.patch_namespaced_custom_object(
        "serving.knative.dev", "v1", namespace, "services", "pynode",
        {"spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "0",
                                                            "autoscaling.knative.dev/initial-scale": "0"}}}}})
    control.advance(10)
    return core.list_namespaced_pod(namespace, label_selector="serving.knative.dev/revision=pynode-00002").items


def test_the_demo_knative_allows_a_zero_initial_scale_so_a_dormancy_switch_starts_no_pod(demo):
    """As the README recommends: config-autoscaler allows a zero initial scale, the product
    reads it so, and a switched pynode's new Revision starts no pod (25 → 48 pods before)."""
    from clusters.knative import initial_scale_from_config

    _, api, control, _ = demo
    config = client.CoreV1Api(api).read_namespaced_config_map("config-autoscaler", "knative-serving").data
    assert config == {"allow-zero-initial-scale": "true"}
    assert initial_scale_from_config(config=config).zero_allowed
    assert _switch_pynode_to_zero(api, control, "org-hooli") == []


def test_the_other_scenario_is_the_same_cluster_with_knatives_defaults_and_shows_why():
    """demo-initial-scale-1.yaml differs only in an empty config-autoscaler: there the same
    switch starts a pynode pod for nothing (Knative ignores initial-scale "0")."""
    import yaml

    other = DEMO.with_name("demo-initial-scale-1.yaml")
    ours, theirs = (list(yaml.safe_load_all(p.read_text())) for p in (DEMO, other))
    differ = [(a, b) for a, b in zip(ours, theirs) if a != b]
    assert len(ours) == len(theirs) and len(differ) == 1
    (a, b), = differ
    assert (a["kind"], a["metadata"]["name"], a["data"], b["data"]) == (
        "ConfigMap", "config-autoscaler", {"allow-zero-initial-scale": "true"}, {})
    with running_cluster(str(other)) as url:
        api = client.ApiClient(client.Configuration(host=url))
        control = SimControl(url)
        control.advance(60)
        assert len(_switch_pynode_to_zero(api, control, "org-hooli")) == 1
        api.close()
