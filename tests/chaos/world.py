"""The simulated cluster a chaos scenario runs on, and how to read it as an operator would.

Three 8-GPU nodes, two Knative model services (GPU pods) for defrag to move, and per org a
namespace with a pynode at min-scale "1" for the dormancy sweep. Knative 1.21, so the org
switch patches Revisions. Beside them, on nodes of their own so they never stand in the
defrag's way: three Deployments for the pruner (two idle, one busy) on a CPU node, and a
1-GPU A10G node holding a KServe model for the runbook (a redeploy leaves its new revision
Pending until the old one is deleted).
"""
from __future__ import annotations

import sys
from pathlib import Path

# The defrag tests' builders and reader live beside them (tests/capacity is no package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capacity"))

from defrag_builders import make_node  # noqa: E402
from defrag_cluster import Kube, knative_service  # noqa: E402

from orgs.planning import MIN_SCALE  # noqa: E402
from simcluster.generate import inference_service, node  # noqa: E402

MODEL_NS = "models"
SERVICES = (("llm-a", 2, 2), ("llm-b", 1, 4))   # (name, min-scale, GPUs per pod)
NODES = ("n1", "n2", "n3")
ORG_KINDS = ("idle-a", "idle-b", "idle-c", "busy")

PRUNE_NODE, RUNBOOK_NODE = "p1", "a1"
PRUNE_DEPLOYMENTS = (("idle-a", 3, "0"), ("idle-b", 2, "0"), ("busy", 1, "90"))   # (name, replicas, GPU %)
RUNBOOK_MODEL, RUNBOOK_PRODUCT = "m1", "NVIDIA-A10G"

__all__ = ["Kube", "MODEL_NS", "NODES", "ORG_KINDS", "PRUNE_DEPLOYMENTS", "PRUNE_NODE", "RUNBOOK_MODEL", "SERVICES",
           "org_slug", "prune_ns", "runbook_ns", "scenario_objects"]


def prune_ns(index: int) -> str:
    return f"c{index}-prune"


def runbook_ns(index: int) -> str:
    return f"c{index}-serve"


def prune_deployment(name: str, namespace: str, replicas: int) -> dict:
    """A plain Deployment pinned to the pruner's node (CPU only: the pruner goes by the GPU
    history Prometheus holds for its pods, and defrag never meets them)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"nodeSelector": {"kubernetes.io/hostname": PRUNE_NODE},
                                           "containers": [{"name": "main", "image": "model:1",
                                                           "resources": {"requests": {"cpu": "1"}}}]}}}}


def org_slug(index: int, kind: str) -> str:
    return f"c{index}-{kind}"


def scenario_objects(index: int) -> list[dict]:
    docs = [make_node(name, gpus=8) for name in NODES]
    docs.append(node(PRUNE_NODE, pool="cpu", cpu="64", memory="257000Mi"))
    docs.append(node(RUNBOOK_NODE, pool="a10g", product=RUNBOOK_PRODUCT, gpus=1))
    for ns in (prune_ns(index), runbook_ns(index)):
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    docs += [prune_deployment(name, prune_ns(index), replicas) for name, replicas, _ in PRUNE_DEPLOYMENTS]
    docs.append(inference_service(runbook_ns(index), RUNBOOK_MODEL, product=RUNBOOK_PRODUCT, gpus=1,
                                  min_replicas=1, max_replicas=1))
    docs.append({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}})
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MODEL_NS}})
    for name, min_scale, gpus in SERVICES:
        docs.append(knative_service(name, namespace=MODEL_NS, min_scale=min_scale, gpus=gpus))
    for kind in ORG_KINDS:
        slug = org_slug(index, kind)
        docs.append({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": slug, "labels": {"capacity.io/org": slug}}})
        docs.append({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                     "metadata": {"name": "pynode", "namespace": slug, "labels": {"capacity.io/component": "pynode"}},
                     "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1"}},
                                           "spec": {"containers": [{"image": "pynode:1"}]}}}})
    return docs


def pynode_min_scale(kube: Kube, namespace: str) -> str | None:
    ksvc = kube.custom.get_namespaced_custom_object("serving.knative.dev", "v1", namespace, "services", "pynode")
    return ((ksvc["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(MIN_SCALE)
