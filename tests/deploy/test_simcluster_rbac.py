"""The simulated cluster's bearer tokens and RBAC, seen through the official client and
the product's gateway: 401 for an unknown token, kube-apiserver's 403 Status otherwise,
namespaced vs cluster scope, subresources and wildcards, resourceNames."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import kubernetes
import pytest

from clusters import errors as kube_errors
from clusters import kube
from simcluster.kubeconfig import write_kubeconfig
from simcluster.sim import SimSettings
from simcluster.testing import running_cluster

SA = "system:serviceaccount:team:bot"


def scenario() -> list[dict]:
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": ns},
             "spec": {"containers": [{"name": "c", "image": "x"}]}} for ns, n in (("team", "a"), ("other", "b"))]
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "team"},
              "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                       "template": {"metadata": {"labels": {"app": "web"}},
                                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "bot", "namespace": "team", "annotations": {"simcluster.io/token": "bot-token"}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pods", "namespace": "team"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                   {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"], "resourceNames": ["a"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "bot-pods", "namespace": "team"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
         "subjects": [{"kind": "ServiceAccount", "name": "bot"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "scaler"},
         "rules": [{"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["get", "patch"]},
                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "scaler"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scaler"},
         "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team"}]},
        *pods, deploy,
    ]


@pytest.fixture
def cluster(tmp_path):
    settings = SimSettings(tokens={"ops-token": {"user": "ops", "groups": ["system:masters"]},
                                   "viewer-token": {"user": "viewer"}})
    with running_cluster(scenario(), settings=settings) as url:
        yield url, tmp_path


def client_for(url, tmp_path, token):
    path = tmp_path / f"kubeconfig-{token}"
    write_kubeconfig(path, str(url), token=token)
    return kubernetes.config.new_client_from_config(config_file=str(path))


def status_of(exc: kubernetes.client.ApiException) -> dict:
    return json.loads(exc.body)


def test_a_namespaced_role_grants_its_namespace_only_and_403_reads_like_kube_apiserver(cluster):
    url, tmp = cluster
    core = kubernetes.client.CoreV1Api(client_for(url, tmp, "bot-token"))
    assert "a" in [p.metadata.name for p in core.list_namespaced_pod("team").items]
    with pytest.raises(kubernetes.client.ApiException) as denied:
        core.list_namespaced_pod("other")
    body = status_of(denied.value)
    assert denied.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (f'pods is forbidden: User "{SA}" cannot list resource "pods" in API group "" '
                               f'in the namespace "other"')
    with pytest.raises(kubernetes.client.ApiException) as denied:
        core.delete_namespaced_pod("a", "team")
    assert status_of(denied.value)["message"] == (
        f'pods "a" is forbidden: User "{SA}" cannot delete resource "pods" in API group "" in the namespace "team"')
    with pytest.raises(kubernetes.client.ApiException) as denied:
        core.list_pod_for_all_namespaces()
    assert status_of(denied.value)["message"].endswith('cannot list resource "pods" in API group "" '
                                                       'at the cluster scope')


def test_resource_names_subresources_and_wildcards(cluster):
    url, tmp = cluster
    gateway = kube.KubeGateway(client_for(url, tmp, "bot-token"), retry_attempts=1)
    gateway.patch(kube.PODS, "a", {"metadata": {"labels": {"x": "1"}}}, namespace="team")   # resourceNames: [a]
    assert gateway.get_scale(kube.DEPLOYMENTS, "web", namespace="team")["spec"]["replicas"] == 1  # */scale
    gateway.set_scale(kube.DEPLOYMENTS, "web", 0, namespace="team")
    with pytest.raises(kube_errors.Forbidden, match='cannot get resource "deployments" in API group "apps"'):
        gateway.get(kube.DEPLOYMENTS, "web", namespace="team")                # the object itself: no
    with pytest.raises(kube_errors.Forbidden, match='cannot patch resource "pods/status"'):
        gateway.patch(kube.PODS, "a", {"status": {"phase": "Running"}}, namespace="team", subresource="status")
    gateway.evict("a", namespace="team")                                        # pods/eviction create
    assert [n["metadata"]["name"] for n in gateway.list(kube.NODES)] == []      # cluster scope via the group


def test_unknown_token_is_401_and_declared_users_and_masters(cluster):
    url, tmp = cluster
    with pytest.raises(kubernetes.client.ApiException) as denied:
        kubernetes.client.CoreV1Api(client_for(url, tmp, "nobody")).list_namespace()
    assert denied.value.status == 401 and status_of(denied.value)["reason"] == "Unauthorized"
    assert kubernetes.client.CoreV1Api(client_for(url, tmp, "ops-token")).list_namespace().items
    viewer = client_for(url, tmp, "viewer-token")
    with pytest.raises(kubernetes.client.ApiException) as denied:
        kubernetes.client.CoreV1Api(viewer).list_namespace()
    assert 'User "viewer" cannot list resource "namespaces"' in status_of(denied.value)["message"]
    # Discovery and /version: any authenticated user.
    assert kubernetes.client.VersionApi(viewer).get_code().git_version
    assert kubernetes.client.CoreApi(viewer).get_api_versions().versions == ["v1"]


def test_the_written_kubeconfig_is_admin_and_control_endpoints_stay_open(tmp_path):
    with running_cluster(scenario(), kubeconfig_out=tmp_path / "admin") as url:
        admin = kubernetes.config.new_client_from_config(config_file=str(tmp_path / "admin"))
        assert kubernetes.client.CoreV1Api(admin).list_pod_for_all_namespaces().items
        with urllib.request.urlopen(f"{url}/metrics") as response:
            assert response.status == 200
        request = urllib.request.Request(f"{url}/api/v1/pods", headers={"Authorization": "Basic eDp5"})
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(request)
        assert denied.value.code == 401


@pytest.mark.parametrize("mode,code", [("admin", 200), ("rbac", 403), ("reject", 401)])
def test_requests_without_credentials_follow_anonymous_access(mode, code):
    with running_cluster(scenario(), settings=SimSettings(anonymous_access=mode)) as url:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/namespaces") as response:
                got = response.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        assert got == code
