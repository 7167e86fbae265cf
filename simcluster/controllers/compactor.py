"""kube-apiserver's etcd compactor (`--etcd-compaction-interval`, 5 minutes upstream).

Every interval of simulated time the history is compacted up to the resourceVersion the
previous pass saw, so between one and two intervals of history remain: a watch resuming
from an older version, or a LIST continue token issued before that, then answers 410
Expired. Off by default (`spec.etcd_compaction_interval_seconds: 0`): the history is then
bounded only by its length (the store's `history` events).
"""
from __future__ import annotations

from datetime import datetime, timedelta


class CompactorController:
    name = "compactor"

    def __init__(self) -> None:
        self._next: datetime | None = None
        self._seen_rv = 0   # what the previous pass saw: the next pass compacts up to it

    def reconcile(self, sim) -> None:
        interval = sim.settings.etcd_compaction_interval_seconds
        if not interval:
            return
        now = sim.clock.now()
        if self._next is not None and now < self._next:
            return
        if self._next is not None:
            sim.store.compact(self._seen_rv)
        self._seen_rv = sim.store.resource_version
        self._next = now + timedelta(seconds=interval)
        sim.wake_at(self._next)
