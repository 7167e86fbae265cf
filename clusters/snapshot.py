"""The one frozen, read-only view of a cluster that planning code reads: nodes, pods, who
owns each pod, and GPUs (requested per pod, requested and free per node), counted one way.

Pure: no Django, no gateway. Planning takes a `ClusterSnapshot` (or the slice it needs) and
`now` and never talks to the cluster itself. `clusters.selectors.snapshot_take` builds one
from the cluster with the fewest LIST calls; tests build one from plain dicts with
`NodeView.from_object` / `PodView.from_object` and `ClusterSnapshot.build`.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping

from clusters.labels import GPU_RESOURCE

# Pod phases in which a pod bound to a node holds what it requested: the scheduler stops
# counting a pod once it has finished (Succeeded, Failed) or is being deleted.
HOLDING_PHASES = ("Pending", "Running")


_EMPTY: Mapping[str, str] = MappingProxyType({})

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a snapshot is decoded and built.

    A 50,000-pod LIST decodes into millions of dicts and lists; each batch of new
    containers triggers a collection that walks everything alive, so at that size more than
    half the read went to the collector (measured: 0.8 s decoded with it paused, 2.9-6.1 s
    without). Decoded JSON and the views hold no reference cycles, so reference counting
    frees them either way. Nested and threaded uses count: the collector runs again when
    the last one ends, and only if it was running before the first.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _frozen(mapping: dict | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping)) if mapping else _EMPTY


def _gpus(resources: dict | None) -> int:
    value = (resources or {}).get(GPU_RESOURCE, 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
    # The scheduler's message when it could not place the pod (PodScheduled False,
    # reason Unschedulable); None when it did, or has not said.
    unschedulable_message: str | None = None
    # The version read: a write conditioned on it applies only to the pod as it was read.
    resource_version: str = ""

    @property
    def controller(self) -> OwnerRef | None:
        for owner in self.owners:   # a loop, not a generator: asked once per pod by every planner
            if owner.controller:
                return owner
        return None

    @property
    def live(self) -> bool:
        """Neither finished nor being deleted: it holds, or is waiting for, what it requested."""
        return self.phase in HOLDING_PHASES and not self.terminating

    @property
    def holds_gpus(self) -> bool:
        """Bound to a node and live: its GPUs count against that node."""
        return bool(self.node_name) and self.live and self.gpus > 0

    @property
    def pending_for_gpus(self) -> bool:
        """Pending, unbound, and the scheduler said GPUs were short."""
        return (not self.node_name and self.phase == "Pending" and self.gpus > 0
                and GPU_RESOURCE in (self.unschedulable_message or ""))

    @classmethod
    def from_object(cls, obj: dict) -> "PodView":
        # Called once per pod of a cluster (50,000 at fleet size): plain loops, no
        # generators, positional arguments, and the common cases (no GPU asked for, no
        # owner, no unschedulable condition) kept cheap.
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        gpus = 0
        for container in spec.get("containers") or ():
            resources = container.get("resources")
            if resources:
                requests, limits = resources.get("requests"), resources.get("limits")
                if (requests and requests.get(GPU_RESOURCE)) or (limits and limits.get(GPU_RESOURCE)):
                    gpus += _gpus(requests) or _gpus(limits)
        refs = meta.get("ownerReferences")
        owners = tuple([OwnerRef(o.get("apiVersion", ""), o.get("kind", ""), o.get("name", ""), o.get("uid", ""),
                                 bool(o.get("controller"))) for o in refs]) if refs else ()
        unschedulable = None
        for condition in status.get("conditions") or ():
            if condition.get("type") == "PodScheduled":
                if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
                    unschedulable = condition.get("message") or ""
                break
        return cls(meta.get("namespace", ""), meta["name"], meta.get("uid", ""), spec.get("nodeName"),
                   status.get("phase", "Pending"), _frozen(meta.get("labels")), _frozen(meta.get("annotations")),
                   gpus, owners, bool(meta.get("deletionTimestamp")), meta.get("creationTimestamp", ""),
                   unschedulable, meta.get("resourceVersion", ""))


@dataclass(frozen=True)
class ClusterSnapshot:
    taken_at: datetime
    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...]
    _by_node: Mapping[str, tuple[PodView, ...]] = field(default_factory=dict, repr=False, compare=False)
    _by_owner: Mapping[str, tuple[PodView, ...]] = field(default_factory=dict, repr=False, compare=False)
    _nodes: Mapping[str, NodeView] = field(default_factory=dict, repr=False, compare=False)

    def node(self, name: str) -> NodeView | None:
        return self._nodes.get(name)

    def pods_on(self, node_name: str) -> tuple[PodView, ...]:
        return self._by_node.get(node_name, ())

    def pods_owned_by(self, owner_uid: str) -> tuple[PodView, ...]:
        """The pods whose controller is the object with this uid (a ReplicaSet, say)."""
        return self._by_owner.get(owner_uid, ())

    def gpus_requested(self, node_name: str) -> int:
        """GPUs the node's live pods requested: what the scheduler counts as taken."""
        return sum(p.gpus for p in self.pods_on(node_name) if p.live)

    def gpus_free(self, node_name: str) -> int:
        node = self._nodes.get(node_name)
        return max(node.gpus_allocatable - self.gpus_requested(node_name), 0) if node else 0

    @classmethod
    def build(cls, *, taken_at: datetime, nodes: Iterable[NodeView], pods: Iterable[PodView]) -> "ClusterSnapshot":
        nodes, pods = tuple(nodes), tuple(pods)
        by_node: dict[str, list[PodView]] = {}
        by_owner: dict[str, list[PodView]] = {}
        for pod in pods:
            if pod.node_name:
                by_node.setdefault(pod.node_name, []).append(pod)
            for owner in pod.owners:   # the controller, as `PodView.controller` finds it
                if owner.controller:
                    by_owner.setdefault(owner.uid, []).append(pod)
                    break
        return cls(taken_at=taken_at, nodes=nodes, pods=pods,
                   _by_node=MappingProxyType({k: tuple(v) for k, v in by_node.items()}),
                   _by_owner=MappingProxyType({k: tuple(v) for k, v in by_owner.items()}),
                   _nodes=MappingProxyType({n.name: n for n in nodes}))
