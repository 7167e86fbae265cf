"""Leases on rows: which process acts on a row (a defrag job, a prune run, a binpack run, a
runbook action) until a given time, so that a process killed mid-way leaves the row to be
taken over once its lease lapses.

A lease is two columns of the row: its holder (`lease_holder`) and when it lapses. Renewing
is one conditional UPDATE that only the holder's row matches, so a process that lost its
lease (taken over meanwhile) learns it from the answer, never writes over the new holder,
and stops acting. No app's model is imported here: each passes its own rows.
"""
from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime

from django.db.models import QuerySet


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
