"""PATCH in the three content types, through the official client and raw requests."""
from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client import ApiException

from simcluster_helpers import pod, status_of

JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def raw_patch(kube, path: str, body, content_type: str) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = urllib3.request("PATCH", kube.url + path, body=data, headers={"Content-Type": content_type})
    return response.status, json.loads(response.data)


POD = "/api/v1/namespaces/team-a/pods/p1"


@pytest.fixture
def p1(kube):
    body = pod("p1", labels={"app": "llm", "tier": "gpu"})
    body["spec"]["containers"] = [
        {"name": "main", "image": "vllm:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "sidecar", "image": "envoy:1"},
    ]
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs-a", "uid": "uid-a", "controller": True},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "uid-b"},
    ]
    body["metadata"]["finalizers"] = ["example.com/one"]
    return kube.core.create_namespaced_pod("team-a", body)


# ---- JSON patch (RFC 6902) --------------------------------------------------------------
def test_json_patch_through_the_client(kube, p1):
    patched = kube.core.patch_namespaced_pod("p1", "team-a", [
        {"op": "add", "path": "/metadata/labels/new", "value": "yes"},
        {"op": "remove", "path": "/metadata/labels/tier"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "envoy:2"},
    ])
    assert patched.metadata.labels == {"app": "llm", "new": "yes"}
    assert patched.spec.containers[1].image == "envoy:2"


def test_json_patch_test_op_guards_the_write(kube, p1):
    current = p1.metadata.resource_version
    patched = kube.core.patch_namespaced_pod("p1", "team-a", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": current},
        {"op": "add", "path": "/metadata/labels/ok", "value": "1"}])
    assert patched.metadata.labels["ok"] == "1"


def test_a_failed_json_patch_test_op_is_422_and_changes_nothing(kube, p1):
    # patch.go answers a patch that does not apply with 422 (NewGenericServerResponse).
    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("p1", "team-a", [
            {"op": "test", "path": "/metadata/labels/app", "value": "web"},
            {"op": "add", "path": "/metadata/labels/bad", "value": "1"}])
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    assert "bad" not in kube.core.read_namespaced_pod("p1", "team-a").metadata.labels


def test_json_patch_on_a_missing_path_is_422(kube, p1):
    status, body = raw_patch(kube, POD, [{"op": "replace", "path": "/spec/nothing/here", "value": 1}], JSON_PATCH)
    assert (status, body["reason"]) == (422, "Invalid")


@pytest.mark.parametrize("body", [b"{not json", b'{"op": "add"}', b'["add"]'])
def test_malformed_json_patch_is_400(kube, p1, body):
    status, answer = raw_patch(kube, POD, body, JSON_PATCH)
    assert (status, answer["reason"]) == (400, "BadRequest")


def test_json_patch_with_a_stale_resource_version_is_409(kube, p1):
    kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"labels": {"bump": "1"}}})
    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("p1", "team-a", [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": p1.metadata.resource_version},
            {"op": "add", "path": "/metadata/labels/late", "value": "1"}])
    assert (caught.value.status, status_of(caught.value)["reason"]) == (409, "Conflict")


# ---- merge patch (RFC 7386) -----------------------------------------------------------------
def test_merge_patch_merges_maps_replaces_lists_and_null_deletes(kube, p1):
    status, patched = raw_patch(kube, POD, {
        "metadata": {"labels": {"tier": None, "new": "x"}},
        "spec": {"containers": [{"name": "only", "image": "one:1"}]}}, MERGE)
    assert status == 200
    assert patched["metadata"]["labels"] == {"app": "llm", "new": "x"}
    assert [c["name"] for c in patched["spec"]["containers"]] == ["only"]


def test_merge_patch_through_the_custom_objects_api(kube):
    kube.custom.create_namespaced_custom_object("serving.knative.dev", "v1", "team-a", "services", {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "pynode"},
        "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "1"}},
                              "spec": {"containers": [{"image": "pynode:1"}]}}}})
    patched = kube.custom.patch_namespaced_custom_object(
        "serving.knative.dev", "v1", "team-a", "services", "pynode",
        {"spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "0"}}}}})
    annotations = patched["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"autoscaling.knative.dev/min-scale": "0"}


def test_a_merge_patch_must_be_an_object(kube, p1):
    status, answer = raw_patch(kube, POD, [1, 2], MERGE)
    assert status == 400


# ---- strategic merge patch ---------------------------------------------------------------------
def test_strategic_merge_containers_by_name_and_env_by_name(kube, p1):
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"spec": {"containers": [
        {"name": "main", "image": "vllm:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]}]}})
    main, sidecar = patched.spec.containers
    assert (main.name, main.image, sidecar.name, sidecar.image) == ("main", "vllm:2", "sidecar", "envoy:1")
    assert [(e.name, e.value) for e in main.env] == [("A", "1"), ("B", "20"), ("C", "3")]


def test_strategic_merge_owner_references_by_uid_and_patch_delete(kube, p1):
    # Orphaning a pod: remove its controller's reference by uid, keep the other one.
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"ownerReferences": [
        {"uid": "uid-a", "$patch": "delete"}]}})
    assert [ref.uid for ref in patched.metadata.owner_references] == ["uid-b"]


def test_strategic_merge_replace_directive_on_a_list(kube, p1):
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"ownerReferences": [
        {"$patch": "replace"},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "uid-c"}]}})
    assert [ref.uid for ref in patched.metadata.owner_references] == ["uid-c"]


def test_strategic_merge_finalizers_are_a_set(kube, p1):
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"finalizers": ["example.com/two"]}})
    # The patch's items come first, as kube-apiserver 1.32 orders them (normalizeElementOrder).
    assert patched.metadata.finalizers == ["example.com/two", "example.com/one"]
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {
        "$deleteFromPrimitiveList/finalizers": ["example.com/one"]}})
    assert patched.metadata.finalizers == ["example.com/two"]


def test_strategic_merge_status_conditions_by_type(kube, p1):
    kube.core.patch_namespaced_pod_status("p1", "team-a", {"status": {"conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}})
    patched = kube.core.patch_namespaced_pod_status("p1", "team-a", {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert {c.type: c.status for c in patched.status.conditions} == {"PodScheduled": "True", "Ready": "True"}


def test_strategic_merge_delete_directive_on_a_map(kube, p1):
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"labels": {"$patch": "delete"}}})
    assert not patched.metadata.labels


def test_strategic_merge_list_item_without_its_merge_key_is_400(kube, p1):
    status, answer = raw_patch(kube, POD, {"spec": {"containers": [{"image": "nameless"}]}}, STRATEGIC)
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert "merge key" in answer["message"]


def test_strategic_merge_is_refused_on_custom_resources(kube):
    kube.custom.create_namespaced_custom_object("kubeflow.org", "v1", "team-a", "notebooks", {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": "nb"},
        "spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "jupyter"}]}}}})
    status, answer = raw_patch(kube, "/apis/kubeflow.org/v1/namespaces/team-a/notebooks/nb",
                               {"metadata": {"labels": {"a": "b"}}}, STRATEGIC)
    assert (status, answer["reason"]) == (415, "UnsupportedMediaType")


def test_an_unknown_patch_content_type_is_415(kube, p1):
    status, answer = raw_patch(kube, POD, {"metadata": {}}, "application/json")
    assert (status, answer["reason"]) == (415, "UnsupportedMediaType")
    # The route refuses it before any patch handler, in go-restful's words (as kube-apiserver 1.32).
    assert answer["message"] == "415: Unsupported Media Type"


def test_patch_on_a_collection_is_405(kube, p1):
    status, answer = raw_patch(kube, "/api/v1/namespaces/team-a/pods", {"metadata": {}}, MERGE)
    assert (status, answer["reason"]) == (405, "MethodNotAllowed")


def test_patch_of_a_missing_object_is_404(kube):
    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("ghost", "team-a", {"metadata": {"labels": {"a": "b"}}})
    assert caught.value.status == 404


def test_patch_dry_run_changes_nothing(kube, p1):
    answered = kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"labels": {"dry": "1"}}},
                                              dry_run="All")
    assert answered.metadata.labels["dry"] == "1"
    assert "dry" not in kube.core.read_namespaced_pod("p1", "team-a").metadata.labels


def test_a_patch_of_the_main_resource_leaves_status_alone(kube, p1):
    kube.core.patch_namespaced_pod_status("p1", "team-a", {"status": {"phase": "Running"}})
    patched = kube.core.patch_namespaced_pod("p1", "team-a", {"status": {"phase": "Failed"},
                                                               "metadata": {"labels": {"x": "y"}}})
    assert (patched.status.phase, patched.metadata.labels["x"]) == ("Running", "y")


def test_a_status_patch_leaves_spec_and_metadata_alone(kube, p1):
    patched = kube.core.patch_namespaced_pod_status("p1", "team-a", {
        "metadata": {"labels": {"sneaky": "1"}}, "status": {"phase": "Running"}})
    assert patched.status.phase == "Running"
    assert "sneaky" not in patched.metadata.labels


def test_a_patch_cannot_rename_the_object(kube, p1):
    status, answer = raw_patch(kube, POD, {"metadata": {"name": "p2"}}, MERGE)
    assert status == 400
    assert "does not match the name on the URL" in answer["message"]
