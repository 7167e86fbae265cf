"""The garbage collector, after pkg/controller/garbagecollector.

- A dependent whose owners are all gone is deleted (Background). An owner is gone when
  it was erased from this cluster. A reference to an owner the scenario never had (a
  partial `kubectl get -o json` dump, a test fixture) is left alone: the simulation
  cannot know that owner is absent rather than just not loaded, and a rehearsal on a
  copy of production must not lose the pods it was given.
- A dependent that keeps at least one owner loses only the references that dangle.
- An owner deleted with `propagationPolicy=Foreground` carries the `foregroundDeletion`
  finalizer: its dependents are deleted, and once none is left the finalizer is removed,
  which lets the store erase the owner.
Orphan propagation is done by the store at delete time.
"""
from __future__ import annotations

from ..store import copy
from ._util import is_deleting

FOREGROUND = "foregroundDeletion"


class GarbageCollectorController:
    name = "garbagecollector"

    def reconcile(self, sim) -> None:
        store = sim.store
        objects = store.every()
        removed = store.removed_uids
        dependents: dict[str, list[tuple[object, dict]]] = {}
        for rtype, obj in objects:
            refs = obj["metadata"].get("ownerReferences")
            if not refs:
                continue
            for ref in refs:
                dependents.setdefault(ref.get("uid"), []).append((rtype, obj))
            alive = [r for r in refs if r.get("uid") not in removed]
            if len(alive) == len(refs):
                continue
            meta = obj["metadata"]
            if not alive:
                if not is_deleting(obj):
                    store.delete(rtype, meta.get("namespace"), meta["name"])
                continue
            new = copy(obj)
            new["metadata"]["ownerReferences"] = alive
            store.put(rtype, new)
        for rtype, owner in objects:
            meta = owner["metadata"]
            if not is_deleting(owner) or FOREGROUND not in (meta.get("finalizers") or ()):
                continue
            waiting = [(t, d) for t, d in dependents.get(meta["uid"], ())
                       if store.get(t, d["metadata"].get("namespace"), d["metadata"]["name"]) is not None]
            for dtype, dependent in waiting:
                if not is_deleting(dependent):
                    store.delete(dtype, dependent["metadata"].get("namespace"), dependent["metadata"]["name"],
                                 propagation="Foreground")
            if not any(store.get(t, d["metadata"].get("namespace"), d["metadata"]["name"]) is not None
                       for t, d in waiting):
                new = copy(owner)
                new["metadata"]["finalizers"] = [f for f in meta["finalizers"] if f != FOREGROUND]
                store.put(rtype, new)
