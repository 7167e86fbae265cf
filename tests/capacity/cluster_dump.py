"""A dump of a running cluster as an operator takes it for a rehearsal:
`kubectl get nodes,pods,replicasets,deployments,services.serving.knative.dev,revisions,podautoscalers,pdb
-A -o json`, listed through the official client and written as kubectl writes it (one v1 List,
each item with its apiVersion and kind)."""
from __future__ import annotations

import json
from pathlib import Path

import kubernetes.client
import kubernetes.config

# (group, version, plural, kind): the kinds of the kubectl command above, in its order.
KINDS = (
    ("", "v1", "nodes", "Node"),
    ("", "v1", "pods", "Pod"),
    ("apps", "v1", "replicasets", "ReplicaSet"),
    ("apps", "v1", "deployments", "Deployment"),
    ("serving.knative.dev", "v1", "services", "Service"),
    ("serving.knative.dev", "v1", "revisions", "Revision"),
    ("autoscaling.internal.knative.dev", "v1alpha1", "podautoscalers", "PodAutoscaler"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
)


def cluster_dump(kubeconfig_path: str, out: Path) -> Path:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig_path, client_configuration=config)
    items = []
    with kubernetes.client.ApiClient(config) as api:
        core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
        policy, custom = kubernetes.client.PolicyV1Api(api), kubernetes.client.CustomObjectsApi(api)
        lists = {"nodes": core.list_node, "pods": core.list_pod_for_all_namespaces,
                 "replicasets": apps.list_replica_set_for_all_namespaces,
                 "deployments": apps.list_deployment_for_all_namespaces,
                 "poddisruptionbudgets": policy.list_pod_disruption_budget_for_all_namespaces}
        for group, version, plural, kind in KINDS:
            if plural in lists:
                response = lists[plural](_preload_content=False)
            else:
                response = custom.list_cluster_custom_object(group, version, plural, _preload_content=False)
            api_version = f"{group}/{version}" if group else version
            items += [{"apiVersion": api_version, "kind": kind, **item}
                      for item in json.loads(response.data)["items"]]
    out.write_text(json.dumps({"apiVersion": "v1", "items": items, "kind": "List",
                               "metadata": {"resourceVersion": ""}}, indent=4))
    return out
