"""The object store: what etcd plus the generic registry of kube-apiserver do.

Stored objects are immutable snapshots: every write stores a new dict, so a reader
that took a reference (a LIST being serialised, a watch event) never sees it change.
Code that wants to modify an object calls `copy(obj)` first and writes the copy back.
"""
from __future__ import annotations

import heapq
import threading
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from datetime import timedelta
from sys import intern
from typing import Callable, Iterable, Iterator, NamedTuple

import orjson
from sortedcontainers import SortedDict

from . import errors
from .clock import SimClock, rfc3339
from .resources import PODS, ResourceType
from .selectors import parse_field_selector, parse_label_selector

Validator = Callable[[ResourceType, dict, "dict | None"], None]


def copy(obj: dict) -> dict:
    """A deep copy of a JSON-shaped object (several times faster than copy.deepcopy)."""
    return orjson.loads(orjson.dumps(obj))


class WatchEvent(NamedTuple):
    rv: int
    type: str        # ADDED, MODIFIED, DELETED
    key: str         # ResourceType.key
    obj: dict
    old: dict | None = None   # the version before (MODIFIED, DELETED): selector transitions


class ListPage(NamedTuple):
    """One page of a LIST as the store reads it at `rv`."""
    items: list[dict]
    rv: int
    last_key: tuple[str, str] | None   # where the next page starts (None: this is the last)
    remaining: int | None              # objects after this page (only for lists without selectors)


class ExpiredView(Exception):
    """The version a paged LIST reads at has been compacted away (etcd's ErrCompacted)."""


# How many read views (a type at a resourceVersion) a paged LIST may resume from without
# re-reading the history: each holds the versions of what changed since its version.
_VIEW_CACHE_SIZE = 64


_NO_LABELS: dict = {}


def _obj_key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _compact(value):
    """`value` with its strings interned, in place: a stored pod repeats the same strings
    as its neighbours ("True", "Running", its node's and image's names, timestamps), and
    one shared copy of each instead of one per object is a fifth of a loaded store."""
    kind = type(value)
    if kind is str:
        return intern(value)
    if kind is dict:
        for key, item in value.items():
            kind = type(item)
            if kind is str:
                value[key] = intern(item)
            elif kind is dict or kind is list:
                _compact(item)
    elif kind is list:
        for at, item in enumerate(value):
            kind = type(item)
            if kind is str:
                value[at] = intern(item)
            elif kind is dict or kind is list:
                _compact(item)
    return value


_MISSING = object()


def _shared(new, old):
    """`new` (a version about to be stored) holding `old`'s parts wherever they are the
    same JSON (same types, same values, same key order), the rest compacted; `old`
    itself when everything is the same. Stored versions are immutable, so two versions
    may share parts: the version a write replaces, which the history keeps while a watch
    or a paged LIST may read it, then costs only what the write changed."""
    kind = type(new)
    if kind is not type(old):
        return _compact(new)
    if kind is dict:
        same = len(new) == len(old)
        for key, item in new.items():
            before = old.get(key, _MISSING)
            if before is item:
                continue
            after = _compact(item) if before is _MISSING else _shared(item, before)
            if after is not item:
                new[key] = after
            if after is not before:
                same = False
        return old if same and all(a == b for a, b in zip(new, old)) else new
    if kind is list:
        same = len(new) == len(old)
        for at, item in enumerate(new):
            before = old[at] if at < len(old) else _MISSING
            if before is item:
                continue
            after = _compact(item) if before is _MISSING else _shared(item, before)
            if after is not item:
                new[at] = after
            if after is not before:
                same = False
        return old if same else new
    if kind is str:
        return old if new == old else intern(new)
    if kind is int or kind is bool or new is None:
        return old if new == old else new
    return new   # floats: -0.0 == 0.0 but is not the same JSON


def _node_excluded(field_selector: str | None) -> str | None:
    """X when the selector is just `spec.nodeName!=X` (X not empty): "every pod but those
    on node X", which the node index answers without reading each pod's spec."""
    if not field_selector or "," in field_selector:
        return None
    field, sep, value = field_selector.partition("!=")
    if sep and field.strip() == "spec.nodeName" and value.strip():
        return value.strip()
    return None


def _spec_part(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    def __init__(self, clock: SimClock, *, history: int = 200_000, history_seconds: float = 300.0,
                 validator: Validator | None = None):
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.validator = validator
        self._rv = 0
        # Per type, objects by (namespace, name) in key order (etcd's key space): a paged
        # LIST resumes after the last key it returned instead of re-reading the type.
        self._objects: dict[str, SortedDict] = defaultdict(SortedDict)
        # (type key, rv) -> [rv scanned up to, {key: the object's version at rv, None if absent}]
        self._views: OrderedDict[tuple[str, int], list] = OrderedDict()
        # Per type, its objects in key order as a plain list, made by the first whole read
        # after a write to the type: reads between writes (most LISTs) copy or filter it
        # instead of looking each key up again.
        self._in_order: dict[str, list[dict]] = {}
        self._pods_by_node: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._compacted_rv = 0   # events at or below this rv are no longer in the history
        # Writes are forgotten `history_seconds` of real time after they happen (0: kept
        # until `history` later events push them out), as kube-apiserver has etcd compact
        # its revisions every 5 minutes: a watch or a LIST continue token from before then
        # answers 410. The history holds the version each write replaced, so this is what
        # bounds the memory of a store that keeps being written. One mark per second of
        # writes: (its first write's time, its last write's time, the last write's rv).
        self.history_seconds = history_seconds
        self._marks: deque[tuple[float, float, int]] = deque()
        self.monotonic = time.monotonic
        # Uids of objects erased from this store: the garbage collector's "owner is gone".
        self.removed_uids: set[str] = set()
        self.write_listeners: list[Callable[[WatchEvent], None]] = []
        # id(stored version) -> (that version, its JSON): see `encode_items`.
        self._encoded: dict[int, tuple[dict, bytes]] = {}

    # ---- reads ---------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict | None:
        return self._objects[rtype.key].get((namespace or "", name))

    def require(self, rtype: ResourceType, namespace: str | None, name: str) -> dict:
        obj = self.get(rtype, namespace, name)
        if obj is None:
            raise errors.not_found(rtype.plural, name, rtype.group)
        return obj

    def by_uid(self, uid: str) -> tuple[ResourceType, dict] | None:
        found = self._by_uid.get(uid)
        if not found:
            return None
        rtype, namespace, name = found
        obj = self.get(rtype, namespace, name)
        return (rtype, obj) if obj is not None else None

    def all(self, rtype: ResourceType, namespace: str | None = None) -> Iterable[dict]:
        objects = self._objects[rtype.key]
        if namespace is None:
            return list(objects.values())
        return [o for (ns, _), o in objects.items() if ns == namespace]

    def every(self) -> list[tuple[ResourceType, dict]]:
        """Every stored object with its type (the garbage collector's graph)."""
        with self.lock:
            return [(rtype, self._objects[rtype.key][(namespace, name)])
                    for rtype, namespace, name in self._by_uid.values()]

    def pods_on_node(self, node_name: str) -> list[dict]:
        return list(self._pods_by_node.get(node_name, {}).values())

    def list(self, rtype: ResourceType, namespace: str | None = None, *,
             label_selector: str | None = None, field_selector: str | None = None) -> tuple[list[dict], int]:
        """Matching objects in (namespace, name) order, and the list's resourceVersion."""
        page = self.list_page(rtype, namespace, label_selector=label_selector, field_selector=field_selector)
        return page.items, page.rv

    def list_page(self, rtype: ResourceType, namespace: str | None = None, *,
                  label_selector: str | None = None, field_selector: str | None = None,
                  limit: int = 0, after: tuple[str, str] | None = None, at_rv: int | None = None) -> ListPage:
        """A page of matching objects in key order, as they stood at `at_rv` (now when None).

        Like an etcd range read with a limit at a revision: the page starts after the key
        `after`, holds at most `limit` matches (0: no limit), and costs the keys it reads
        plus the writes since `at_rv`, never a pass over the whole type. `last_key` is set
        when another object exists after the page, whether or not it matches (etcd's
        `more`). Raises `ExpiredView` when `at_rv` is older than the history reaches.
        """
        label_match = parse_label_selector(label_selector)
        field_match, exact = parse_field_selector(field_selector, rtype.plural)
        with self.lock:
            rv = self._rv if at_rv is None else at_rv
            if rv < self._compacted_rv:
                raise ExpiredView(rv)
            if rv > self._rv:
                raise ValueError(f"resourceVersion {rv} is newer than the store's {self._rv}")
            changed = self._changed_since(rtype, rv) if rv < self._rv else {}
            objects = self._objects[rtype.key]
            namespace = namespace or exact.get("metadata.namespace") or None
            name = exact.get("metadata.name")
            if namespace is not None:
                low, high = (namespace, ""), (namespace + "\x00",)
            else:
                low, high = None, None
            if after is not None and (low is None or after >= low):
                low, low_inclusive = after, False
            else:
                low_inclusive = True

            def in_range(key: tuple[str, str]) -> bool:
                return (low is None or key > low or (low_inclusive and key == low)) and \
                    (high is None or key < high)

            if rtype is PODS and exact.get("spec.nodeName"):
                # The index holds bound pods only: spec.nodeName= (unbound) scans them all.
                indexed = self._pods_by_node.get(exact["spec.nodeName"], {})
                keys: Iterator = iter(sorted(k for k in {*indexed, *changed} if in_range(k)))
            else:
                current = objects.irange(low, high, inclusive=(low_inclusive, False))
                gone = sorted(k for k, v in changed.items() if v is not None and k not in objects and in_range(k))
                keys = heapq.merge(current, gone) if gone else current
            items: list[dict] = []
            last_key = None
            if not changed and not limit and name is None:
                # A whole read of the current state (every unpaged LIST): only the filters per object.
                if low is None and high is None and not exact.get("spec.nodeName"):
                    in_order = self._in_order.get(rtype.key)
                    if in_order is None:
                        in_order = self._in_order[rtype.key] = list(objects.values())
                    found: Iterable = in_order
                    node = _node_excluded(field_selector) if rtype is PODS else None
                    if node is not None:
                        on_node = {id(obj) for obj in self._pods_by_node.get(node, {}).values()}
                        found = [obj for obj in in_order if id(obj) not in on_node]
                        field_match = None   # what the index just answered
                else:
                    get = objects.get
                    found = (obj for key in keys if (obj := get(key)) is not None)
                if label_match is None and field_match is None:
                    items = list(found)
                else:
                    for obj in found:
                        if label_match is not None and not label_match(obj["metadata"].get("labels") or _NO_LABELS):
                            continue
                        if field_match is not None and not field_match(obj):
                            continue
                        items.append(obj)
                return ListPage(items, rv, None, None)
            in_order = self._in_order.get(rtype.key)
            if not changed and name is None and in_order is not None and not exact.get("spec.nodeName"):
                # A page of the current state while the type's key-ordered list is kept
                # (no write since the last whole read): the page's bounds by bisection,
                # then a slice of that list, with no lookup per key. A page never makes
                # the list (a copy of the whole type) itself.
                start = 0 if low is None else \
                    objects.bisect_left(low) if low_inclusive else objects.bisect_right(low)
                end = len(in_order) if high is None else objects.bisect_left(high)
                if label_match is None and field_match is None:
                    stop = min(end, start + limit) if limit else end
                    items = in_order[start:stop]
                else:
                    stop = start
                    while stop < end:
                        if limit and len(items) >= limit:
                            break
                        obj = in_order[stop]
                        stop += 1
                        if label_match is not None and not label_match(obj["metadata"].get("labels") or _NO_LABELS):
                            continue
                        if field_match is not None and not field_match(obj):
                            continue
                        items.append(obj)
                if stop >= end:
                    return ListPage(items, rv, None, None)
                remaining = end - stop if not label_selector and not field_selector else None
                return ListPage(items, rv, _obj_key(in_order[stop - 1]), remaining)
            for key in keys:
                obj = changed[key] if key in changed else objects.get(key)
                if obj is None:
                    continue
                if limit and len(items) >= limit:
                    break   # another object exists after the page
                last_key = key
                if name is not None and key[1] != name:
                    continue
                if label_match and not label_match(obj["metadata"].get("labels") or _NO_LABELS):
                    continue
                if field_match and not field_match(obj):
                    continue
                items.append(obj)
            else:
                return ListPage(items, rv, None, None)
            remaining = None
            if not label_selector and not field_selector:
                remaining = self._count_after(objects, changed, last_key, high)
            return ListPage(items, rv, last_key, remaining)

    @staticmethod
    def _count_after(objects: SortedDict, changed: dict, after: tuple[str, str],
                     high: tuple | None) -> int:
        """Objects (as of the view) after `after` and below `high`."""
        end = len(objects) if high is None else objects.bisect_left(high)
        count = end - objects.bisect_right(after)
        for key, version in changed.items():
            if key > after and (high is None or key < high):
                if key in objects and version is None:
                    count -= 1
                elif key not in objects and version is not None:
                    count += 1
        return count

    def _changed_since(self, rtype: ResourceType, rv: int) -> dict:
        """{key: version at `rv` (None: it did not exist)} for the objects of `rtype`
        written after `rv`: what a read at `rv` must see instead of the current state.
        Kept per view, so each further page reads only the writes since the last one."""
        view_key = (rtype.key, rv)
        view = self._views.get(view_key)
        if view is None:
            view = self._views[view_key] = [rv, {}]
            if len(self._views) > _VIEW_CACHE_SIZE:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(view_key)
        scanned, versions = view
        if scanned < self._rv:
            for event in self.events_since(scanned):
                if event.key == rtype.key:
                    versions.setdefault(_obj_key(event.obj), event.old if event.type != "ADDED" else None)
            view[0] = self._rv
        return versions

    def encode_items(self, rtype: ResourceType, items: list[dict]) -> list[bytes]:
        """The JSON of each of `items` (objects this store returned), encoded once per
        stored version and then reused, as kube-apiserver's watch cache keeps each object's
        serialized form (its cachingObject): a LIST copies bytes instead of re-encoding
        every object of a type that clients read again and again. Stored versions are
        immutable snapshots, so a version's bytes never go stale; a write drops the bytes
        of the version it replaces. Versions read from the past (a paged LIST at an older
        resourceVersion) are encoded but not kept."""
        cache = self._encoded
        dumps = orjson.dumps
        out: list[bytes] = []
        append = out.append
        misses: list[tuple[int, dict]] = []
        for obj in items:
            entry = cache.get(id(obj))
            if entry is not None and entry[0] is obj:
                append(entry[1])
            else:
                misses.append((len(out), obj))
                append(b"")
        if misses:
            for at, obj in misses:
                # orjson's bytes keep the capacity it grew its buffer to (about three
                # times a pod's JSON): a kept copy is cut to the JSON's length.
                out[at] = memoryview(dumps(obj)).tobytes()
            objects = self._objects[rtype.key]
            with self.lock:
                for at, obj in misses:
                    if objects.get(_obj_key(obj)) is obj:
                        cache[id(obj)] = (obj, out[at])
        return out

    # ---- writes --------------------------------------------------------------------
    def _now(self) -> str:
        return rfc3339(self.clock.now())

    def _record(self, event_type: str, rtype: ResourceType, obj: dict, old: dict | None = None) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].rv
        event = WatchEvent(self._rv, event_type, rtype.key, obj, old)
        self._history.append(event)
        if self.history_seconds:
            now = self.monotonic()
            marks = self._marks
            if marks and now - marks[-1][0] < 1.0:
                marks[-1] = (marks[-1][0], now, self._rv)
            else:
                marks.append((now, now, self._rv))
            horizon, cut = now - self.history_seconds, None
            while marks and marks[0][1] <= horizon:
                cut = marks.popleft()[2]
            if cut is not None:
                self.compact(cut)
        for listener in self.write_listeners:
            listener(event)
        self.changed.notify_all()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _index(self, rtype: ResourceType, obj: dict, old: dict | None) -> None:
        if rtype is not PODS:
            return
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        old_node = (old or {}).get("spec", {}).get("nodeName")
        new_node = obj.get("spec", {}).get("nodeName")
        if old_node and old_node != new_node:
            self._pods_by_node[old_node].pop(key, None)
        if new_node:
            self._pods_by_node[new_node][key] = obj

    def _unindex(self, rtype: ResourceType, obj: dict) -> None:
        if rtype is PODS and (node := obj.get("spec", {}).get("nodeName")):
            self._pods_by_node[node].pop((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]), None)

    def create(self, rtype: ResourceType, obj: dict, *, keep_metadata: bool = False,
               dry_run: bool = False, owned: bool = False) -> dict:
        """Create `obj`. `keep_metadata` keeps a given uid, creationTimestamp and status
        (loading a scenario or a `kubectl get -o json` dump). `owned` says the caller
        hands `obj` over and keeps no reference to it (a freshly parsed scenario), so
        it is stored as is instead of as a copy."""
        if not owned:
            obj = copy(obj)
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        with self.lock:
            if rtype.namespaced and not meta.get("namespace"):
                raise errors.bad_request(f"{rtype.kind} must have a namespace")
            if not rtype.namespaced:
                meta.pop("namespace", None)
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                else:
                    raise errors.invalid(rtype.kind, "", [("metadata.name", "Required value: name or generateName is required")], rtype.group)
            key = (meta.get("namespace", ""), meta["name"])
            if key in self._objects[rtype.key]:
                raise errors.already_exists(rtype.plural, meta["name"], rtype.group)
            if self.validator:
                self.validator(rtype, obj, None)
            if not keep_metadata or not meta.get("uid"):
                meta["uid"] = str(uuid.uuid4())
            if not keep_metadata or not meta.get("creationTimestamp"):
                meta["creationTimestamp"] = self._now()
            if not keep_metadata:
                meta.pop("deletionTimestamp", None)
                meta.pop("deletionGracePeriodSeconds", None)
            meta["generation"] = 1 if not keep_metadata else meta.get("generation", 1)
            if dry_run:
                return obj
            meta["resourceVersion"] = self._next_rv()
            _compact(obj)
            self._objects[rtype.key][key] = obj
            self._in_order.pop(rtype.key, None)
            self._by_uid[meta["uid"]] = (rtype, key[0], key[1])
            self._index(rtype, obj, None)
            self._record("ADDED", rtype, obj)
            return obj

    def update(self, rtype: ResourceType, obj: dict, *, subresource: str | None = None,
               preserve_status: bool = False, check_rv: bool = True, dry_run: bool = False) -> dict:
        """Replace an object (PUT). A given, stale resourceVersion is a 409 Conflict.

        `subresource="status"` takes only the status from `obj`; `preserve_status` keeps
        the stored status (the main resource of a kind with a status subresource).
        """
        obj = copy(obj)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            old = self.require(rtype, meta.get("namespace") if rtype.namespaced else None, meta.get("name", ""))
            old_meta = old["metadata"]
            given_rv = meta.get("resourceVersion")
            if check_rv and given_rv and given_rv != old_meta["resourceVersion"]:
                raise errors.conflict(rtype.plural, old_meta["name"], rtype.group)
            if subresource == "status":
                new = copy(old)
                new["status"] = obj.get("status", {})
                if "managedFields" in meta:   # the API handler worked out ownership of the status write
                    if meta["managedFields"]:
                        new["metadata"]["managedFields"] = meta["managedFields"]
                    else:
                        new["metadata"].pop("managedFields", None)
            else:
                new = obj
                new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
                if preserve_status:
                    if "status" in old:
                        new["status"] = old["status"]
                    else:
                        new.pop("status", None)
                # Fields the client cannot change.
                for field in ("uid", "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds", "generation"):
                    if field in old_meta:
                        meta[field] = old_meta[field]
                    else:
                        meta.pop(field, None)
                if rtype.namespaced:
                    meta["namespace"] = old_meta["namespace"]
                if _spec_part(new) != _spec_part(old):
                    meta["generation"] = old_meta.get("generation", 1) + 1
            if self.validator:
                self.validator(rtype, new, old)
            if dry_run:
                return new
            return self._store_update(rtype, new, old)

    def _store_update(self, rtype: ResourceType, new: dict, old: dict) -> dict:
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self._graceful(rtype, new):
            return self._remove(rtype, new)
        meta["resourceVersion"] = self._next_rv()
        key = (meta.get("namespace", ""), meta["name"])
        replaced = self._objects[rtype.key].get(key)
        _shared(new, replaced if replaced is not None else old)
        self._objects[rtype.key][key] = new
        self._in_order.pop(rtype.key, None)
        if replaced is not None:
            self._encoded.pop(id(replaced), None)
        self._index(rtype, new, old)
        self._record("MODIFIED", rtype, new, old)
        return new

    def put(self, rtype: ResourceType, obj: dict) -> dict:
        """Controller write: store `obj` (already a private copy) as the new version,
        with no conflict check and no field protection."""
        with self.lock:
            meta = obj["metadata"]
            old = self.require(rtype, meta.get("namespace"), meta["name"])
            if _spec_part(obj) != _spec_part(old):
                meta["generation"] = old["metadata"].get("generation", 1) + 1
            return self._store_update(rtype, obj, old)

    @staticmethod
    def _graceful(rtype: ResourceType, obj: dict) -> bool:
        """A bound pod being deleted waits for its kubelet, whatever its finalizers."""
        return rtype is PODS and bool(obj.get("spec", {}).get("nodeName")) and \
            bool(obj["metadata"].get("deletionGracePeriodSeconds"))

    def _remove(self, rtype: ResourceType, obj: dict) -> dict:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        current = self._objects[rtype.key].pop(key, None)
        if current is None:
            raise errors.not_found(rtype.plural, meta["name"], rtype.group)
        self._in_order.pop(rtype.key, None)
        self._unindex(rtype, current)
        self._encoded.pop(id(current), None)
        self._by_uid.pop(meta.get("uid"), None)
        self.removed_uids.add(meta.get("uid"))
        final = copy(obj)
        final["metadata"]["resourceVersion"] = self._next_rv()
        _shared(final, current)
        self._record("DELETED", rtype, final, current)
        return final

    def remove(self, rtype: ResourceType, namespace: str | None, name: str) -> dict:
        """Erase an object now (kubelet done with a pod, finalizers cleared)."""
        with self.lock:
            return self._remove(rtype, self.require(rtype, namespace, name))

    def delete(self, rtype: ResourceType, namespace: str | None, name: str, *,
               propagation: str | None = None, grace_seconds: int | None = None,
               preconditions: dict | None = None, dry_run: bool = False) -> dict:
        """DELETE as the generic registry does it.

        Returns the object as it stands afterwards: with a deletionTimestamp while a
        grace period or finalizers hold it, or the final state once gone.
        - Background (default): gone now; the garbage collector removes dependents.
        - Foreground: a `foregroundDeletion` finalizer holds it until dependents are gone.
        - Orphan: dependents lose their ownerReference to it first.
        """
        propagation = propagation or "Background"
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"unsupported propagationPolicy {propagation!r}: "
                                     "must be Orphan, Background or Foreground")
        with self.lock:
            obj = self.require(rtype, namespace, name)
            meta = obj["metadata"]
            preconditions = preconditions or {}
            if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
                raise errors.conflict(rtype.plural, name, rtype.group,
                                      f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object meta: {meta['uid']}")
            if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != meta["resourceVersion"]:
                raise errors.conflict(rtype.plural, name, rtype.group,
                                      f"Precondition failed: ResourceVersion in precondition: {preconditions['resourceVersion']}, ResourceVersion in object meta: {meta['resourceVersion']}")
            if dry_run:
                return obj
            if propagation == "Orphan":
                self.orphan_dependents(meta["uid"])
            new = copy(obj)
            new_meta = new["metadata"]
            now = self.clock.now()
            if rtype is PODS and new.get("spec", {}).get("nodeName"):
                grace = grace_seconds if grace_seconds is not None else \
                    new["spec"].get("terminationGracePeriodSeconds", 30)
                if grace > 0:
                    if new_meta.get("deletionTimestamp"):
                        # A second delete may only shorten the grace period.
                        if grace >= new_meta.get("deletionGracePeriodSeconds", grace):
                            return obj
                    new_meta["deletionTimestamp"] = rfc3339(now + timedelta(seconds=grace))
                    new_meta["deletionGracePeriodSeconds"] = grace
                    return self._store_update(rtype, new, obj)
            if propagation == "Foreground" and self.dependents(meta["uid"]):
                finalizers = new_meta.setdefault("finalizers", [])
                if "foregroundDeletion" not in finalizers:
                    finalizers.append("foregroundDeletion")
            if new_meta.get("finalizers"):
                if not new_meta.get("deletionTimestamp"):
                    new_meta["deletionTimestamp"] = rfc3339(now)
                    new_meta["deletionGracePeriodSeconds"] = 0
                    return self._store_update(rtype, new, obj)
                return obj
            return self._remove(rtype, new)

    # ---- owners ----------------------------------------------------------------------
    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, dict]]:
        found = []
        for rtype, namespace, name in list(self._by_uid.values()):
            obj = self.get(rtype, namespace, name)
            if obj and any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or ()):
                found.append((rtype, obj))
        return found

    def orphan_dependents(self, owner_uid: str) -> None:
        with self.lock:
            for rtype, obj in self.dependents(owner_uid):
                new = copy(obj)
                refs = [r for r in new["metadata"].get("ownerReferences") or () if r.get("uid") != owner_uid]
                if refs:
                    new["metadata"]["ownerReferences"] = refs
                else:
                    new["metadata"].pop("ownerReferences", None)
                self._store_update(rtype, new, obj)

    # ---- watch -----------------------------------------------------------------------
    def events_since(self, rv: int) -> list[WatchEvent]:
        """Events after `rv`; 410 Gone when that version has been compacted away."""
        with self.lock:
            if rv < self._compacted_rv:
                raise errors.gone(f"too old resource version: {rv} ({self._compacted_rv})")
            if not self._history or self._history[-1].rv <= rv:
                return []
            # The history is ordered by rv: find the first event after rv by bisection.
            lo, hi = 0, len(self._history)
            while lo < hi:
                mid = (lo + hi) // 2
                if self._history[mid].rv <= rv:
                    lo = mid + 1
                else:
                    hi = mid
            return [self._history[i] for i in range(lo, len(self._history))]

    def compact(self, rv: int) -> None:
        """Forget the history up to `rv`, as etcd compaction does: watches from older
        versions then get 410 Gone."""
        with self.lock:
            while self._history and self._history[0].rv <= rv:
                self._history.popleft()
            self._compacted_rv = max(self._compacted_rv, rv)
            # Views read at compacted versions answer 410 from now on: their versions go too.
            for view_key in [k for k in self._views if k[1] < self._compacted_rv]:
                del self._views[view_key]

    def wait(self, rv: int, timeout: float) -> None:
        """Block until something is written after `rv`, or `timeout` seconds pass."""
        with self.lock:
            if self._rv <= rv:
                self.changed.wait(timeout)
