"""Writes `demo.yaml` (committed): `python -m simcluster.scenarios.build_demo`.

Two GPU pools (8 x 8 H100 80GB, 4 x 1 A10G) and a CPU pool, 30 orgs each with a
pynode and one to four models. Sized so everything fits whatever order the scheduler
takes the pods in (every model needs 1 GPU, three need 2, and at most 52 of the 64
H100 GPUs are asked for at start). Models with `minReplicas: 0` and no traffic scale
to zero after the KPA's window (~90 s), which leaves the H100 nodes holding one or
two small pods each: the fragmentation the defrag feature is for. A forgotten
Notebook and a forgotten Deployment hold GPUs at 0% utilization for the pruner.

Its Knative is configured as the README recommends: `knative-serving/config-autoscaler`
allows a zero initial scale, so an org's dormancy switch (a new pynode Revision) starts
no pod. `demo-initial-scale-1.yaml`, the same cluster with that ConfigMap empty (Knative's
defaults), shows why: there each switch first starts a pynode pod for nothing
(`DEMO_SCENARIO=simcluster/scenarios/demo-initial-scale-1.yaml make demo`).
"""
from __future__ import annotations

import random
from pathlib import Path

from simcluster.generate import (PRODUCT_LABEL, UTILIZATION_ANNOTATION, dump, inference_service,
                                 namespace, node, pynode, resources)

H100 = "NVIDIA-H100-80GB-HBM3"
A10G = "NVIDIA-A10G"
ORGS = ("acme", "globex", "initech", "umbrella", "hooli", "piedpiper", "stark", "wayne",
        "wonka", "tyrell", "cyberdyne", "soylent", "aperture", "blackmesa", "gringotts",
        "oscorp", "vandelay", "dunder", "prestige", "monarch", "nakatomi", "sterling",
        "bluth", "krusty", "duff", "genco", "zorg", "weyland", "massive", "virtucon")
MODEL_NAMES = ("llama-3-8b", "mistral-7b", "qwen2-7b", "gemma-7b", "phi-3", "whisper",
               "bge-embed", "sdxl", "codellama-13b", "reranker")


KNATIVE_VERSION = "1.15"
# The scenario files written: name -> whether config-autoscaler allows a zero initial scale.
SCENARIOS = {"demo.yaml": True, "demo-initial-scale-1.yaml": False}


def knative_install(*, zero_initial_scale: bool) -> list[dict]:
    """The knative-serving namespace as the simulated install makes it (its version label
    is what the product reads), and its config-autoscaler: with `allow-zero-initial-scale`
    as the README recommends, or empty (every Knative default: a new Revision starts 1 pod)."""
    data = {"allow-zero-initial-scale": "true"} if zero_initial_scale else {}
    return [{"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "knative-serving",
                          "labels": {"app.kubernetes.io/name": "knative-serving",
                                     "app.kubernetes.io/version": f"{KNATIVE_VERSION}.0",
                                     "kubernetes.io/metadata.name": "knative-serving"}}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "config-autoscaler", "namespace": "knative-serving",
                          "labels": {"app.kubernetes.io/name": "knative-serving",
                                     "app.kubernetes.io/component": "autoscaler"}},
             "data": data}]


def build(seed: int = 7, *, zero_initial_scale: bool = True) -> list[dict]:
    rng = random.Random(seed)
    docs: list[dict] = [{"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation",
                         "metadata": {"name": "demo"},
                         "spec": {"placement": "spread", "startup_seconds": 5.0,
                                  "knative_version": KNATIVE_VERSION, "kserve_version": "0.15"}}]
    docs += knative_install(zero_initial_scale=zero_initial_scale)
    docs += [node(f"gpu-h100-{i:02d}", pool="h100", product=H100, gpus=8, cpu="192",
                  memory="2063937Mi", instance_type="p5.48xlarge", zone=f"us-east-1{'ab'[i % 2]}")
             for i in range(8)]
    docs += [node(f"gpu-a10g-{i:02d}", pool="a10g", product=A10G, gpus=1, cpu="32",
                  memory="127532Mi", instance_type="g5.8xlarge") for i in range(4)]
    docs += [node(f"cpu-{i:02d}", pool="cpu", cpu="64", memory="257000Mi",
                  instance_type="m6i.16xlarge") for i in range(4)]

    # Models per org: 1-4, 49 in all; three A10G models, three 2-GPU H100 models.
    counts = [1] * len(ORGS)
    while sum(counts) < 49:
        i = rng.randrange(len(ORGS))
        if counts[i] < 4:
            counts[i] += 1
    a10g_left, two_gpu_left = 3, 3
    for index, (org, count) in enumerate(zip(ORGS, counts)):
        ns = f"org-{org}"
        dormant = index % 6 == 5          # every sixth org is dormant: pynode may scale to zero
        docs.append(namespace(ns, org=org))
        docs.append(pynode(ns, min_scale=0 if dormant else 1))
        for m in range(count):
            name = MODEL_NAMES[(index + m) % len(MODEL_NAMES)]
            if a10g_left and index % 10 == 3 and m == 0:
                a10g_left -= 1
                docs.append(inference_service(ns, name, product=A10G, gpus=1, min_replicas=1,
                                              max_replicas=1, utilization="40", fmt="sklearn"))
                continue
            gpus = 1
            if two_gpu_left and index % 9 == 1 and m == 0:
                two_gpu_left -= 1
                gpus = 2
            # Half the active orgs keep their first model warm; the rest may go to zero.
            busy = not dormant and m == 0 and index % 2 == 0
            docs.append(inference_service(
                ns, name, product=H100, gpus=gpus,
                min_replicas=1 if busy else 0, max_replicas=4,
                utilization=str(rng.choice((45, 60, 75, 90))) if busy else None))

    # Forgotten GPU holders at 0% utilization: the pruner's targets.
    docs.append({"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                 "metadata": {"name": "scratch-notebook", "namespace": "org-acme"},
                 "spec": {"template": {
                     "metadata": {"annotations": {UTILIZATION_ANNOTATION: "0"}},
                     "spec": {"nodeSelector": {PRODUCT_LABEL: H100},
                              "containers": [{"name": "scratch-notebook",
                                              "image": "kubeflownotebookswg/jupyter-pytorch-cuda:v1.9.0",
                                              "resources": resources(cpu="4", memory="32Gi", gpus=1)}]}}}})
    docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "batch-embedder", "namespace": "org-globex",
                              "labels": {"app": "batch-embedder"}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "batch-embedder"}},
                          "template": {"metadata": {"labels": {"app": "batch-embedder"},
                                                    "annotations": {UTILIZATION_ANNOTATION: "0,0"}},
                                       "spec": {"nodeSelector": {PRODUCT_LABEL: H100},
                                                "containers": [{"name": "embedder",
                                                                "image": "registry.example.com/embedder:2",
                                                                "resources": resources(cpu="8", memory="64Gi",
                                                                                       gpus=2)}]}}}})
    return docs


def main() -> None:
    for name, zero_initial_scale in SCENARIOS.items():
        target = Path(__file__).with_name(name)
        with target.open("w", encoding="utf-8") as out:
            out.write("# Generated by simcluster/scenarios/build_demo.py; edit that, then re-run it.\n")
            dump(build(zero_initial_scale=zero_initial_scale), out)
        print(target)


if __name__ == "__main__":
    main()
