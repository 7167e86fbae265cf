"""The simulated cluster a chaos scenario runs on, and how to read it as an operator would.

Three 8-GPU nodes, two Knative model services (GPU pods) for defrag to move, and per org a
namespace with a pynode at min-scale "1" for the dormancy sweep. Knative 1.21, so the org
switch patches Revisions.
"""
from __future__ import annotations

import sys
from pathlib import Path

# The defrag tests' builders and reader live beside them (tests/capacity is no package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capacity"))

from defrag_builders import make_node  # noqa: E402
from defrag_cluster import Kube, knative_service  # noqa: E402

from orgs.planning import MIN_SCALE  # noqa: E402

MODEL_NS = "models"
SERVICES = (("llm-a", 2, 2), ("llm-b", 1, 4))   # (name, min-scale, GPUs per pod)
NODES = ("n1", "n2", "n3")
ORG_KINDS = ("idle-a", "idle-b", "idle-c", "busy")

__all__ = ["Kube", "MODEL_NS", "NODES", "ORG_KINDS", "SERVICES", "org_slug", "scenario_objects"]


def org_slug(index: int, kind: str) -> str:
    return f"c{index}-{kind}"


def scenario_objects(index: int) -> list[dict]:
    docs = [make_node(name, gpus=8) for name in NODES]
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
