"""The StatefulSet controller, after pkg/controller/statefulset.

Pods are named `<set>-<ordinal>`. With the default `OrderedReady` policy a pod is
created only once every lower ordinal is Running and Ready, and scale-down removes
the highest ordinal first, one at a time, waiting for it to be gone; `Parallel`
creates and deletes them all at once. Pods are claimed by selector as the ReplicaSet
controller does (adopt, keep, release). A deleted pod is created again.
"""
from __future__ import annotations

from ..resources import PODS, STATEFULSETS
from ._util import (by_namespace, is_deleting, pod_active, pod_available, pod_from_template, pod_ready,
                    record_event, write_status)
from .replicaset import claim, selector_predicate

COMPONENT = "statefulset-controller"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def ordinal(set_name: str, pod: dict) -> int | None:
    """The ordinal of `<set>-<n>`, or None for a pod of another name."""
    name = pod["metadata"]["name"]
    prefix = f"{set_name}-"
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        return None
    return int(name[len(prefix):])


class StatefulSetController:
    name = "statefulset"

    def reconcile(self, sim) -> None:
        store = sim.store
        sets = store.all(STATEFULSETS)
        if not sets:
            return
        pods_by_ns = by_namespace(store.all(PODS))
        for sts in sorted(sets, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
            self._sync(sim, sts, pods_by_ns.get(sts["metadata"]["namespace"], []))

    def _sync(self, sim, sts: dict, namespace_pods: list[dict]) -> None:
        spec = sts.get("spec") or {}
        name = sts["metadata"]["name"]
        selects = selector_predicate(spec.get("selector"))
        # ClaimPods with the isMemberOf filter: a pod must match the selector AND be named
        # `<set>-<n>`; an owned pod that is neither is released, an orphan is left alone.
        members = [p for p in namespace_pods if ordinal(name, p) is not None]
        others = [p for p in namespace_pods if ordinal(name, p) is None]
        pods = claim(sim.store, PODS, sts, members, selects)
        claim(sim.store, PODS, sts, others, lambda labels: False)
        by_ordinal = {o: p for p in pods if (o := ordinal(name, p)) is not None}
        if not is_deleting(sts):
            wanted = 1 if spec.get("replicas") is None else int(spec["replicas"])
            parallel = spec.get("podManagementPolicy") == "Parallel"
            self._scale_up(sim, sts, by_ordinal, wanted, parallel)
            self._scale_down(sim, sts, by_ordinal, wanted, parallel)
        self._write_status(sim, sts, pods)

    def _scale_up(self, sim, sts: dict, by_ordinal: dict[int, dict], wanted: int, parallel: bool) -> None:
        for index in range(wanted):
            pod = by_ordinal.get(index)
            if pod is None:
                pod = self._create(sim, sts, index)
                by_ordinal[index] = pod
                if not parallel:
                    return   # OrderedReady: one at a time
            if not parallel and not (pod_active(pod) and pod_ready(pod)):
                return       # the next ordinal waits for this one to be Ready

    def _scale_down(self, sim, sts: dict, by_ordinal: dict[int, dict], wanted: int, parallel: bool) -> None:
        extra = sorted((o for o in by_ordinal if o >= wanted), reverse=True)
        for index in extra:
            pod = by_ordinal[index]
            if is_deleting(pod):
                if parallel:
                    continue
                return       # OrderedReady: wait for the highest one to be gone
            sim.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            record_event(sim, STATEFULSETS, sts, "SuccessfulDelete",
                         f"delete Pod {pod['metadata']['name']} in StatefulSet {sts['metadata']['name']} successful",
                         component=COMPONENT)
            if not parallel:
                return

    @staticmethod
    def _create(sim, sts: dict, index: int) -> dict:
        meta = sts["metadata"]
        name = f"{meta['name']}-{index}"
        pod = pod_from_template((sts.get("spec") or {}).get("template"), owner=sts, name=name,
                                namespace=meta["namespace"],
                                extra_labels={POD_NAME_LABEL: name, POD_INDEX_LABEL: str(index)})
        pod["spec"].setdefault("hostname", name)
        created = sim.store.create(PODS, pod)
        record_event(sim, STATEFULSETS, sts, "SuccessfulCreate",
                     f"create Pod {name} in StatefulSet {meta['name']} successful", component=COMPONENT)
        return created

    @staticmethod
    def _write_status(sim, sts: dict, pods: list[dict]) -> None:
        now = sim.clock.now()
        min_ready = (sts.get("spec") or {}).get("minReadySeconds") or 0
        active = [p for p in pods if pod_active(p)]
        status = {k: v for k, v in (sts.get("status") or {}).items() if k == "collisionCount"}
        status.update({
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(active),
            "readyReplicas": sum(1 for p in active if pod_ready(p)),
            "currentReplicas": len(active),
            "updatedReplicas": len(active),
            "availableReplicas": sum(1 for p in active if pod_available(p, min_ready, now)),
        })
        write_status(sim.store, STATEFULSETS, sts, status)
