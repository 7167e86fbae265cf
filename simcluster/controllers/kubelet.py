"""The kubelets of every node: start bound pods, give them GPUs, finish their deletion.

- A newly bound pod gets `startTime`, `hostIP`, and the GPU indices it asked for
  (`simcluster.io/gpu-indices`, lowest free indices first, never one index to two
  pods; indices a pod already carries are kept). After the start-up delay
  (`SimSettings.startup_seconds`, or the pod's `simcluster.io/startup-seconds`) it is
  Running and Ready.
- A pod being deleted turns not-Ready at once and is erased when its containers have
  exited: at the end of its grace period, unless it is known to exit sooner on SIGTERM
  (`simcluster.io/shutdown-seconds`, or a Knative revision pod, whose queue-proxy
  drains for 30 s and then lets the pod end: a 300 s grace period is only the limit).
- Pods already Running (a scenario, a dump) are left as they are.
- Each node's `status.nodeInfo` carries every NodeSystemInfo field, as a kubelet
  reports it (the Go struct has no `omitempty`, so a real API server always serves them
  all, and clients that validate the schema reject a node without them).
"""
from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from ..clock import parse_time, rfc3339
from ..resources import NODES, PODS
from ..store import copy
from ._util import (GPU, GPU_INDICES_ANNOTATION, STARTUP_ANNOTATION, TERMINAL_PHASES, condition, gpu_indices,
                    parse_quantity, pod_gpu_count, record_event, set_condition)
from .scheduler import node_ready

COMPONENT = "kubelet"
SHUTDOWN_ANNOTATION = "simcluster.io/shutdown-seconds"
KNATIVE_REVISION_LABEL = "serving.knative.dev/revision"
# knative.dev/serving pkg/queue/sharedmain: drainSleepDuration, the time queue-proxy keeps
# serving after SIGTERM before the pod's containers exit (seconds).
KNATIVE_DRAIN_SECONDS = 30.0
# v1.NodeSystemInfo, in its field order, with what a kubelet reports when the scenario
# does not say (ids are derived from the node's name so a scenario replays the same).
NODE_INFO_DEFAULTS = (("machineID", None), ("systemUUID", None), ("bootID", None), ("kernelVersion", ""),
                      ("osImage", ""), ("containerRuntimeVersion", ""), ("kubeletVersion", ""),
                      ("kubeProxyVersion", ""), ("operatingSystem", "linux"), ("architecture", "amd64"))


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


def shutdown_seconds(pod: dict) -> float | None:
    """Seconds from the delete to the containers' exit, when shorter than the grace
    period; None: they use all of it."""
    meta = pod["metadata"]
    text = (meta.get("annotations") or {}).get(SHUTDOWN_ANNOTATION)
    if text is not None:
        try:
            return max(0.0, float(text))
        except ValueError:
            pass   # a bad annotation falls back to the default below
    if (meta.get("labels") or {}).get(KNATIVE_REVISION_LABEL):
        return KNATIVE_DRAIN_SECONDS
    return None


def complete_node_info(node: dict) -> dict | None:
    """`status.nodeInfo` with every field present, or None when it already is."""
    info = (node.get("status") or {}).get("nodeInfo") or {}
    if all(key in info for key, _ in NODE_INFO_DEFAULTS):
        return None
    digest = hashlib.blake2b(node["metadata"]["name"].encode(), digest_size=16).hexdigest()
    derived = {"machineID": digest, "systemUUID": str(uuid.UUID(digest)).upper(),
               "bootID": str(uuid.UUID(digest[::-1]))}
    complete = dict(info)
    for key, default in NODE_INFO_DEFAULTS:
        complete.setdefault(key, derived[key] if default is None else default)
    return complete


class KubeletController:
    name = "kubelet"

    def reconcile(self, sim) -> None:
        store = sim.store
        now = sim.clock.now()
        for node in sorted(store.all(NODES), key=lambda n: n["metadata"]["name"]):
            info = complete_node_info(node)
            if info is not None:
                new = copy(node)
                new.setdefault("status", {})["nodeInfo"] = info
                node = store.put(NODES, new)
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
        shutdown = shutdown_seconds(pod)
        if deadline is not None and shutdown is not None:
            # deletionTimestamp is the delete plus the grace period.
            started = deadline - timedelta(seconds=pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            deadline = min(deadline, started + timedelta(seconds=shutdown))
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
