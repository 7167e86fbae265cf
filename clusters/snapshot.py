"""The one frozen, read-only view of a cluster that planning code reads: nodes, pods, who
owns each pod, and GPUs (requested per pod, requested and free per node), counted one way.

Pure: no Django, no gateway. Planning takes a `ClusterSnapshot` (or the slice it needs) and
`now` and never talks to the cluster itself. `clusters.selectors.snapshot_take` builds one
from the cluster with the fewest LIST calls, each page decoded straight into the few fields
the views read (`POD_LIST`, `NODE_LIST`: msgspec skips the rest of every object without
making it into dicts and lists); tests and single reads build views from plain dicts with
`NodeView.from_object` / `PodView.from_object`, which go through the same fields, and
`ClusterSnapshot.build`.
"""
from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Generic, Iterable, Iterator, Mapping, Optional, TypeVar

import msgspec

from clusters.labels import GPU_RESOURCE

# Pod phases in which a pod bound to a node holds what it requested: the scheduler stops
# counting a pod once it has finished (Succeeded, Failed) or is being deleted.
HOLDING_PHASES = ("Pending", "Running")
# Every NVIDIA device resource a pod may ask for: whole GPUs (`nvidia.com/gpu`, the only one
# a node's GPU count and the capacity planners count), MIG slices (`nvidia.com/mig-1g.5gb`…)
# and shared GPUs (`nvidia.com/gpu.shared`). Each gets DCGM series of its own.
NVIDIA_DEVICE_PREFIX = GPU_RESOURCE.split("/")[0] + "/"


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
    """A read-only face on a dict decoded for this view alone (never one a caller holds)."""
    return MappingProxyType(mapping) if mapping else _EMPTY


# --- the fields of a Node and a Pod that the views read, as the API serves them ------------
# Every field is optional, and maps (labels, resources) keep whatever values they hold: an
# odd value makes an odd view (no GPUs counted, say), never a failed read of the whole page
# (an owner reference's fields, which the API always writes as strings, are the exception).
# gc=False: decoded objects hold no reference cycles, so the cyclic collector need not
# track them (reference counting frees them).

class _Condition(msgspec.Struct, gc=False):
    type: Optional[str] = None
    status: Optional[str] = None
    reason: Optional[str] = None
    message: Optional[str] = None


class OwnerRef(msgspec.Struct, frozen=True, gc=False):
    """One of a pod's owner references: decoded as it is, and kept as it is in the pod's view."""

    api_version: str = msgspec.field(default="", name="apiVersion")
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False


class _ObjectMeta(msgspec.Struct, gc=False):
    name: str
    namespace: Optional[str] = ""
    uid: Optional[str] = ""
    resourceVersion: Optional[str] = ""
    creationTimestamp: Optional[str] = ""
    deletionTimestamp: Optional[str] = None
    labels: Optional[dict] = None
    annotations: Optional[dict] = None
    ownerReferences: Optional[tuple[OwnerRef, ...]] = None


class _Resources(msgspec.Struct, gc=False):
    requests: Optional[dict] = None
    limits: Optional[dict] = None


class _Container(msgspec.Struct, gc=False):
    resources: Optional[_Resources] = None


class _PodSpec(msgspec.Struct, gc=False):
    nodeName: Optional[str] = None
    containers: Optional[list[_Container]] = None


class _PodStatus(msgspec.Struct, gc=False):
    phase: Optional[str] = "Pending"
    conditions: Optional[list[_Condition]] = None


class PodFields(msgspec.Struct, gc=False):
    """A Pod as decoded for its view: only the fields `PodView` reads."""

    metadata: _ObjectMeta
    spec: Optional[_PodSpec] = None
    status: Optional[_PodStatus] = None


class _NodeSpec(msgspec.Struct, gc=False):
    unschedulable: Optional[bool] = False


class _NodeStatus(msgspec.Struct, gc=False):
    allocatable: Optional[dict] = None
    conditions: Optional[list[_Condition]] = None


class NodeFields(msgspec.Struct, gc=False):
    """A Node as decoded for its view: only the fields `NodeView` reads."""

    metadata: _ObjectMeta
    spec: Optional[_NodeSpec] = None
    status: Optional[_NodeStatus] = None


_Item = TypeVar("_Item")


class _ListMeta(msgspec.Struct, gc=False):
    continue_: Optional[str] = msgspec.field(default=None, name="continue")


class ListFields(msgspec.Struct, Generic[_Item], gc=False):
    """A LIST page as decoded for the views: its items' fields and where the next page starts."""

    items: Optional[list[_Item]] = None
    metadata: Optional[_ListMeta] = None

    @property
    def continue_token(self) -> str | None:
        return self.metadata.continue_ if self.metadata else None


# Decoders for a LIST page of pods or nodes (`KubeGateway.list_page(decoder=...)`); lax as
# to scalars the way the API may write them ("true", a number as a string).
POD_LIST = msgspec.json.Decoder(ListFields[PodFields], strict=False)
NODE_LIST = msgspec.json.Decoder(ListFields[NodeFields], strict=False)


def _fields(obj: dict, fields_type: type, kind: str) -> Any:
    """An object already decoded to dicts, as its view's fields (the dicts it holds copied)."""
    try:
        return msgspec.convert(obj, fields_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a {kind} the views can read: {exc}") from None


def asks_nvidia_device(spec: Optional[_PodSpec]) -> bool:
    """Whether a pod's containers ask for any NVIDIA device (a request or limit above 0)."""
    for container in (spec and spec.containers) or ():
        resources = container.resources
        if resources:
            for given in (resources.requests, resources.limits):
                for key, value in (given or {}).items():
                    if key.startswith(NVIDIA_DEVICE_PREFIX) and str(value).strip() not in ("0", ""):
                        return True
    return False


def _gpus(resources: dict | None) -> int:
    value = (resources or {}).get(GPU_RESOURCE, 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# The views: frozen msgspec Structs rather than frozen dataclasses, since one is made per
# pod of a cluster and a Struct is made ~20x faster (a frozen dataclass sets each field
# through object.__setattr__). Neither holds a reference cycle: gc=False, as above.

class NodeView(msgspec.Struct, frozen=True, gc=False):
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    gpus_allocatable: int
    unschedulable: bool
    ready: bool

    @classmethod
    def from_object(cls, obj: dict) -> "NodeView":
        return cls.from_fields(_fields(obj, NodeFields, "Node"))

    @classmethod
    def from_fields(cls, node: NodeFields) -> "NodeView":
        meta, spec, status = node.metadata, node.spec, node.status
        ready = False
        for condition in (status and status.conditions) or ():
            if condition.type == "Ready" and condition.status == "True":
                ready = True
                break
        return cls(meta.name, _frozen(meta.labels), _frozen(meta.annotations),
                   _gpus(status.allocatable) if status else 0, bool(spec and spec.unschedulable), ready)


class PodView(msgspec.Struct, frozen=True, gc=False):
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
    # Asks for NVIDIA devices that are not whole GPUs (MIG slices, shared GPUs), which `gpus`
    # does not count; read only for a pod that asks for no whole GPU.
    nvidia_slices: bool = False

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
    def asks_nvidia(self) -> bool:
        """Asks for some NVIDIA device: whole GPUs, MIG slices or shared GPUs."""
        return self.gpus > 0 or self.nvidia_slices

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
        return cls.from_fields(_fields(obj, PodFields, "Pod"))

    @classmethod
    def from_fields(cls, pod: PodFields) -> "PodView":
        # Called once per pod of a cluster (50,000 at fleet size): plain loops, no
        # generators, positional arguments, and the common cases (no GPU asked for, no
        # owner, no unschedulable condition) kept cheap.
        meta, spec, status = pod.metadata, pod.spec, pod.status
        gpus = 0
        for container in (spec and spec.containers) or ():
            resources = container.resources
            if resources:
                requests, limits = resources.requests, resources.limits
                if (requests and requests.get(GPU_RESOURCE)) or (limits and limits.get(GPU_RESOURCE)):
                    gpus += _gpus(requests) or _gpus(limits)
        owners = meta.ownerReferences or ()
        unschedulable = None
        for condition in (status and status.conditions) or ():
            if condition.type == "PodScheduled":
                if condition.status == "False" and condition.reason == "Unschedulable":
                    unschedulable = condition.message or ""
                break
        return cls(meta.namespace or "", meta.name, meta.uid or "", spec.nodeName if spec else None,
                   (status.phase if status else None) or "Pending", _frozen(meta.labels), _frozen(meta.annotations),
                   gpus, owners, bool(meta.deletionTimestamp), meta.creationTimestamp or "",
                   unschedulable, meta.resourceVersion or "", gpus == 0 and asks_nvidia_device(spec))


@dataclass(frozen=True)
class ClusterSnapshot:
    taken_at: datetime
    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...]
    _by_node: Mapping[str, tuple[PodView, ...]] = field(default_factory=dict, repr=False, compare=False)
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
        return self._requested.get(node_name, 0)

    def gpus_free(self, node_name: str) -> int:
        node = self._nodes.get(node_name)
        return max(node.gpus_allocatable - self.gpus_requested(node_name), 0) if node else 0

    # Indexes made on first use, once per snapshot (not every reader asks for them: the GPU
    # map never asks who owns a pod).
    @functools.cached_property
    def _by_owner(self) -> Mapping[str, tuple[PodView, ...]]:
        by_owner: dict[str, list[PodView]] = {}
        for pod in self.pods:
            for owner in pod.owners:   # the controller, as `PodView.controller` finds it
                if owner.controller:
                    listed = by_owner.get(owner.uid)
                    if listed is None:
                        by_owner[owner.uid] = [pod]
                    else:
                        listed.append(pod)
                    break
        return MappingProxyType({k: tuple(v) for k, v in by_owner.items()})

    @functools.cached_property
    def _requested(self) -> Mapping[str, int]:
        requested: dict[str, int] = {}
        for node_name, pods in self._by_node.items():
            total = 0
            for pod in pods:
                if pod.gpus and pod.live:
                    total += pod.gpus
            requested[node_name] = total
        return MappingProxyType(requested)

    @classmethod
    def build(cls, *, taken_at: datetime, nodes: Iterable[NodeView], pods: Iterable[PodView]) -> "ClusterSnapshot":
        nodes, pods = tuple(nodes), tuple(pods)
        by_node: dict[str, list[PodView]] = {}
        for pod in pods:   # 50,000 at fleet size: a plain loop, no list made per lookup
            node_name = pod.node_name
            if node_name:
                listed = by_node.get(node_name)
                if listed is None:
                    by_node[node_name] = [pod]
                else:
                    listed.append(pod)
        return cls(taken_at=taken_at, nodes=nodes, pods=pods,
                   _by_node=MappingProxyType({k: tuple(v) for k, v in by_node.items()}),
                   _nodes=MappingProxyType({n.name: n for n in nodes}))
