"""Waiting, in a test, until PostgreSQL shows backends blocked on a lock: how a race test
knows both sides are in flight without a fixed sleep."""
from __future__ import annotations

import time

from django.db import connections


def backends_waiting_for_a_lock(count: int = 1, *, query_like: str | None = None, limit_s: float = 20.0) -> bool:
    """Whether, within `limit_s`, at least `count` backends of this database wait on a lock
    (only those running a statement LIKE `query_like`, when given). Polled on a connection of
    its own, PostgreSQL's own view (pg_stat_activity)."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    params: list[str] = []
    if query_like is not None:
        sql, params = sql + " AND query LIKE %s", [query_like]
    deadline = time.monotonic() + limit_s
    probe = connections.create_connection("default")
    try:
        while time.monotonic() < deadline:
            with probe.cursor() as cursor:
                cursor.execute(sql, params)
                if cursor.fetchone()[0] >= count:
                    return True
        return False
    finally:
        probe.close()
