"""Small builders of Kubernetes objects for the defrag tests (plain dicts, as the API serves them)."""
from __future__ import annotations

import itertools

_uids = itertools.count(1)


def make_node(name: str, *, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3", pool: str = "h100",
              unschedulable: bool = False, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}",
                     "labels": {"nvidia.com/gpu.product": product, "karpenter.sh/nodepool": pool,
                                "kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"},
                   "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def make_pod(name: str, *, namespace: str = "org-a", node: str | None = "n1", gpus: int = 1,
             owner: tuple[str, str] | None = None, labels: dict | None = None, annotations: dict | None = None,
             phase: str = "Running", uid: str | None = None) -> dict:
    owners = []
    if owner:
        kind, owner_name = owner
        owners = [{"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": f"uid-{owner_name}",
                   "controller": True, "blockOwnerDeletion": True}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"pod-{next(_uids)}",
                     "labels": dict(labels or {}), "annotations": dict(annotations or {}),
                     "ownerReferences": owners},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "model:1",
                                                   "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                                 "requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def make_model_pod(name: str, *, revision: str, namespace: str = "org-a", node: str | None = "n1", gpus: int = 1,
                   template_hash: str = "547cc9b97f", **kwargs) -> dict:
    labels = {"serving.knative.dev/revision": revision, "serving.knative.dev/service": revision.rsplit("-", 1)[0],
              "pod-template-hash": template_hash}
    labels.update(kwargs.pop("labels", {}) or {})
    return make_pod(name, namespace=namespace, node=node, gpus=gpus,
                    owner=("ReplicaSet", f"{revision}-deployment-{template_hash}"), labels=labels, **kwargs)
