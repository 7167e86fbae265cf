"""Scenario generator for large simulated clusters, and the manifest builders the demo
scenario shares.

    python -m simcluster generate --nodes 1000 --pods 10000 [--gpu-fraction 0.8] [--seed N]
                                  [--out FILE(.yaml|.json)] [--format yaml|json]

Pods are written already bound and Running (nodeName, phase, Ready, GPU indices), each
owned by a ReplicaSet whose uid the file fixes, so the cluster starts without
scheduling or starting anything: loading 10,000 pods is a parse and an insert, and the
ReplicaSet controller finds its pods already there and keeps them.
"""
from __future__ import annotations

import argparse
import random
import sys
import uuid
from datetime import datetime, timedelta, timezone

import orjson
import yaml

PRODUCT_LABEL = "nvidia.com/gpu.product"
POOL_LABEL = "capacity.io/pool"
ORG_LABEL = "capacity.io/org"
GPU_INDICES_ANNOTATION = "simcluster.io/gpu-indices"
UTILIZATION_ANNOTATION = "simcluster.io/gpu-utilization"

# name, product, GPUs per node, cpu, memory, instance type, share of the GPU nodes
GPU_POOLS = (
    ("h100", "NVIDIA-H100-80GB-HBM3", 8, "192", "2063937Mi", "p5.48xlarge", 0.6),
    ("a100", "NVIDIA-A100-SXM4-80GB", 8, "96", "1154287Mi", "p4de.24xlarge", 0.2),
    ("a10g", "NVIDIA-A10G", 1, "32", "127532Mi", "g5.8xlarge", 0.2),
)


# ---- manifest builders ---------------------------------------------------------------
def node(name: str, *, pool: str, product: str | None = None, gpus: int = 0, cpu: str = "32",
         memory: str = "127532Mi", instance_type: str = "m6i.8xlarge", zone: str = "us-east-1a",
         created: str | None = None) -> dict:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/zone": zone,
              POOL_LABEL: pool}
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus:
        labels.update({PRODUCT_LABEL: product, "nvidia.com/gpu.count": str(gpus),
                       "nvidia.com/gpu.present": "true"})
        capacity["nvidia.com/gpu"] = str(gpus)
    meta = {"name": name, "labels": labels}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {},
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "nodeInfo": {"kubeletVersion": "v1.31.4", "containerRuntimeVersion": "containerd://1.7.22",
                                    "osImage": "Amazon Linux 2023", "architecture": "amd64"},
                       "addresses": [{"type": "Hostname", "address": name}]}}


def namespace(name: str, *, org: str | None = None) -> dict:
    labels = {"kubernetes.io/metadata.name": name}
    if org:
        labels[ORG_LABEL] = org
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def resources(*, cpu: str, memory: str, gpus: int = 0) -> dict:
    limits = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(limits), "limits": limits}


def pynode(ns: str, *, min_scale: int = 1) -> dict:
    """An org's pynode: a CPU-only Knative Service on the CPU pool."""
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": "pynode", "namespace": ns,
                         "labels": {"capacity.io/component": "pynode"}},
            "spec": {"template": {
                "metadata": {"labels": {"capacity.io/component": "pynode"},
                             "annotations": {"autoscaling.knative.dev/min-scale": str(min_scale),
                                             "autoscaling.knative.dev/target": "50"}},
                "spec": {"containerConcurrency": 0,
                         "nodeSelector": {POOL_LABEL: "cpu"},
                         "containers": [{"name": "user-container", "image": "registry.example.com/pynode:3.12",
                                         "ports": [{"containerPort": 8080}],
                                         "resources": resources(cpu="500m", memory="1Gi")}]}}}}


def inference_service(ns: str, name: str, *, product: str, gpus: int = 1, min_replicas: int = 1,
                      max_replicas: int = 3, utilization: str | None = None, fmt: str = "vllm",
                      mode: str | None = None) -> dict:
    annotations = {}
    if utilization is not None:
        annotations[UTILIZATION_ANNOTATION] = utilization
    if mode:
        annotations["serving.kserve.io/deploymentMode"] = mode
    meta = {"name": name, "namespace": ns, "labels": {"capacity.io/component": "model"}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": meta,
            "spec": {"predictor": {
                "minReplicas": min_replicas, "maxReplicas": max_replicas, "scaleTarget": 4,
                "nodeSelector": {PRODUCT_LABEL: product},
                "model": {"modelFormat": {"name": fmt}, "storageUri": f"s3://models/{ns}/{name}",
                          "resources": resources(cpu="8", memory="64Gi", gpus=gpus)}}}}


# ---- the large-cluster generator ------------------------------------------------------
def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# GPUs per pod of a generated GPU workload, drawn uniformly: mostly one GPU, some whole nodes.
GPU_SIZES = (1, 1, 1, 1, 2, 8)


def generate(*, nodes: int, pods: int, gpu_fraction: float = 0.8, seed: int = 0) -> list[dict]:
    """Documents for a cluster of `nodes` nodes and `pods` running pods."""
    if nodes < 1 or pods < 0:
        raise ValueError("--nodes must be at least 1 and --pods not negative")
    if not 0.0 <= gpu_fraction <= 1.0:
        raise ValueError(f"--gpu-fraction must be between 0 and 1, got {gpu_fraction}")
    rng = random.Random(seed)
    born = datetime(2026, 1, 1, tzinfo=timezone.utc)
    docs: list[dict] = [{"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation",
                         "metadata": {"name": f"generated-{nodes}-{pods}"},
                         "spec": {"placement": "spread"}}]

    # Nodes: GPU pools by share, the rest CPU. Track free capacity to place pods.
    gpu_nodes = round(nodes * gpu_fraction)
    free: list[list] = []   # [name, free gpus, next gpu index, free millicpu, pods]
    pool_sizes = [round(gpu_nodes * share) for *_, share in GPU_POOLS]
    pool_sizes[0] += gpu_nodes - sum(pool_sizes)
    count = 0
    for (pool, product, per_node, cpu, memory, itype, _), size in zip(GPU_POOLS, pool_sizes):
        for _ in range(size):
            name = f"gpu-{pool}-{count:05d}"
            docs.append(node(name, pool=pool, product=product, gpus=per_node, cpu=cpu, memory=memory,
                             instance_type=itype, zone=f"us-east-1{'abc'[count % 3]}",
                             created=_rfc3339(born)))
            free.append([name, per_node, 0, int(cpu) * 1000, 0, product])
            count += 1
    cpu_nodes = []
    for _ in range(nodes - gpu_nodes):
        name = f"cpu-{count:05d}"
        docs.append(node(name, pool="cpu", cpu="64", memory="257000Mi", instance_type="m6i.16xlarge",
                         zone=f"us-east-1{'abc'[count % 3]}", created=_rfc3339(born)))
        cpu_nodes.append([name, 0, 0, 64000, 0, None])
        count += 1

    # Workloads: ReplicaSets of 1-8 pods in org namespaces; GPU pods take 1, 2 or 8 GPUs.
    orgs = max(1, min(pods // 40, 2000))
    for i in range(orgs):
        docs.append(namespace(f"org-{i:04d}", org=f"org-{i:04d}"))
    full_sizes: set[int] = set()
    placed = 0
    workload = 0
    gpu_cursor = cpu_cursor = 0
    while placed < pods:
        ns = f"org-{workload % orgs:04d}"
        replicas = min(rng.randint(1, 8), pods - placed)
        sizes = [g for g in GPU_SIZES if g not in full_sizes]
        wants_gpu = bool(free) and bool(sizes) and rng.random() < gpu_fraction
        gpus = rng.choice(sizes) if wants_gpu else 0
        name = f"{'model' if gpus else 'web'}-{workload:05d}"
        rs_uid = str(uuid.UUID(int=rng.getrandbits(128)))
        labels = {"app": name, "capacity.io/component": "model" if gpus else "web"}
        template = {"metadata": {"labels": dict(labels)},
                    "spec": {"containers": [{"name": "main", "image": f"registry.example.com/{name}:1",
                                             "resources": resources(cpu="2" if gpus else "250m",
                                                                    memory="8Gi" if gpus else "512Mi",
                                                                    gpus=gpus)}]}}
        rs_pods = []
        for r in range(replicas):
            host = _take(free if gpus else (cpu_nodes or free), gpus, 2000 if gpus else 250,
                         gpu_cursor if gpus else cpu_cursor)
            if host is None:
                break
            if gpus:
                gpu_cursor = host[1]
            else:
                cpu_cursor = host[1]
            started = born + timedelta(minutes=rng.randint(5, 60 * 24 * 30))
            annotations = {}
            if gpus:
                annotations[GPU_INDICES_ANNOTATION] = ",".join(str(g) for g in host[2])
                annotations[UTILIZATION_ANNOTATION] = str(rng.choice((0, 5, 35, 60, 85, 95)))
            rs_pods.append(_pod(ns, f"{name}-{uuid.UUID(int=rng.getrandbits(128)).hex[:5]}", labels,
                                template["spec"], host[0], annotations, name, rs_uid, started))
        if not rs_pods:
            if gpus:
                # No node has room for this size any more (8-GPU pods run out first);
                # smaller GPU pods may still fit. Once no size fits, the rest are CPU pods.
                full_sizes.add(gpus)
                continue
            break
        docs.append({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                     "metadata": {"name": name, "namespace": ns, "uid": rs_uid, "labels": dict(labels),
                                  "creationTimestamp": _rfc3339(born)},
                     "spec": {"replicas": len(rs_pods), "selector": {"matchLabels": {"app": name}},
                              "template": template},
                     "status": {"replicas": len(rs_pods), "readyReplicas": len(rs_pods),
                                "availableReplicas": len(rs_pods), "fullyLabeledReplicas": len(rs_pods),
                                "observedGeneration": 1}})
        docs.extend(rs_pods)
        placed += len(rs_pods)
        workload += 1
    return docs


def _take(nodes: list[list], gpus: int, millicpu: int, start: int):
    """First node from `start` (round robin) with room; returns (name, cursor, gpu indices)."""
    n = len(nodes)
    for step in range(n):
        i = (start + step) % n
        entry = nodes[i]
        if entry[1] >= gpus and entry[3] >= millicpu and entry[4] < 110:
            indices = list(range(entry[2], entry[2] + gpus))
            entry[1] -= gpus
            entry[2] += gpus
            entry[3] -= millicpu
            entry[4] += 1
            return entry[0], (i + 1) % n, indices
    return None


def _pod(ns, name, labels, spec, node_name, annotations, rs_name, rs_uid, started) -> dict:
    meta = {"name": name, "namespace": ns, "labels": dict(labels), "creationTimestamp": _rfc3339(started),
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{ns}/{name}")),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name,
                                 "uid": rs_uid, "controller": True, "blockOwnerDeletion": True}]}
    if annotations:
        meta["annotations"] = annotations
    when = _rfc3339(started + timedelta(seconds=30))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {**spec, "nodeName": node_name, "restartPolicy": "Always",
                     "terminationGracePeriodSeconds": 30},
            "status": {"phase": "Running", "startTime": _rfc3339(started),
                       "conditions": [{"type": t, "status": "True", "lastTransitionTime": when}
                                      for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                       "containerStatuses": [{"name": "main", "image": spec["containers"][0]["image"], "imageID": "",
                                              "ready": True, "restartCount": 0, "started": True,
                                              "state": {"running": {"startedAt": when}}}]}}


def dump(docs: list[dict], out, *, fmt: str = "yaml") -> None:
    """YAML documents, or (fmt="json") one `v1 List` as `kubectl get -o json` writes it.

    JSON is the format for big clusters: parsing 10,000 pods of YAML takes PyYAML's C
    loader ~8 s, the same objects as JSON well under a second. The Simulation document
    is left out of a List (it is not a Kubernetes object); the defaults apply.
    """
    if fmt == "json":
        items = [d for d in docs if d["kind"] != "Simulation"]
        out.write(orjson.dumps({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items},
                               option=orjson.OPT_INDENT_2).decode())
        out.write("\n")
        return
    # The C dumper when PyYAML has it: 10,000 pods serialise in seconds, not a minute.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    yaml.dump_all(docs, out, Dumper=dumper, sort_keys=False, default_flow_style=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simcluster generate",
                                     description="Write a large simulated-cluster scenario (YAML).")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--gpu-fraction", type=float, default=0.8,
                        help="share of the nodes (and of the workloads) that have GPUs, 0-1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="output file (default: standard output)")
    parser.add_argument("--format", choices=("yaml", "json"),
                        help="yaml documents or a JSON v1 List (default: from --out's extension, "
                             "else yaml); JSON loads ~20x faster for big clusters")
    args = parser.parse_args(argv)
    try:
        docs = generate(nodes=args.nodes, pods=args.pods, gpu_fraction=args.gpu_fraction, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    fmt = args.format or ("json" if (args.out or "").endswith(".json") else "yaml")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            dump(docs, out, fmt=fmt)
    else:
        dump(docs, sys.stdout, fmt=fmt)
    placed = sum(1 for d in docs if d["kind"] == "Pod")
    if placed < args.pods:
        print(f"warning: only {placed} of {args.pods} pods fit on {args.nodes} nodes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
