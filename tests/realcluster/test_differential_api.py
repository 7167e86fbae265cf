"""Differential checks of the API itself: the same script on simcluster and on the real
control plane, comparing what an API client observes — status codes, reasons, messages,
which pods remain.

Scale-down order follows `ActivePodsWithRanks.Less` in k8s.io/kubernetes
pkg/controller/controller_utils.go (v1.32): unassigned < assigned; Pending < Unknown <
Running; not ready < ready; lower deletion cost; more pods of the same ReplicaSet on the
pod's node (`getPodsRankedByRelatedPodsOnSameNode`, pkg/controller/replicaset); more
recently ready (log2 buckets of age, LogarithmicScaleDown); more restarts; newer.
Rule 6 compares ages in power-of-two buckets, so a check of "newer first" keeps the old
pods at least twice as old as the new ones when it scales down.
"""
from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest
from kubernetes import client

from .backends import Backend
from .test_differential import _live_pods, _ready, _replicaset, _wait_ready

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
# How long the "old" pods age before the new ones come: at least the time new pods take
# to become Ready and be ranked (about 1 s on KWOK), so the two fall in different buckets.
AGE_GAP_SECONDS = 6


@pytest.fixture
def tiers(sim_tier, real_tier) -> dict[str, Backend]:
    return {"simcluster": sim_tier, "real": real_tier}


def _request(kube: Backend, method: str, path: str, *, body=None, content_type: str | None = None,
             token: str | None = None) -> tuple[int, dict]:
    """One HTTP request as any client sends it (the body as given, not re-encoded by the
    generated client, which would rewrite a malformed patch): status and decoded body."""
    config = kube.api_client.configuration
    headers = {"Accept": JSON,
               "Authorization": f"Bearer {token}" if token else config.auth_settings()["BearerToken"]["value"]}
    if content_type:
        headers["Content-Type"] = content_type
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    response = kube.api_client.rest_client.pool_manager.request(method, config.host + path, body=body,
                                                                headers=headers)
    return response.status, json.loads(response.data)


def _status(code: int, body: dict) -> dict:
    """What a client reads from a Status answer."""
    causes = (body.get("details") or {}).get("causes") or []
    return {"code": code, "reason": body.get("reason"), "message": body.get("message"),
            # kube-apiserver 1.32 lists some validation causes twice; the set is what counts.
            "causes": sorted({(c.get("field"), c.get("reason"), c.get("message")) for c in causes})}


def _pin(rs: client.V1ReplicaSet, node: str) -> client.V1ReplicaSet:
    rs.spec.template.spec.node_selector = {"kubernetes.io/hostname": node}
    return rs


def _scale_to(kube: Backend, ns: str, replicas: int) -> list[client.V1Pod]:
    kube.apps.patch_namespaced_replica_set_scale("model", ns, {"spec": {"replicas": replicas}})
    return kube.settle(lambda: (lambda live: live if len(live) == replicas else None)(
        _live_pods(kube, ns, "app=model")), what=f"scale-down to {replicas}")


def _mark_unready(kube: Backend, ns: str, name: str) -> None:
    # What a failing readiness probe does: the kubelet writes Ready=False into status.
    kube.core.patch_namespaced_pod_status(name, ns, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ProbeFailed"},
        {"type": "ContainersReady", "status": "False", "reason": "ProbeFailed"}]}})


# --- ReplicaSet scale-down: readiness, then age --------------------------------------------------
def scale_down_by_readiness_and_age(kube: Backend) -> dict:
    """Two old pods and, AGE_GAP_SECONDS later, two new ones, all on one node (so rule 5
    ties). One old pod turns unready. Scale 4 -> 2: the unready old pod and one new pod go
    (rule 3, then rule 6). Scale 2 -> 1: the new pod goes, the ready old one stays."""
    ns = kube.namespace_create("rs-age")
    kube.apps.create_namespaced_replica_set(ns, _pin(_replicaset("model", 2), "gpu-a"))
    old = [p.metadata.name for p in _wait_ready(kube, ns, "app=model", 2)]
    kube.wait(AGE_GAP_SECONDS)
    kube.apps.patch_namespaced_replica_set_scale("model", ns, {"spec": {"replicas": 4}})
    new = [p.metadata.name for p in _wait_ready(kube, ns, "app=model", 4) if p.metadata.name not in old]
    _mark_unready(kube, ns, old[0])
    kube.settle(lambda: not _ready(kube.core.read_namespaced_pod(old[0], ns)), what="old pod unready")

    def kinds(pods):
        return sorted("unready old" if p.metadata.name == old[0] else "ready old" if p.metadata.name in old
                      else "new" for p in pods)
    return {"kept at 2": kinds(_scale_to(kube, ns, 2)), "kept at 1": kinds(_scale_to(kube, ns, 1)),
            "new pods made": len(new)}


def test_replicaset_scale_down_removes_unready_pods_first_then_the_newest(tiers):
    seen = {name: scale_down_by_readiness_and_age(kube) for name, kube in tiers.items()}
    assert seen["real"] == {"kept at 2": ["new", "ready old"], "kept at 1": ["ready old"], "new pods made": 2}
    assert seen["simcluster"] == seen["real"]


# --- ReplicaSet scale-down: pods doubled up on a node ---------------------------------------------
def _cordon(kube: Backend, node: str, cordoned: bool) -> None:
    kube.core.patch_node(node, {"spec": {"unschedulable": cordoned or None}})


def scale_down_by_node_doubling(kube: Backend, owner: str) -> dict:
    """Two pods on gpu-a and, AGE_GAP_SECONDS later, one on gpu-b (the newest). Rule 5
    counts a pod's node-mates among the pods of the ReplicaSets sharing its controller
    (`getIndirectlyRelatedPods` in pkg/controller/replicaset), so it applies to a
    Deployment's ReplicaSet — a gpu-a pod goes first although gpu-b's is newer — and not
    to a ReplicaSet standing alone, which has no related pods: there age decides.
    A Deployment's pods are steered by cordoning the other node; a lone ReplicaSet adopts
    pods made by hand."""
    ns = kube.namespace_create(f"rs-node-{owner[:3]}")
    template = _replicaset("model", 0).spec.template

    def pod(name: str, node: str) -> client.V1Pod:
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"app": "model"}),
                            spec=client.V1PodSpec(node_name=node, containers=template.spec.containers))
    try:
        if owner == "deployment":
            _cordon(kube, "gpu-b", True)
            kube.apps.create_namespaced_deployment(ns, client.V1Deployment(
                metadata=client.V1ObjectMeta(name="model"),
                spec=client.V1DeploymentSpec(replicas=2, template=template,
                                             selector=client.V1LabelSelector(match_labels={"app": "model"}))))
            scale = kube.apps.patch_namespaced_deployment_scale
        else:
            kube.core.create_namespaced_pod(ns, pod("a-1", "gpu-a"))
            kube.core.create_namespaced_pod(ns, pod("a-2", "gpu-a"))
            scale = kube.apps.patch_namespaced_replica_set_scale
        first = {p.metadata.name for p in _wait_ready(kube, ns, "app=model", 2)}
        kube.wait(AGE_GAP_SECONDS)
        if owner == "deployment":
            _cordon(kube, "gpu-a", True)
            _cordon(kube, "gpu-b", False)
            scale("model", ns, {"spec": {"replicas": 3}})
        else:
            kube.core.create_namespaced_pod(ns, pod("b-1", "gpu-b"))
        _wait_ready(kube, ns, "app=model", 3)
    finally:
        _cordon(kube, "gpu-a", False)
        _cordon(kube, "gpu-b", False)
    if owner != "deployment":
        kube.apps.create_namespaced_replica_set(ns, _replicaset("model", 3))
    live = kube.settle(lambda: (lambda pods: pods if all(p.metadata.owner_references for p in pods) else None)(
        _live_pods(kube, ns, "app=model")), what="three pods owned by the ReplicaSet")
    observed = {"nodes at 3": sorted(p.spec.node_name for p in live)}
    newest = next(p.metadata.name for p in live if p.metadata.name not in first)
    for replicas in (2, 1):
        scale("model", ns, {"spec": {"replicas": replicas}})
        kept = kube.settle(lambda: (lambda pods: pods if len(pods) == replicas else None)(
            _live_pods(kube, ns, "app=model")), what=f"scale-down to {replicas}")
        observed[f"kept at {replicas}"] = sorted("newest, gpu-b" if p.metadata.name == newest else p.spec.node_name
                                                 for p in kept)
    return observed


def test_replicaset_scale_down_removes_pods_doubled_up_on_a_node_first(tiers):
    seen = {name: scale_down_by_node_doubling(kube, "deployment") for name, kube in tiers.items()}
    assert seen["real"] == {"nodes at 3": ["gpu-a", "gpu-a", "gpu-b"], "kept at 2": ["gpu-a", "newest, gpu-b"],
                            "kept at 1": ["gpu-a"]}
    assert seen["simcluster"] == seen["real"]


def test_a_lone_replicaset_ignores_node_doubling(tiers):
    seen = {name: scale_down_by_node_doubling(kube, "replicaset") for name, kube in tiers.items()}
    assert seen["real"] == {"nodes at 3": ["gpu-a", "gpu-a", "gpu-b"], "kept at 2": ["gpu-a", "gpu-a"],
                            "kept at 1": ["gpu-a"]}
    assert seen["simcluster"] == seen["real"]


# --- patch types and their errors ---------------------------------------------------------------
def patch_types_and_errors(kube: Backend) -> dict:
    """A ReplicaSet of 0 replicas patched in each content type kube-apiserver accepts, and
    with bodies it refuses."""
    ns = kube.namespace_create("patch")
    kube.apps.create_namespaced_replica_set(ns, _replicaset("model", 0))
    path = f"/apis/apps/v1/namespaces/{ns}/replicasets/model"
    sidecar = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "dev.local/sidecar:1"}]}}}}
    observed = {}

    def containers(code, body):
        return code, [c["name"] for c in body["spec"]["template"]["spec"]["containers"]]
    # Strategic merge merges the list by its key (name); patch items come first.
    observed["strategic: containers"] = containers(*_request(kube, "PATCH", path, body=sidecar, content_type=STRATEGIC))
    observed["strategic $patch delete: containers"] = containers(*_request(
        kube, "PATCH", path, content_type=STRATEGIC,
        body={"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}))
    observed["merge: labels"] = _request(kube, "PATCH", path, content_type=MERGE_PATCH,
                                         body={"metadata": {"labels": {"tier": "gpu", "team": "ml"}}})[1]["metadata"]["labels"]
    observed["merge null: labels"] = _request(kube, "PATCH", path, content_type=MERGE_PATCH,
                                              body={"metadata": {"labels": {"team": None}}})[1]["metadata"]["labels"]
    # A merge patch replaces lists whole.
    observed["merge: containers"] = containers(*_request(kube, "PATCH", path, body=sidecar, content_type=MERGE_PATCH))
    code, body = _request(kube, "PATCH", path, content_type=JSON_PATCH, body=[
        {"op": "test", "path": "/spec/replicas", "value": 0}, {"op": "replace", "path": "/spec/replicas", "value": 1}])
    observed["json patch, test passes"] = (code, body["spec"]["replicas"])

    refusals = {
        "json patch, test fails": ([{"op": "test", "path": "/spec/replicas", "value": 5},
                                    {"op": "replace", "path": "/spec/replicas", "value": 3}], JSON_PATCH),
        "json patch, missing path": ([{"op": "replace", "path": "/spec/nothing/here", "value": 1}], JSON_PATCH),
        "json patch, unknown op": ([{"op": "frobnicate", "path": "/spec/replicas", "value": 1}], JSON_PATCH),
        "json patch, not an array": ({"op": "replace", "path": "/spec/replicas", "value": 1}, JSON_PATCH),
        "merge, not an object": ([1], MERGE_PATCH),
        "merge, negative replicas": ({"spec": {"replicas": -1}}, MERGE_PATCH),
        "strategic, negative replicas": ({"spec": {"replicas": -1}}, STRATEGIC),
        "merge, selector changed": ({"spec": {"selector": {"matchLabels": {"app": "other"}},
                                              "template": {"metadata": {"labels": {"app": "other"}}}}}, MERGE_PATCH),
        "unsupported content type": ({"spec": {"replicas": 2}}, "text/plain"),
        "plain JSON is no patch type": ({"spec": {"replicas": 2}}, JSON),
    }
    for what, (patch, content_type) in refusals.items():
        code, body = _request(kube, "PATCH", path, body=patch, content_type=content_type)
        observed[what] = _status(code, body)
        if what == "merge, selector changed" and code == 422:
            # The message renders the Go values (%#v); the fields and reasons are the contract.
            observed[what]["message"] = observed[what]["message"].split(":")[0]
            observed[what]["causes"] = sorted({(f, r) for f, r, _ in observed[what]["causes"]})
    # Decoding errors carry Go's JSON decoder text, and a wrongly typed value Go's type
    # names: only the code and reason are compared.
    for what, (raw, content_type) in {"merge, malformed JSON": ('{"spec":', MERGE_PATCH),
                                      "json patch, malformed JSON": ('[{"op":', JSON_PATCH),
                                      "strategic, malformed JSON": ('{"spec":', STRATEGIC),
                                      "merge, replicas a string": ('{"spec": {"replicas": "two"}}', MERGE_PATCH),
                                      }.items():
        code, body = _request(kube, "PATCH", path, body=raw, content_type=content_type)
        observed[what] = (code, body.get("reason"), body.get("message", "").startswith("error decoding patch"))
    code, body = _request(kube, "PATCH", path + "-missing", body={}, content_type=MERGE_PATCH)
    observed["missing object"] = _status(code, body)
    observed["replicas after the refusals"] = kube.apps.read_namespaced_replica_set("model", ns).spec.replicas
    return observed


def test_patch_types_and_the_errors_of_bad_patches(tiers):
    seen = {name: patch_types_and_errors(kube) for name, kube in tiers.items()}
    rejected = "the server rejected our request due to an error in our request"
    negative = {"code": 422, "reason": "Invalid",
                "message": 'ReplicaSet.apps "model" is invalid: spec.replicas: Invalid value: -1: '
                           'must be greater than or equal to 0',
                "causes": [("spec.replicas", "FieldValueInvalid", "Invalid value: -1: must be greater than or equal to 0")]}
    assert seen["real"] == {
        "strategic: containers": (200, ["sidecar", "model"]),
        "strategic $patch delete: containers": (200, ["model"]),
        "merge: labels": {"tier": "gpu", "team": "ml"},
        "merge null: labels": {"tier": "gpu"},
        "merge: containers": (200, ["sidecar"]),
        "json patch, test passes": (200, 1),
        "json patch, test fails": {"code": 422, "reason": "Invalid", "message": rejected, "causes": []},
        "json patch, missing path": {"code": 422, "reason": "Invalid", "message": rejected, "causes": []},
        "json patch, unknown op": {"code": 422, "reason": "Invalid", "message": rejected, "causes": []},
        "json patch, not an array": {
            "code": 400, "reason": "BadRequest", "causes": [],
            "message": "error decoding patch: json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp"},
        "merge, not an object": {
            "code": 400, "reason": "BadRequest", "causes": [],
            "message": "error decoding patch: json: cannot unmarshal array into Go value of type map[string]interface {}"},
        "merge, negative replicas": negative,
        "strategic, negative replicas": negative,
        "merge, selector changed": {"code": 422, "reason": "Invalid", "message": 'ReplicaSet.apps "model" is invalid',
                                    "causes": [("spec.selector", "FieldValueInvalid")]},
        "unsupported content type": {"code": 415, "reason": "UnsupportedMediaType",
                                     "message": "415: Unsupported Media Type", "causes": []},
        "plain JSON is no patch type": {"code": 415, "reason": "UnsupportedMediaType",
                                        "message": "415: Unsupported Media Type", "causes": []},
        "merge, malformed JSON": (400, "BadRequest", True),
        "json patch, malformed JSON": (400, "BadRequest", True),
        "strategic, malformed JSON": (400, "BadRequest", False),
        "merge, replicas a string": (422, "Invalid", False),
        "missing object": {"code": 404, "reason": "NotFound", "message": 'replicasets.apps "model-missing" not found',
                           "causes": []},
        "replicas after the refusals": 1,
    }
    assert seen["simcluster"] == seen["real"]


# --- field selectors -----------------------------------------------------------------------------
def field_selectors(kube: Backend) -> dict:
    """Pods on gpu-a, on gpu-b and one nobody can schedule, listed with field selectors."""
    ns = kube.namespace_create("fields")
    for name, node, selector in (("on-a", "gpu-a", None), ("on-b", "gpu-b", None),
                                 ("nowhere", None, {"realcluster.test/nowhere": "true"})):
        kube.core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": "fields"}),
            spec=client.V1PodSpec(node_name=node, node_selector=selector, containers=[
                client.V1Container(name="model", image="dev.local/model:1")])))
    kube.settle(lambda: sum(p.status.phase == "Running" for p in kube.core.list_namespaced_pod(ns).items) == 2,
                what="two pods running")
    observed = {}
    for selector in ("spec.nodeName=gpu-a", "spec.nodeName!=gpu-a", "spec.nodeName=", "status.phase=Pending",
                     "status.phase==Running", "metadata.name=on-b", "status.phase=Running,spec.nodeName=gpu-b",
                     "status.podIP!=", "spec.containers.image=dev.local/model:1", "metadata.labels.app=fields",
                     "spec.nodeName"):
        code, body = _request(kube, "GET", f"/api/v1/namespaces/{ns}/pods?fieldSelector={quote(selector)}")
        observed[f"pods {selector}"] = (sorted(p["metadata"]["name"] for p in body["items"]) if code == 200
                                        else _status(code, body))
    for selector in ("metadata.name=gpu-a", "spec.unschedulable=false", "spec.unschedulable=true"):
        code, body = _request(kube, "GET", f"/api/v1/nodes?fieldSelector={quote(selector)}")
        observed[f"nodes {selector}"] = sorted(n["metadata"]["name"] for n in body["items"])
    code, body = _request(kube, "GET", f"/api/v1/pods?fieldSelector={quote(f'metadata.namespace={ns},spec.nodeName=gpu-b')}")
    observed["all namespaces: this one, on gpu-b"] = sorted(p["metadata"]["name"] for p in body["items"])
    code, body = _request(kube, "GET", f"/api/v1/namespaces/{ns}/configmaps?fieldSelector={quote('data.model=x')}")
    observed["configmaps data.model=x"] = _status(code, body)
    return observed


def test_field_selectors_select_and_refuse_as_upstream(tiers):
    seen = {name: field_selectors(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "pods spec.nodeName=gpu-a": ["on-a"],
        "pods spec.nodeName!=gpu-a": ["nowhere", "on-b"],
        "pods spec.nodeName=": ["nowhere"],
        "pods status.phase=Pending": ["nowhere"],
        "pods status.phase==Running": ["on-a", "on-b"],
        "pods metadata.name=on-b": ["on-b"],
        "pods status.phase=Running,spec.nodeName=gpu-b": ["on-b"],
        "pods status.podIP!=": ["on-a", "on-b"],
        "pods spec.containers.image=dev.local/model:1": {
            "code": 400, "reason": "BadRequest", "message": "field label not supported: spec.containers.image",
            "causes": []},
        "pods metadata.labels.app=fields": {
            "code": 400, "reason": "BadRequest", "message": "field label not supported: metadata.labels.app",
            "causes": []},
        "pods spec.nodeName": {"code": 400, "reason": "BadRequest", "causes": [],
                               "message": "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"},
        "nodes metadata.name=gpu-a": ["gpu-a"],
        # A node that was never cordoned has no spec.unschedulable; it selects as "false".
        "nodes spec.unschedulable=false": ["gpu-a", "gpu-b"],
        "nodes spec.unschedulable=true": [],
        "all namespaces: this one, on gpu-b": ["on-b"],
        # Kinds without field labels of their own answer with the generic conversion's message.
        "configmaps data.model=x": {
            "code": 400, "reason": "BadRequest", "causes": [],
            "message": '"data.model" is not a known field selector: only "metadata.name", "metadata.namespace"'},
    }
    assert seen["simcluster"] == seen["real"]


# --- watch resumption ------------------------------------------------------------------------------
def _watch(kube: Backend, path: str, query: str, count: int, seconds: int = 3) -> list[tuple[str, str]]:
    """Up to `count` events of a watch (type, object name), ending after `seconds`."""
    config = kube.api_client.configuration
    response = kube.api_client.rest_client.pool_manager.request(
        "GET", f"{config.host}{path}?watch=true&timeoutSeconds={seconds}&{query}", preload_content=False,
        headers={"Accept": JSON, "Authorization": config.auth_settings()["BearerToken"]["value"]})
    events, buffer = [], b""
    try:
        for chunk in response.stream(4096):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                if event["type"] != "BOOKMARK":
                    events.append((event["type"], event["object"]["metadata"]["name"]))
                if len(events) >= count:
                    return events
        return events
    finally:
        response.release_conn()


def watch_resumption(kube: Backend) -> dict:
    """Changes made after a ConfigMap's resourceVersion, replayed in order to a watch that
    starts there; a watch from a list's resourceVersion sees only what comes after; a
    label-selected watch reports an object that stops matching as DELETED."""
    ns = kube.namespace_create("watch")
    path = f"/api/v1/namespaces/{ns}/configmaps"

    def configmap(name: str) -> client.V1ConfigMap:
        return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels={"model": "yes"}), data={"v": "1"})
    start = kube.core.create_namespaced_config_map(ns, configmap("a")).metadata.resource_version
    kube.core.create_namespaced_config_map(ns, configmap("b"))
    kube.core.patch_namespaced_config_map("a", ns, {"data": {"v": "2"}})
    kube.core.delete_namespaced_config_map("b", ns)
    observed = {"from a's resourceVersion": _watch(kube, path, f"resourceVersion={start}", 3),
                "without resourceVersion": _watch(kube, path, "", 1)}
    listed = kube.core.list_namespaced_config_map(ns).metadata.resource_version
    observed["from the list's resourceVersion, nothing new"] = _watch(kube, path, f"resourceVersion={listed}", 1, 1)
    kube.core.create_namespaced_config_map(ns, configmap("c"))
    kube.core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"model": "no"}}})
    observed["from the list's resourceVersion, selected"] = _watch(
        kube, path, f"resourceVersion={listed}&labelSelector={quote('model=yes')}", 2)
    return observed


def test_watch_resumes_from_a_resource_version(tiers):
    # A 410 for a compacted resourceVersion: test_a_watch_from_a_compacted_resource_version_gets_410_expired.
    seen = {name: watch_resumption(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "from a's resourceVersion": [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")],
        "without resourceVersion": [("ADDED", "a")],
        "from the list's resourceVersion, nothing new": [],
        "from the list's resourceVersion, selected": [("ADDED", "c"), ("DELETED", "a")],
    }
    assert seen["simcluster"] == seen["real"]


def _watch_first(kube: Backend, path: str, query: str, seconds: int = 3) -> dict | None:
    """The first event of a watch as the client reads it (type and object), or None."""
    config = kube.api_client.configuration
    response = kube.api_client.rest_client.pool_manager.request(
        "GET", f"{config.host}{path}?watch=true&timeoutSeconds={seconds}&{query}", preload_content=False,
        headers={"Accept": JSON, "Authorization": config.auth_settings()["BearerToken"]["value"]})
    buffer = b""
    try:
        for chunk in response.stream(4096):
            buffer += chunk
            if b"\n" in buffer:
                return {"status": response.status, **json.loads(buffer.split(b"\n", 1)[0])}
        return None
    finally:
        response.release_conn()


def _event(name: str, namespace: str) -> client.CoreV1Event:
    return client.CoreV1Event(metadata=client.V1ObjectMeta(name=name), reason="Test", message="m", type="Normal",
                              involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace=namespace))


def watch_after_compaction(kube: Backend) -> dict:
    """A watch resumed from a version the store still holds replays what came after; once
    the store is compacted past it (etcd's compaction, which the apiserver runs every
    5 minutes), the same watch is answered with an ERROR event carrying 410. Events,
    because kube-apiserver keeps no watch cache for them: their watches read etcd itself."""
    ns = kube.namespace_create("watch-old")
    path = f"/api/v1/namespaces/{ns}/events"
    start = kube.core.create_namespaced_event(ns, _event("e1", ns)).metadata.resource_version
    kube.core.create_namespaced_event(ns, _event("e2", ns))
    observed = {"before compaction": _watch(kube, path, f"resourceVersion={start}", 1)}
    # A write after e2, so that compacting to the newest version leaves e2's behind too.
    kube.core.create_namespaced_event(ns, _event("e3", ns))
    kube.compact()
    first = _watch_first(kube, path, f"resourceVersion={start}")
    status = first["object"] if first else {}
    observed["after compaction"] = first and (first["status"], first["type"], status.get("kind"),
                                              status.get("code"), status.get("reason"), status.get("message"))
    return observed


def test_a_watch_from_a_compacted_resource_version_gets_410_expired(tiers):
    # storage/etcd3 watcher: etcd's ErrCompacted becomes 410 Expired in an ERROR event; a
    # client (client-go's reflector) then lists afresh. (Resources with a watch cache, such
    # as ConfigMaps, keep replaying from the cache's own window after a compaction.)
    seen = {name: watch_after_compaction(kube) for name, kube in tiers.items()}
    assert seen["real"] == {
        "before compaction": [("ADDED", "e2")],
        "after compaction": (200, "ERROR", "Status", 410, "Expired",
                             "The resourceVersion for the provided watch is too old."),
    }
    sim = seen["simcluster"]
    assert sim["before compaction"] == seen["real"]["before compaction"]
    assert sim["after compaction"][:5] == seen["real"]["after compaction"][:5]
    # The one difference (simcluster's README, "not modelled"): simcluster words every 410
    # as kube-apiserver's watch cache does ("too old resource version: <asked> (<oldest>)"),
    # not as a watch read from etcd (uncached kinds, such as Events) is worded.
    assert re.fullmatch(r"too old resource version: \d+ \(\d+\)", sim["after compaction"][5])


# --- RBAC denials ---------------------------------------------------------------------------------
def rbac_denials(kube: Backend) -> dict:
    """A ServiceAccount with no rights, then with a Role that lets it read pods."""
    ns = kube.namespace_create("rbac")
    kube.core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="model"),
        spec=client.V1PodSpec(node_name="gpu-a", containers=[client.V1Container(name="model", image="dev.local/m:1")])))
    token = kube.service_account_token(ns, "nobody")
    asks = {
        "list pods": ("GET", f"/api/v1/namespaces/{ns}/pods", None),
        "get pod": ("GET", f"/api/v1/namespaces/{ns}/pods/model", None),
        "delete pod": ("DELETE", f"/api/v1/namespaces/{ns}/pods/model", None),
        "evict pod": ("POST", f"/api/v1/namespaces/{ns}/pods/model/eviction",
                      {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "model", "namespace": ns}}),
        "list nodes": ("GET", "/api/v1/nodes", None),
        "patch node": ("PATCH", "/api/v1/nodes/gpu-a", {"spec": {"unschedulable": True}}),
        "scale replicaset": ("PATCH", f"/apis/apps/v1/namespaces/{ns}/replicasets/model/scale", {"spec": {"replicas": 0}}),
        "list pods everywhere": ("GET", "/api/v1/pods", None),
    }

    def ask_all():
        seen = {}
        for what, (method, path, body) in asks.items():
            code, answer = _request(kube, method, path, body=body, token=token,
                                    content_type=MERGE_PATCH if method == "PATCH" else JSON if body else None)
            if code < 400:
                seen[what] = code
                continue
            details = {k: v for k, v in (answer.get("details") or {}).items() if k != "causes"}
            # The namespace's name differs between the runs; the message's shape is compared.
            seen[what] = _status(code, answer) | {"details": details}
            seen[what]["message"] = seen[what]["message"].replace(ns, "<ns>")
        return seen
    observed = {"no rights": ask_all()}
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_namespaced_role(ns, client.V1Role(metadata=client.V1ObjectMeta(name="read-pods"), rules=[
        client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])]))
    rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="read-pods"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-pods"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=ns)]))
    # The real authorizer reads RBAC through an informer: a grant takes effect within moments.
    kube.settle(lambda: _request(kube, "GET", f"/api/v1/namespaces/{ns}/pods", token=token)[0] == 200,
                what="the Role granted", seconds=10)
    observed["reader"] = ask_all()
    code, body = _request(kube, "GET", f"/api/v1/namespaces/{ns}/pods", token="nobody-holds-this-token")
    observed["unknown token"] = _status(code, body)
    observed["pod still there"] = kube.core.read_namespaced_pod("model", ns).metadata.deletion_timestamp is None
    return observed


def _forbidden(message: str, *, kind: str, name: str | None = None, group: str | None = None) -> dict:
    details = {"kind": kind} | ({"name": name} if name else {}) | ({"group": group} if group else {})
    return {"code": 403, "reason": "Forbidden", "message": message, "causes": [], "details": details}


def test_rbac_denials_answer_403_forbidden_with_upstream_messages(tiers):
    # plugin/pkg/auth/authorizer/rbac and the apiserver's forbidden() render the message.
    seen = {name: rbac_denials(kube) for name, kube in tiers.items()}
    user = 'User "system:serviceaccount:<ns>:nobody" cannot'
    here = 'in API group "" in the namespace "<ns>"'
    denials = {
        "list pods": _forbidden(f'pods is forbidden: {user} list resource "pods" {here}', kind="pods"),
        "get pod": _forbidden(f'pods "model" is forbidden: {user} get resource "pods" {here}', kind="pods",
                              name="model"),
        "delete pod": _forbidden(f'pods "model" is forbidden: {user} delete resource "pods" {here}', kind="pods",
                                 name="model"),
        "evict pod": _forbidden(f'pods "model" is forbidden: {user} create resource "pods/eviction" {here}',
                                kind="pods", name="model"),
        "list nodes": _forbidden(f'nodes is forbidden: {user} list resource "nodes" in API group "" at the '
                                 'cluster scope', kind="nodes"),
        "patch node": _forbidden(f'nodes "gpu-a" is forbidden: {user} patch resource "nodes" in API group "" '
                                 'at the cluster scope', kind="nodes", name="gpu-a"),
        "scale replicaset": _forbidden(
            f'replicasets.apps "model" is forbidden: {user} patch resource "replicasets/scale" in API group '
            '"apps" in the namespace "<ns>"', kind="replicasets", name="model", group="apps"),
        "list pods everywhere": _forbidden(f'pods is forbidden: {user} list resource "pods" in API group "" at '
                                           'the cluster scope', kind="pods"),
    }
    assert seen["real"] == {
        "no rights": denials,
        "reader": denials | {"list pods": 200, "get pod": 200},
        "unknown token": {"code": 401, "reason": "Unauthorized", "message": "Unauthorized", "causes": []},
        "pod still there": True,
    }
    assert seen["simcluster"] == seen["real"]
