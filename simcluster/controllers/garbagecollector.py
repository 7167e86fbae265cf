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
        # Owners deleted with Foreground wait for their dependents: index only those.
        waiting_owners = {obj["metadata"]["uid"]: (rtype, obj) for rtype, obj in objects
                          if is_deleting(obj) and FOREGROUND in (obj["metadata"].get("finalizers") or ())}
        dependents: dict[str, list[tuple[object, dict]]] = {uid: [] for uid in waiting_owners}
        for rtype, obj in objects:
            refs = obj["metadata"].get("ownerReferences")
            if not refs:
                continue
            for ref in refs:
                if ref.get("uid") in dependents:
                    dependents[ref["uid"]].append((rtype, obj))
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
        for uid, (rtype, owner) in waiting_owners.items():
            remaining = False
            for dtype, dependent in dependents[uid]:
                dmeta = dependent["metadata"]
                current = store.get(dtype, dmeta.get("namespace"), dmeta["name"])
                if current is None:
                    continue
                if not is_deleting(current):
                    store.delete(dtype, dmeta.get("namespace"), dmeta["name"], propagation="Foreground")
                remaining = remaining or store.get(dtype, dmeta.get("namespace"), dmeta["name"]) is not None
            if not remaining:
                new = copy(owner)
                new["metadata"]["finalizers"] = [f for f in owner["metadata"]["finalizers"] if f != FOREGROUND]
                store.put(rtype, new)
