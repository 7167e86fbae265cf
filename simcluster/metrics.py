"""A DCGM exporter for the simulated GPUs: `GET /metrics` in the Prometheus text format.

One series per GPU and metric, labelled as NVIDIA's dcgm-exporter labels them with
Kubernetes pod mapping on: `gpu`, `UUID`, `device`, `modelName`, `Hostname`, and for a
GPU assigned to a pod, the pod's `namespace`, `pod` and `container`. A GPU no pod holds
exports its series without the workload labels, as the real exporter does.

Utilization (0-100) of a pod's GPU is, in order:
1. the pod annotation `simcluster.io/gpu-utilization` — one number for all its GPUs,
   or a comma-separated list per GPU ("90,0": the first busy, the second idle);
2. for a Knative revision's pod, the revision's load: concurrency / (target x ready
   pods) x 100, capped at 100;
3. otherwise 0 (nothing is asking the model anything).
"""
from __future__ import annotations

import math
import uuid

from .controllers._serving import pod_serving
from .controllers.knative import labels as KL
from .resources import NODES, PODAUTOSCALERS, PODS

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_INDICES_ANNOTATION = "simcluster.io/gpu-indices"
UTILIZATION_ANNOTATION = "simcluster.io/gpu-utilization"
FB_USED_ANNOTATION = "simcluster.io/gpu-memory-used-mib"
_UUID_NAMESPACE = uuid.UUID("5b0d6a52-6c1e-4c53-9d8a-0c8e0d7f2a11")

# GPU feature discovery's `nvidia.com/gpu.product` label value (a label value cannot hold
# spaces) -> the NVML device name dcgm-exporter puts in `modelName`, and its framebuffer
# in MiB as nvidia-smi reports it. Unknown products: dashes become spaces, 16 GiB.
PRODUCTS = {
    "NVIDIA-H100-80GB-HBM3": ("NVIDIA H100 80GB HBM3", 81559),
    "NVIDIA-A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", 81920),
    "NVIDIA-A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", 40960),
    "NVIDIA-A10G": ("NVIDIA A10G", 23028),
    "NVIDIA-L4": ("NVIDIA L4", 23034),
    "Tesla-T4": ("Tesla T4", 15360),
}


def product_info(label_value: str | None) -> tuple[str, int]:
    if not label_value:
        return "NVIDIA GPU", 16384
    return PRODUCTS.get(label_value, (label_value.replace("-", " "), 16384))


METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
)


def gpu_uuid(node_name: str, index: int) -> str:
    """Stable per node and index, shaped like nvidia-smi's `GPU-xxxxxxxx-...`."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def parse_indices(text: str | None) -> list[int]:
    """`"0,3"` or `"[0, 3]"` -> [0, 3]; junk is ignored rather than failing the scrape."""
    out = []
    for part in (text or "").strip("[] ").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def _utilizations(text: str | None) -> list[float] | None:
    if text is None:
        return None
    values = []
    for part in str(text).split(","):
        try:
            values.append(min(max(float(part.strip()), 0.0), 100.0))
        except ValueError:
            return None
    return values or None


def _gpu_container(pod: dict) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for c in containers:
        resources = c.get("resources") or {}
        if GPU_RESOURCE in (resources.get("limits") or {}) or GPU_RESOURCE in (resources.get("requests") or {}):
            return c.get("name", "")
    return containers[0].get("name", "")


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _LoadModel:
    """Per-revision utilization from the simulated load, computed once per scrape."""

    def __init__(self, sim):
        self.sim = sim
        self.ready: dict[tuple[str, str], int] = {}
        for pod in sim.store.all(PODS):
            rev = (pod["metadata"].get("labels") or {}).get(KL.REVISION)
            if rev and pod_serving(pod):
                key = (pod["metadata"]["namespace"], rev)
                self.ready[key] = self.ready.get(key, 0) + 1

    def utilization(self, pod: dict) -> float:
        meta = pod["metadata"]
        rev = (meta.get("labels") or {}).get(KL.REVISION)
        if not rev:
            return 0.0
        load = float(self.sim.load.get((meta["namespace"], rev), 0.0))
        if load <= 0:
            return 0.0
        pa = self.sim.store.get(PODAUTOSCALERS, meta["namespace"], rev) or {}
        target = KL.scale_number((pa.get("metadata") or {}).get("annotations"), "target") or \
            float((pa.get("spec") or {}).get("containerConcurrency") or 0) or \
            self.sim.settings.default_target_concurrency
        pods = max(self.ready.get((meta["namespace"], rev), 0), 1)
        return min(100.0, 100.0 * load / (target * pods))


def gpu_samples(sim) -> list[tuple[dict, float, float, float]]:
    """(labels, utilization %, framebuffer used MiB, engine active 0-1) per GPU."""
    store = sim.store
    load = _LoadModel(sim)
    samples = []
    for node in sorted(store.all(NODES), key=lambda n: n["metadata"]["name"]):
        meta = node["metadata"]
        status = node.get("status") or {}
        count = int(str((status.get("capacity") or {}).get(GPU_RESOURCE)
                        or (status.get("allocatable") or {}).get(GPU_RESOURCE) or 0) or 0)
        if count <= 0:
            continue
        hostname = meta["name"]
        model, fb_total = product_info((meta.get("labels") or {}).get(PRODUCT_LABEL))
        holders: dict[int, tuple[dict, int]] = {}   # gpu index -> (pod, position in the pod)
        for pod in store.pods_on_node(hostname):
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            indices = parse_indices((pod["metadata"].get("annotations") or {}).get(GPU_INDICES_ANNOTATION))
            for position, index in enumerate(indices):
                holders[index] = (pod, position)
        for index in range(count):
            labels = {"gpu": str(index), "UUID": gpu_uuid(hostname, index), "device": f"nvidia{index}",
                      "modelName": model, "Hostname": hostname}
            util, fb_used = 0.0, 0.0
            if index in holders:
                pod, position = holders[index]
                pmeta = pod["metadata"]
                annotations = pmeta.get("annotations") or {}
                labels.update({"namespace": pmeta["namespace"], "pod": pmeta["name"],
                               "container": _gpu_container(pod)})
                given = _utilizations(annotations.get(UTILIZATION_ANNOTATION))
                if given is not None:
                    util = given[position] if position < len(given) else given[-1]
                else:
                    util = load.utilization(pod)
                try:
                    fb_used = float(annotations[FB_USED_ANNOTATION])
                except (KeyError, ValueError):
                    # A loaded model holds most of its memory whether busy or not.
                    fb_used = math.floor(fb_total * 0.6)
            samples.append((labels, util, fb_used, util / 100.0))
    return samples


def render_metrics(sim) -> str:
    """The Prometheus text exposition (format 0.0.4) of every simulated GPU."""
    with sim.store.lock:
        samples = gpu_samples(sim)
    lines: list[str] = []
    for column, (name, kind, help_text) in enumerate(METRICS, start=1):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for sample in samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample[0].items())
            value = sample[column]
            text = str(int(round(value))) if column < 3 else f"{value:.6f}"
            lines.append(f"{name}{{{labels}}} {text}")
    return "\n".join(lines) + "\n"
