"""Leases on rows: which process acts on a row (a defrag job, a campaign, a prune run, a
binpack run, a runbook action) until a given time, so that a process killed mid-way leaves
the row to be taken over once its lease lapses.

A lease is two columns of the row: its holder (`lease_holder`) and when it lapses. Renewing
is one conditional UPDATE that only the holder's row matches, so a process that lost its
lease (taken over meanwhile) learns it from the answer, never writes over the new holder,
and stops acting. `LeaseHeartbeat` renews a lease from a thread of its own, so that work
blocked in slow calls keeps it. No app's model is imported here: each passes its own rows.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import connections
from django.db.models import QuerySet

log = logging.getLogger(__name__)


def task_lease_owner(task) -> str:
    """Who holds a lease for a bound Celery task: the message's id, so that a message
    redelivered after its worker was killed (acks_late, reject_on_worker_lost) takes its own
    lease back at once instead of waiting it out; a call outside a worker, this process."""
    task_id = getattr(task.request, "id", None)
    return f"task:{task_id}" if task_id else f"local:{socket.gethostname()}:{os.getpid()}"


def lease_holder(role: str) -> str:
    """Who holds a lease: the process (host and pid) and a token unique to this holding,
    so that two holdings by one process are told apart."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_renew(rows: QuerySet, *, holder: str, until: datetime, holder_field: str = "lease_owner",
                until_field: str = "lease_expires_at", **fields) -> bool:
    """Push the lease of the one row of `rows` that `holder` still holds to `until`, writing
    `fields` in the same UPDATE. `rows` narrows to the row and the state the lease covers
    (e.g. `filter(pk=..., status=RUNNING)`). False when the lease was lost."""
    return rows.filter(**{holder_field: holder}).update(**{until_field: until}, **fields) == 1


class LeaseHeartbeat:
    """Calls `renew` (True: the lease is still held) every `every_seconds` from a thread of
    its own while the `with` block acts on the row, so that a step blocked in a slow API call
    (a request may wait 30 s, the gateway retries) keeps its lease. `lost` is set once a
    renewal finds the lease taken (it lapsed and another process acquired it): the holder
    then stops at its next chance. The thread dies with its process, so a killed worker's
    lease lapses on time. A renewal that fails (the database blinked) is tried again at the
    next beat; `name` names the thread and the log lines."""

    def __init__(self, *, renew: Callable[[], bool], every_seconds: float, name: str):
        self.renew, self.every_seconds, self.name = renew, every_seconds, name
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every_seconds)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every_seconds):
                try:
                    held = self.renew()
                except Exception:  # noqa: BLE001 - the database blinked: the next beat tries again
                    log.warning("%s: lease renewal failed", self.name, exc_info=True)
                    continue
                if not held:
                    log.warning("%s: lease lost", self.name)
                    self.lost.set()
                    return
        finally:
            connections.close_all()   # this thread's own connections only
