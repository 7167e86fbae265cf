"""The DaemonSet controller, after pkg/controller/daemon: one pod per node the pod
template fits (node selector, affinity, taints), bound to its node at creation.

DaemonSet pods tolerate `node.kubernetes.io/unschedulable` (the controller adds that
toleration), so a cordoned node keeps its daemons — which is why drain skips them.
"""
from __future__ import annotations

import random

from ..resources import DAEMONSETS, NODES, PODS
from ..store import copy
from ._util import (by_namespace, is_deleting, pod_active, pod_available, pod_from_template, pod_ready,
                    record_event, unique_name, write_status)
from .replicaset import claim, selector_predicate
from .scheduler import UNSCHEDULABLE_TAINT, static_reason

COMPONENT = "daemonset-controller"
# The tolerations daemon.util.AddOrUpdateDaemonPodTolerations adds to every daemon pod.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
)


def daemon_spec(template: dict | None) -> dict:
    """The pod spec a daemon pod gets: the template's, plus the daemon tolerations."""
    spec = copy((template or {}).get("spec") or {})
    tolerations = list(spec.get("tolerations") or ())
    for toleration in DAEMON_TOLERATIONS:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    spec["tolerations"] = tolerations
    return spec


class DaemonSetController:
    name = "daemonset"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def reconcile(self, sim) -> None:
        store = sim.store
        sets = store.all(DAEMONSETS)
        if not sets:
            return
        nodes = sorted(store.all(NODES), key=lambda n: n["metadata"]["name"])
        pods_by_ns = by_namespace(store.all(PODS))
        for ds in sorted(sets, key=lambda d: (d["metadata"]["namespace"], d["metadata"]["name"])):
            self._sync(sim, ds, nodes, pods_by_ns.get(ds["metadata"]["namespace"], []))

    def _sync(self, sim, ds: dict, nodes: list[dict], namespace_pods: list[dict]) -> None:
        spec = ds.get("spec") or {}
        pods = claim(sim.store, PODS, ds, namespace_pods, selector_predicate(spec.get("selector")))
        pod_spec = daemon_spec(spec.get("template"))
        wanted = {n["metadata"]["name"] for n in nodes if static_reason(pod_spec, n) is None}
        on_node: dict[str, list[dict]] = {}
        for pod in pods:
            if pod_active(pod):
                on_node.setdefault((pod.get("spec") or {}).get("nodeName") or "", []).append(pod)
        if not is_deleting(ds):
            for node_name in sorted(wanted - on_node.keys()):
                self._create(sim, ds, node_name, pod_spec)
            for node_name, node_pods in on_node.items():
                extra = node_pods if node_name not in wanted else node_pods[1:]
                for pod in extra:
                    sim.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._write_status(sim, ds, wanted, on_node)

    def _create(self, sim, ds: dict, node_name: str, pod_spec: dict) -> None:
        meta = ds["metadata"]
        name = unique_name(sim.store, PODS, meta["namespace"], f"{meta['name']}-", self.rng)
        template = {"metadata": ((ds.get("spec") or {}).get("template") or {}).get("metadata") or {},
                    "spec": copy(pod_spec)}
        pod = pod_from_template(template, owner=ds, name=name, namespace=meta["namespace"])
        pod["metadata"]["generateName"] = f"{meta['name']}-"
        pod["spec"]["nodeName"] = node_name
        sim.store.create(PODS, pod)
        record_event(sim, DAEMONSETS, ds, "SuccessfulCreate", f"Created pod: {name}", component=COMPONENT)

    @staticmethod
    def _write_status(sim, ds: dict, wanted: set[str], on_node: dict[str, list[dict]]) -> None:
        now = sim.clock.now()
        min_ready = (ds.get("spec") or {}).get("minReadySeconds") or 0
        scheduled = [pods[0] for node, pods in on_node.items() if node in wanted]
        ready = sum(1 for p in scheduled if pod_ready(p))
        available = sum(1 for p in scheduled if pod_available(p, min_ready, now))
        status = {
            "observedGeneration": ds["metadata"].get("generation", 1),
            "desiredNumberScheduled": len(wanted),
            "currentNumberScheduled": len(scheduled),
            "updatedNumberScheduled": len(scheduled),
            "numberMisscheduled": sum(len(pods) for node, pods in on_node.items() if node not in wanted),
            "numberReady": ready,
            "numberAvailable": available,
            "numberUnavailable": len(wanted) - available,
        }
        write_status(sim.store, DAEMONSETS, ds, status)
