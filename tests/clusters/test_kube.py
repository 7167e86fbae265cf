"""The Kubernetes gateway against the simulated cluster, over HTTP through the official client."""
from __future__ import annotations

import socket
from collections import deque
from datetime import UTC, datetime

import pytest

from clusters import kube
import msgspec

from clusters.errors import (
    AlreadyExists,
    BadResponse,
    ConfigError,
    Conflict,
    Invalid,
    NotFound,
    TooManyRequests,
    Unavailable,
)

pytestmark = pytest.mark.django_db

SCENARIO = """
apiVersion: v1
kind: Node
metadata: {name: gpu-1}
status:
  capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
  allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
---
apiVersion: v1
kind: Namespace
metadata: {name: team, labels: {capacity.io/org: team}}
"""

DEAD_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: dead, cluster: {server: "http://127.0.0.1:{port}"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: dead, context: {cluster: dead, user: u}}]
current-context: dead
"""


def pod(name: str, *, labels: dict | None = None, node: str | None = None) -> dict:
    spec = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team", "labels": labels or {}},
            "spec": spec}


def deployment(name: str, replicas: int = 1) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "team"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}


@pytest.fixture
def sim(sim_cluster_factory):
    return sim_cluster_factory(SCENARIO)


@pytest.fixture
def gw(sim):
    return sim.gateway


def test_create_get_and_list_with_selectors_and_paging(gw):
    for i in range(5):
        gw.create(kube.PODS, pod(f"p{i}", labels={"tier": "gpu" if i % 2 else "cpu"}, node="gpu-1" if i < 3 else None))
    assert gw.get(kube.PODS, "p3", namespace="team")["metadata"]["labels"] == {"tier": "gpu"}

    before = gw.calls[("list", "pods")]
    everything = gw.list(kube.PODS, namespace="team", page_size=2)
    assert sorted(p["metadata"]["name"] for p in everything) == ["p0", "p1", "p2", "p3", "p4"]
    assert gw.calls[("list", "pods")] - before == 3, "5 pods in pages of 2 take 3 LIST calls"
    assert all(p["kind"] == "Pod" and p["apiVersion"] == "v1" for p in everything)

    assert [p["metadata"]["name"] for p in gw.list(kube.PODS, label_selector="tier=gpu")] == ["p1", "p3"]
    on_node = gw.list(kube.PODS, field_selector="spec.nodeName=gpu-1")
    assert sorted(p["metadata"]["name"] for p in on_node) == ["p0", "p1", "p2"]


def test_a_page_decoded_into_the_views_fields_is_the_page_the_dicts_make(gw):
    from clusters.snapshot import POD_LIST, PodView

    for i in range(3):
        gw.create(kube.PODS, pod(f"p{i}", labels={"tier": "gpu"}, node="gpu-1" if i else None))
    typed = gw.list_page(kube.PODS, namespace="team", limit=2, decoder=POD_LIST)
    plain = gw.list_page(kube.PODS, namespace="team", limit=2)
    assert [PodView.from_fields(p) for p in typed.items] == [PodView.from_object(p) for p in plain["items"]]
    assert typed.continue_token and typed.continue_token == plain["metadata"]["continue"]
    rest = gw.list_page(kube.PODS, namespace="team", limit=2, continue_token=typed.continue_token, decoder=POD_LIST)
    assert [p.metadata.name for p in rest.items] == ["p2"] and rest.continue_token is None


def test_an_answer_not_of_the_shape_asked_for_is_a_bad_response_and_not_retried(gw):
    before = gw.calls[("list", "nodes")]
    with pytest.raises(BadResponse, match=r"list nodes /api/v1/nodes: the answer is not what was asked for.*"
                                          r"Expected `int`, got `object`") as exc:
        gw.list_page(kube.NODES, decoder=msgspec.json.Decoder(int))
    assert exc.value.code == 502 and not exc.value.transient
    assert gw.calls[("list", "nodes")] - before == 1


def test_errors_are_the_projects_own(gw):
    gw.create(kube.PODS, pod("dup"))
    with pytest.raises(AlreadyExists) as exc:
        gw.create(kube.PODS, pod("dup"))
    assert exc.value.code == 409 and exc.value.reason == "AlreadyExists"
    with pytest.raises(NotFound, match='"ghost" not found'):
        gw.get(kube.PODS, "ghost", namespace="team")
    bad = pod("costly")
    bad["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "+5"}
    with pytest.raises(Invalid) as invalid:
        gw.create(kube.PODS, bad)
    assert invalid.value.code == 422


def test_a_namespaced_resource_without_namespace_is_refused_before_any_call(gw):
    with pytest.raises(Invalid, match="namespaced: a namespace is required"):
        gw.get(kube.PODS, "x")
    with pytest.raises(Invalid, match="cluster-scoped"):
        gw.get(kube.NODES, "gpu-1", namespace="team")
    assert gw.calls_total() == 0


def test_replace_with_a_stale_resource_version_conflicts(gw):
    created = gw.create(kube.DEPLOYMENTS, deployment("web"))
    fresh = gw.patch(kube.DEPLOYMENTS, "web", {"metadata": {"labels": {"v": "2"}}}, namespace="team")
    assert fresh["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    created["spec"]["replicas"] = 3
    with pytest.raises(Conflict):
        gw.replace(kube.DEPLOYMENTS, created)
    fresh["spec"]["replicas"] = 3
    assert gw.replace(kube.DEPLOYMENTS, fresh)["spec"]["replicas"] == 3


@pytest.mark.parametrize(("patch_type", "body"), [
    ("merge", {"metadata": {"annotations": {"a": "1"}}}),
    ("strategic", {"metadata": {"annotations": {"a": "1"}}}),
    ("json", [{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}]),
])
def test_patch_types(gw, patch_type, body):
    gw.create(kube.DEPLOYMENTS, deployment("web"))
    patched = gw.patch(kube.DEPLOYMENTS, "web", body, namespace="team", patch_type=patch_type)
    assert patched["metadata"]["annotations"]["a"] == "1"


def test_patch_refuses_an_unknown_type_or_a_mismatched_body(gw):
    with pytest.raises(Invalid, match="unknown patch type 'apply'"):
        gw.patch(kube.PODS, "x", {}, namespace="team", patch_type="apply")
    with pytest.raises(Invalid, match="list of operations"):
        gw.patch(kube.PODS, "x", {"a": 1}, namespace="team", patch_type="json")


def test_custom_resources_json_patch(sim, gw):
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llm", "namespace": "team"},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}}}}}
    gw.create(kube.INFERENCESERVICES, isvc)
    gw.patch(kube.INFERENCESERVICES, "llm", [{"op": "add", "path": "/spec/predictor/minReplicas", "value": 0}],
             namespace="team", patch_type="json")
    assert gw.get(kube.INFERENCESERVICES, "llm", namespace="team")["spec"]["predictor"]["minReplicas"] == 0
    sim.advance(0)
    assert gw.get(kube.KNATIVE_SERVICES, "llm-predictor", namespace="team")["metadata"]["name"] == "llm-predictor"


def test_delete_preconditions_and_propagation(gw):
    created = gw.create(kube.PODS, pod("doomed"))
    with pytest.raises(Conflict):
        gw.delete(kube.PODS, "doomed", namespace="team", uid="not-the-uid")
    gw.delete(kube.PODS, "doomed", namespace="team", uid=created["metadata"]["uid"], grace_period_seconds=0)
    with pytest.raises(NotFound):
        gw.get(kube.PODS, "doomed", namespace="team")
    with pytest.raises(Invalid, match="propagation"):
        gw.delete(kube.PODS, "x", namespace="team", propagation="Sideways")


def test_scale_subresource(sim, gw):
    gw.create(kube.DEPLOYMENTS, deployment("web", replicas=1))
    assert gw.get_scale(kube.DEPLOYMENTS, "web", namespace="team")["spec"]["replicas"] == 1
    gw.set_scale(kube.DEPLOYMENTS, "web", 3, namespace="team")
    assert gw.get(kube.DEPLOYMENTS, "web", namespace="team")["spec"]["replicas"] == 3
    with pytest.raises(Invalid, match="replicas must be a whole number"):
        gw.set_scale(kube.DEPLOYMENTS, "web", -1, namespace="team")


def test_eviction_and_a_budget_refusal_that_is_not_retried(sim, gw):
    running = gw.create(kube.PODS, pod("web-1", labels={"app": "web"}, node="gpu-1"))
    sim.advance(10)
    gw.create(kube.PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                          "metadata": {"name": "web", "namespace": "team"},
                          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    sim.advance(1)
    with pytest.raises(TooManyRequests):
        gw.evict(running["metadata"]["name"], namespace="team")
    assert gw.calls[("evict", "pods")] == 1
    gw.delete(kube.PDBS, "web", namespace="team")
    gw.evict(running["metadata"]["name"], namespace="team")
    sim.advance(60)
    left = gw.list(kube.PODS, namespace="team", label_selector="app=web")
    assert all(p["metadata"].get("deletionTimestamp") for p in left), "the evicted pod is going or gone"


def test_event_names_the_involved_object_with_its_api_version(gw):
    ksvc = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": "pynode", "namespace": "team", "uid": "u-1"}}
    when = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)
    gw.create_event(ksvc, reason="ScaleToZeroEnabled", message="org dormant", now=when)
    [event] = gw.list(kube.EVENTS, namespace="team")
    assert event["involvedObject"] == {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "pynode",
                                       "namespace": "team", "uid": "u-1"} | {
        k: v for k, v in event["involvedObject"].items() if k == "resourceVersion"}
    assert (event["reason"], event["type"], event["firstTimestamp"]) == ("ScaleToZeroEnabled", "Normal",
                                                                         "2026-03-24T12:00:00Z")
    with pytest.raises(Invalid, match="Normal or Warning"):
        gw.create_event(ksvc, reason="x", message="y", event_type="Bad")


def test_transient_errors_are_retried_then_surface_as_unavailable(sim, gw):
    gw.create(kube.PODS, pod("p"))
    sim.control.set_faults(seed=1, error_rate=1.0, match={"verbs": ["get"]})
    with pytest.raises(Unavailable) as exc:
        gw.get(kube.PODS, "p", namespace="team")
    assert exc.value.code == 500
    assert gw.calls[("get", "pods")] == 5 and gw.retries[("get", "pods")] == 4

    sim.control.set_faults(seed=3, error_rate=0.5, throttle_rate=0.3, match={"verbs": ["get"]})
    for _ in range(10):
        assert gw.get(kube.PODS, "p", namespace="team")["metadata"]["name"] == "p"
    assert gw.retries[("get", "pods")] > 4, "some of the 10 reads met a fault and were retried"


def test_throttling_honours_retry_after_within_the_cap(sim, gw):
    waits = []
    gateway = kube.KubeGateway.from_kubeconfig(sim.kubeconfig_path, retry_attempts=3, backoff=0.01, backoff_max=0.5,
                                               sleep=waits.append)
    sim.control.set_faults(seed=0, throttle_rate=1.0, match={"verbs": ["list"]})
    with pytest.raises(TooManyRequests) as exc:
        gateway.list(kube.NODES)
    assert exc.value.retry_after is not None
    assert waits == [min(exc.value.retry_after, 0.5)] * 2


def test_no_answer_is_unavailable(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "dead"
    kubeconfig.write_text(DEAD_KUBECONFIG.replace("{port}", str(port)))
    gateway = kube.KubeGateway.from_kubeconfig(str(kubeconfig), retry_attempts=2, sleep=lambda s: None)
    with pytest.raises(Unavailable) as exc:
        gateway.list(kube.NODES)
    assert exc.value.reason == "ConnectionError" and gateway.calls[("list", "nodes")] == 2


PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                   "NO_PROXY", "no_proxy")


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_environment_proxy_is_taken_when_the_gateway_is_made_and_not_read_again(sim, monkeypatch):
    import kubernetes.client.configuration as client_configuration

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_dead_port()}")   # nothing answers there
    proxied = kube.KubeGateway.from_kubeconfig(sim.kubeconfig_path, retry_attempts=1)
    with pytest.raises(Unavailable):
        proxied.list(kube.NODES)   # the environment's proxy is used
    monkeypatch.delenv("HTTP_PROXY")
    direct = kube.KubeGateway.from_kubeconfig(sim.kubeconfig_path, retry_attempts=1)
    reads = []
    real = client_configuration.getproxies
    monkeypatch.setattr(client_configuration, "getproxies", lambda: reads.append(1) or real())
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_dead_port()}")   # set after: not this gateway's
    assert [n["metadata"]["name"] for n in direct.list(kube.NODES, page_size=1)]
    assert direct.calls[("list", "nodes")] >= 1 and reads == []   # no request read the environment


def test_a_missing_kubeconfig_is_a_config_error_naming_the_path(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        kube.KubeGateway.from_kubeconfig(str(tmp_path / "nope.yaml"))


def test_write_conflicts_are_not_retried_by_the_gateway(sim, gw):
    gw.create(kube.PODS, pod("p"))
    sim.control.set_faults(seed=0, conflict_rate=1.0, match={"verbs": ["patch"]})
    with pytest.raises(Conflict):
        gw.patch(kube.PODS, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="team")
    assert gw.calls[("patch", "pods")] == 1


def test_watch_yields_changes_with_versions_and_relists_after_410(sim, gw):
    gw.create(kube.PODS, pod("first"))
    stream = gw.watch(kube.PODS, namespace="team", timeout_seconds=2)
    initial = next(stream)
    assert (initial.type, initial.object["metadata"]["name"]) == ("ADDED", "first")
    gw.create(kube.PODS, pod("second"))
    change = next(stream)
    assert (change.type, change.object["metadata"]["name"]) == ("ADDED", "second")
    assert int(change.resource_version) > int(initial.resource_version)
    stream.close()

    # Compact the simulated API server's history so the old version is gone (410).
    store = sim.sim.store
    old_rv = initial.resource_version
    store._history = deque(store._history, maxlen=1)
    gw.patch(kube.PODS, "first", {"metadata": {"labels": {"x": "1"}}}, namespace="team")
    gw.patch(kube.PODS, "second", {"metadata": {"labels": {"x": "1"}}}, namespace="team")
    relisted = gw.watch(kube.PODS, namespace="team", resource_version=old_rv, timeout_seconds=1)
    names = sorted(next(relisted).object["metadata"]["name"] for _ in range(2))
    relisted.close()
    assert names == ["first", "second"], "after 410 the watch re-lists the current objects"


def test_resource_for_names_known_kinds_and_refuses_others():
    assert kube.resource_for("serving.knative.dev/v1", "Revision") is kube.REVISIONS
    with pytest.raises(Invalid, match="unknown resource kind 'Gizmo'"):
        kube.resource_for("example.com/v1", "Gizmo")
