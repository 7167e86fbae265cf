"""`kubectl apply` as operators use it on the demo cluster: client-side (OpenAPI v3 for
validation, the last-applied-configuration three-way merge) and server-side (field
ownership in managedFields, 409 on another manager's field, --force-conflicts), and
server-side apply from the official Python client."""
from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException

from simcluster_helpers import status_of

NS = "team-a"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
APPLY = "application/apply-patch+yaml"


def deployment_yaml(*, replicas: int, labels: str = "app: web, tier: gpu") -> str:
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {NS}
  labels: {{{labels}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers: [{{name: main, image: "vllm:1"}}]
"""


def apply(kube, manifest: str, *flags: str, check: bool = True):
    return kube.kubectl("apply", *flags, "-f", "-", input=manifest, check=check)


def owners(obj) -> dict[tuple[str, str], dict]:
    return {(e.manager, e.operation): e.fields_v1 for e in obj.metadata.managed_fields or ()}


# ---- OpenAPI -------------------------------------------------------------------------------
def test_openapi_v3_lists_every_served_group_version_and_describes_its_kinds(kube):
    root = json.loads(kube.kubectl("get", "--raw", "/openapi/v3").stdout)["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/policy/v1", "apis/serving.knative.dev/v1",
            "apis/serving.kserve.io/v1beta1", "apis/kubeflow.org/v1",
            "apis/workload.serving.volcano.sh/v1alpha1"} <= set(root)
    document = json.loads(kube.kubectl("get", "--raw", root["apis/apps/v1"]["serverRelativeURL"]).stdout)
    deployment = document["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"]
    assert deployment["x-kubernetes-group-version-kind"] == [{"group": "apps", "version": "v1", "kind": "Deployment"}]
    patch = document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert APPLY in patch["requestBody"]["content"]


# ---- client-side apply ---------------------------------------------------------------------
def test_kubectl_apply_creates_updates_and_is_idempotent(kube):
    assert "deployment.apps/web created" in apply(kube, deployment_yaml(replicas=2)).stdout
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.spec.replicas == 2
    assert json.loads(dep.metadata.annotations[LAST_APPLIED])["spec"]["replicas"] == 2

    # Someone else labels it meanwhile; the manifest drops a label it had set.
    kube.apps.patch_namespaced_deployment("web", NS, {"metadata": {"labels": {"owner": "ops"}}})
    result = apply(kube, deployment_yaml(replicas=3, labels="app: web"))
    assert "deployment.apps/web configured" in result.stdout
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.spec.replicas == 3
    # Three-way merge: the label the manifest dropped goes, the one it never had stays.
    assert dep.metadata.labels == {"app": "web", "owner": "ops"}

    assert "deployment.apps/web unchanged" in apply(kube, deployment_yaml(replicas=3, labels="app: web")).stdout
    diff = kube.kubectl("diff", "-f", "-", input=deployment_yaml(replicas=3, labels="app: web"), check=False)
    assert (diff.returncode, diff.stdout) == (0, "")
    changed = kube.kubectl("diff", "-f", "-", input=deployment_yaml(replicas=5, labels="app: web"), check=False)
    assert changed.returncode == 1 and "+  replicas: 5" in changed.stdout
    assert kube.apps.read_namespaced_deployment("web", NS).spec.replicas == 3   # diff changed nothing


def test_kubectl_apply_of_a_knative_service_merges_through_a_json_merge_patch(kube):
    manifest = """apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: pynode, namespace: team-a}
spec:
  template:
    metadata: {annotations: {autoscaling.knative.dev/min-scale: "%s"}}
    spec: {containers: [{image: "registry.example.com/pynode:1"}]}
"""
    assert "service.serving.knative.dev/pynode created" in apply(kube, manifest % "1").stdout
    assert "service.serving.knative.dev/pynode configured" in apply(kube, manifest % "0").stdout
    ksvc = kube.custom.get_namespaced_custom_object("serving.knative.dev", "v1", NS, "services", "pynode")
    assert ksvc["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"


# ---- server-side apply ---------------------------------------------------------------------
def test_kubectl_server_side_apply_owns_its_fields_and_a_conflict_needs_force(kube):
    assert "deployment.apps/web serverside-applied" in apply(kube, deployment_yaml(replicas=2), "--server-side").stdout
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.spec.replicas == 2
    applied = owners(dep)[("kubectl", "Apply")]
    assert applied["f:spec"]["f:replicas"] == {} and "f:tier" in applied["f:metadata"]["f:labels"]

    # The capacity controller scales it: it now owns spec.replicas.
    kube.apps.patch_namespaced_deployment("web", NS, {"spec": {"replicas": 1}}, field_manager="capacity")
    assert owners(kube.apps.read_namespaced_deployment("web", NS))[("capacity", "Update")] == \
        {"f:spec": {"f:replicas": {}}}

    # Re-applying the same replicas would take the field back: refused, nothing changes.
    refused = apply(kube, deployment_yaml(replicas=2), "--server-side", check=False)
    assert refused.returncode == 1
    assert 'conflict with "capacity"' in refused.stderr and ".spec.replicas" in refused.stderr
    assert kube.apps.read_namespaced_deployment("web", NS).spec.replicas == 1

    # Applying what is already there is no conflict: both own it.
    assert apply(kube, deployment_yaml(replicas=1), "--server-side").returncode == 0

    # `kubectl scale` writes the scale subresource: an owner of spec.replicas too.
    kube.kubectl("scale", "-n", NS, "deployment/web", "--replicas=2")
    refused = apply(kube, deployment_yaml(replicas=4), "--server-side", check=False)
    assert refused.returncode == 1
    assert 'conflict with "kubectl" with subresource "scale"' in refused.stderr

    forced = apply(kube, deployment_yaml(replicas=4), "--server-side", "--force-conflicts")
    assert "serverside-applied" in forced.stdout
    dep = kube.apps.read_namespaced_deployment("web", NS)
    assert dep.spec.replicas == 4
    assert ("capacity", "Update") not in owners(dep)   # they lost their only field
    assert [e.subresource for e in dep.metadata.managed_fields] == [None]


def test_python_client_server_side_apply_creates_merges_and_removes_what_it_dropped(kube):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": NS,
                                                             "labels": {"app": "web", "stage": "canary"}},
            "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}}
    kube.core.patch_namespaced_pod("p1", NS, body, field_manager="deployer", _content_type=APPLY)
    # Another manager's label is merged in, not replaced, by the next apply.
    kube.core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"team": "a"}}}, field_manager="labeller")
    body["metadata"]["labels"] = {"app": "web"}
    body["metadata"]["annotations"] = {"note": "applied"}
    pod = kube.core.patch_namespaced_pod("p1", NS, body, field_manager="deployer", _content_type=APPLY)
    assert pod.metadata.labels == {"app": "web", "team": "a"}      # "stage" was only the deployer's
    assert pod.metadata.annotations == {"note": "applied"}
    assert pod.spec.restart_policy == "Always"                      # defaults are still filled in
    assert set(owners(pod)) == {("deployer", "Apply"), ("labeller", "Update")}

    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("p1", NS, {"apiVersion": "v1", "kind": "Pod",
                                                  "metadata": {"name": "p1", "labels": {"team": "b"}}},
                                       field_manager="deployer", _content_type=APPLY)
    status = status_of(caught.value)
    assert (status["code"], status["reason"]) == (409, "Conflict")
    assert status["details"]["causes"] == [{"reason": "FieldManagerConflict", "field": ".metadata.labels.team",
                                            "message": status["details"]["causes"][0]["message"]}]
    assert status["details"]["causes"][0]["message"].startswith('conflict with "labeller" using v1')


def test_server_side_apply_without_a_field_manager_is_400_and_changes_nothing(kube):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2", "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}}
    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("p2", NS, body, _content_type=APPLY)
    status = status_of(caught.value)
    assert status["code"] == 400 and "fieldManager" in status["message"]
    with pytest.raises(ApiException) as missing:
        kube.core.read_namespaced_pod("p2", NS)
    assert missing.value.status == 404
