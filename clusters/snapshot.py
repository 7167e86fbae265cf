"""Frozen, read-only views of a cluster for planning code: nodes, pods, GPUs, owners.

Planning takes a `ClusterSnapshot` and `now` and never talks to the cluster itself.
Build one with `snapshot_take(gateway, now=...)` or, in tests, from plain dicts with
`NodeView.from_object` / `PodView.from_object`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Mapping

from clusters import kube

GPU_RESOURCE = "nvidia.com/gpu"


def _frozen(mapping: dict | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


def _gpus(resources: dict | None) -> int:
    value = (resources or {}).get(GPU_RESOURCE, 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    gpus_allocatable: int
    unschedulable: bool
    ready: bool

    @classmethod
    def from_object(cls, obj: dict) -> "NodeView":
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        return cls(name=meta["name"], labels=_frozen(meta.get("labels")), annotations=_frozen(meta.get("annotations")),
                   gpus_allocatable=_gpus(status.get("allocatable")), unschedulable=bool(spec.get("unschedulable")),
                   ready=ready)


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    gpus: int
    owners: tuple[OwnerRef, ...]
    terminating: bool
    created_at: str

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @classmethod
    def from_object(cls, obj: dict) -> "PodView":
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        gpus = sum(_gpus((c.get("resources") or {}).get("requests")) or _gpus((c.get("resources") or {}).get("limits"))
                   for c in spec.get("containers") or ())
        owners = tuple(OwnerRef(o.get("apiVersion", ""), o.get("kind", ""), o.get("name", ""), o.get("uid", ""),
                                bool(o.get("controller"))) for o in meta.get("ownerReferences") or ())
        return cls(namespace=meta.get("namespace", ""), name=meta["name"], uid=meta.get("uid", ""),
                   node_name=spec.get("nodeName"), phase=status.get("phase", "Pending"),
                   labels=_frozen(meta.get("labels")), annotations=_frozen(meta.get("annotations")), gpus=gpus,
                   owners=owners, terminating=bool(meta.get("deletionTimestamp")),
                   created_at=meta.get("creationTimestamp", ""))


@dataclass(frozen=True)
class ClusterSnapshot:
    taken_at: datetime
    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...]
    _by_node: Mapping[str, tuple[PodView, ...]] = field(default_factory=dict, repr=False, compare=False)

    def pods_on(self, node_name: str) -> tuple[PodView, ...]:
        return self._by_node.get(node_name, ())

    def gpus_used(self, node_name: str) -> int:
        return sum(p.gpus for p in self.pods_on(node_name) if p.phase in ("Pending", "Running") and not p.terminating)

    @classmethod
    def build(cls, *, taken_at: datetime, nodes: list[NodeView], pods: list[PodView]) -> "ClusterSnapshot":
        by_node: dict[str, list[PodView]] = {}
        for pod in pods:
            if pod.node_name:
                by_node.setdefault(pod.node_name, []).append(pod)
        return cls(taken_at=taken_at, nodes=tuple(nodes), pods=tuple(pods),
                   _by_node=MappingProxyType({k: tuple(v) for k, v in by_node.items()}))


# Objects per LIST page for a whole-cluster snapshot. kubectl pages by 500, but each page
# is a round trip and the API server re-walks the list for every page; 5,000 keeps a
# 10,000-pod snapshot to three requests while a 100,000-pod one still pages.
SNAPSHOT_PAGE_SIZE = 5000


def snapshot_take(gateway: kube.KubeGateway, *, now: datetime, namespace: str | None = None) -> ClusterSnapshot:
    nodes = [NodeView.from_object(o) for o in gateway.list(kube.NODES, page_size=SNAPSHOT_PAGE_SIZE)]
    pods = [PodView.from_object(o) for o in gateway.list(kube.PODS, namespace=namespace,
                                                          page_size=SNAPSHOT_PAGE_SIZE)]
    return ClusterSnapshot.build(taken_at=now, nodes=nodes, pods=pods)
