"""The kubelets of every node: start bound pods, give them GPUs, finish their deletion.

- A newly bound pod gets `startTime`, `hostIP`, and the GPU indices it asked for
  (`simcluster.io/gpu-indices`, lowest free indices first, never one index to two
  pods; indices a pod already carries are kept). After the start-up delay
  (`SimSettings.startup_seconds`, or the pod's `simcluster.io/startup-seconds`) it is
  Running and Ready.
- A pod being deleted turns not-Ready at once and is erased when its grace period ends.
- Pods already Running (a scenario, a dump) are left as they are.
"""
from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from ..clock import parse_time, rfc3339
from ..resources import NODES, PODS
from ..store import copy
from ._util import (GPU, GPU_INDICES_ANNOTATION, STARTUP_ANNOTATION, TERMINAL_PHASES, condition, gpu_indices,
                    parse_quantity, pod_gpu_count, record_event, set_condition)
from .scheduler import node_ready

COMPONENT = "kubelet"


def pod_ip(pod: dict) -> str:
    """A stable address in 10.0.0.0/8 derived from the pod's uid."""
    digest = hashlib.blake2b(pod["metadata"]["uid"].encode(), digest_size=3).digest()
    return f"10.{digest[0]}.{digest[1]}.{max(1, digest[2] % 255)}"


def node_ip(node: dict) -> str:
    for address in (node.get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return address["address"]
    digest = hashlib.blake2b(node["metadata"]["name"].encode(), digest_size=2).digest()
    return f"192.168.{digest[0]}.{max(1, digest[1] % 255)}"


def startup_seconds(sim, pod: dict) -> float:
    text = (pod["metadata"].get("annotations") or {}).get(STARTUP_ANNOTATION)
    if text is not None:
        try:
            return max(0.0, float(text))
        except ValueError:
            pass   # a bad annotation falls back to the scenario's delay
    return sim.settings.startup_seconds


class KubeletController:
    name = "kubelet"

    def reconcile(self, sim) -> None:
        store = sim.store
        now = sim.clock.now()
        for node in sorted(store.all(NODES), key=lambda n: n["metadata"]["name"]):
            pods = store.pods_on_node(node["metadata"]["name"])
            if pods:
                self._sync_node(sim, node, pods, now)

    def _sync_node(self, sim, node: dict, pods: list[dict], now: datetime) -> None:
        taken = set()
        for pod in pods:
            if (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                taken.update(gpu_indices(pod) or ())
        gpus = int(parse_quantity(((node.get("status") or {}).get("capacity") or {}).get(GPU, 0)))
        ready_node = node_ready(node)
        for pod in sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"])):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                self._terminate(sim, pod, now)
                continue
            status = pod.get("status") or {}
            if status.get("phase") in TERMINAL_PHASES or status.get("phase") == "Running" or not ready_node:
                continue
            self._start(sim, node, pod, now, gpus, taken)

    @staticmethod
    def _terminate(sim, pod: dict, now: datetime) -> None:
        deadline = parse_time(pod["metadata"]["deletionTimestamp"])
        if deadline is None or deadline <= now:
            sim.store.remove(PODS, pod["metadata"].get("namespace"), pod["metadata"]["name"])
            return
        sim.wake_at(deadline)
        ready = condition(pod, "Ready")
        if not ready or ready.get("status") != "True":
            return
        new = copy(pod)
        conditions = new["status"].get("conditions")
        for ctype in ("Ready", "ContainersReady"):
            conditions = set_condition(conditions, ctype, "False", now)
        new["status"]["conditions"] = conditions
        for cs in new["status"].get("containerStatuses") or ():
            cs["ready"] = False
        sim.store.put(PODS, new)

    def _start(self, sim, node: dict, pod: dict, now: datetime, gpus: int, taken: set) -> None:
        new = copy(pod)
        meta, status = new["metadata"], new.setdefault("status", {})
        wanted = pod_gpu_count(pod)
        if wanted and gpu_indices(pod) is None:
            free = [i for i in range(gpus) if i not in taken]
            if len(free) < wanted:
                return   # over-committed node (a scenario): wait for GPUs to free up
            chosen = free[:wanted]
            taken.update(chosen)
            meta.setdefault("annotations", {})[GPU_INDICES_ANNOTATION] = ",".join(map(str, chosen))
        started = parse_time(status.get("startTime"))
        if started is None:
            started = now
            status["startTime"] = rfc3339(now)
            status["hostIP"] = node_ip(node)
            status["hostIPs"] = [{"ip": status["hostIP"]}]
            status["phase"] = "Pending"
            status["conditions"] = set_condition(status.get("conditions"), "Initialized", "True", now)
            status["containerStatuses"] = [
                {"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": False,
                 "restartCount": 0, "started": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
                for c in (new.get("spec") or {}).get("containers") or ()]
        ready_at = started + timedelta(seconds=startup_seconds(sim, pod))
        if ready_at <= now:
            self._run(new, now)
        else:
            sim.wake_at(ready_at)
        if new != pod:
            stored = sim.store.put(PODS, new)
            if status.get("phase") == "Running":
                record_event(sim, PODS, stored, "Started", "Started container", component=COMPONENT)

    @staticmethod
    def _run(pod: dict, now: datetime) -> None:
        status = pod["status"]
        stamp = rfc3339(now)
        status["phase"] = "Running"
        status["podIP"] = pod_ip(pod)
        status["podIPs"] = [{"ip": status["podIP"]}]
        conditions = status.get("conditions")
        for ctype in ("Initialized", "ContainersReady", "Ready"):
            conditions = set_condition(conditions, ctype, "True", now)
        status["conditions"] = conditions
        status["containerStatuses"] = [
            {"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": True,
             "restartCount": 0, "started": True, "state": {"running": {"startedAt": stamp}},
             "containerID": f"containerd://{pod['metadata']['uid'].replace('-', '')}{i}"}
            for i, c in enumerate((pod.get("spec") or {}).get("containers") or ())]
