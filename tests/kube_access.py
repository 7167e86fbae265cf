"""Clusters the product reaches with too little access, for the tests of what a refusal does.

`cluster_denied` adds, to a running simulated cluster, a ServiceAccount that no role is
bound to, and registers a `Cluster` row whose kubeconfig carries its token: every API
request of the product is then answered 403 Forbidden by RBAC, as on a real cluster whose
binding was removed. `cluster_read_only` binds it to a role that may read everything and
write nothing. The simulated cluster remembers each request it denied."""
from __future__ import annotations

import kubernetes

from clusters.models import Cluster
from simcluster.kubeconfig import write_kubeconfig

NAMESPACE = "gpu-capacity"
TOKEN = "token-of-an-unbound-service-account"


def cluster_denied(handle, tmp_path, *, name: str = "denied") -> Cluster:
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    try:
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        core.create_namespaced_service_account(NAMESPACE, {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "unbound", "namespace": NAMESPACE, "annotations": {"simcluster.io/token": TOKEN}}})
    finally:
        api.close()
    kubeconfig = write_kubeconfig(tmp_path / f"kubeconfig-{name}", handle.url, token=TOKEN)
    return Cluster.objects.create(name=name, kubeconfig_path=str(kubeconfig))


def cluster_read_only(handle, tmp_path, *, name: str = "read-only") -> Cluster:
    cluster = cluster_denied(handle, tmp_path, name=name)
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    try:
        rbac = kubernetes.client.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "read-only"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]})
        rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "read-only"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-only"},
            "subjects": [{"kind": "ServiceAccount", "name": "unbound", "namespace": NAMESPACE}]})
    finally:
        api.close()
    return cluster


def denials(handle) -> list:
    """The requests the simulated cluster refused the unbound ServiceAccount (authorizer attributes)."""
    user = f"system:serviceaccount:{NAMESPACE}:unbound"
    return [d.attributes for d in handle.server.app.auth.denials if d.user == user]
