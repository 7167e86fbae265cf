"""Recording activity: the hot path product code calls on every interesting action.

Dormancy needs only an approximate sense of activity, so at most one database
write per org per throttle window happens across all processes:

1. in-process fast path: a dict of deadlines on the monotonic clock; a throttled call
   is one dict lookup and one comparison (about what a bare `Signal.send()` costs);
2. cross-process: an atomic `cache.add` in Redis, which only one process wins per window;
3. the database write (`org_mark_active`), which also wakes a dormant org.

If Redis is down, step 2 is skipped and activity still reaches the database (the
in-process fast path keeps each process to one write per window).
"""
from __future__ import annotations

import logging
import time
from datetime import datetime

from django.conf import settings
from django.core.cache import cache

from orgs.models import DormancySwitch

logger = logging.getLogger(__name__)

_monotonic = time.monotonic
_deadlines: dict[str, float] = {}
CACHE_PREFIX = "orgs:activity:"


def org_activity_record(org_slug: str, *, at: datetime | None = None) -> bool:
    """Record activity of an org. Returns True when it reached the database.

    Raises `Org.DoesNotExist` for an unknown org (the first time within a window).
    """
    now_mono = _monotonic()
    if _deadlines.get(org_slug, 0.0) > now_mono:
        return False
    return _record_slow(org_slug, now_mono, at) is not None


def org_activity_record_result(org_slug: str, *, at: datetime | None = None):
    """The same, returning what the write did (`MarkActiveResult`: did the org wake, did
    its wake reach the queue), or None when throttled."""
    now_mono = _monotonic()
    if _deadlines.get(org_slug, 0.0) > now_mono:
        return None
    return _record_slow(org_slug, now_mono, at)


def _record_slow(org_slug: str, now_mono: float, at: datetime | None):
    window = settings.ORGS_ACTIVITY_THROTTLE_SECONDS
    _deadlines[org_slug] = now_mono + window
    try:
        won = cache.add(CACHE_PREFIX + org_slug, 1, timeout=window)
    except Exception as exc:  # noqa: BLE001 - any cache failure: keep the org warm, write to the DB
        logger.warning("activity throttle cache unavailable (%s); writing activity of %s to the database",
                       exc, org_slug)
        won = True
    if not won:
        return None
    from orgs.services import org_mark_active

    try:
        result = org_mark_active(org_slug=org_slug, at=at, cause=DormancySwitch.Cause.ACTIVITY, actor=None)
    except Exception:
        # The write did not happen: let the next call try again instead of losing a window.
        _deadlines.pop(org_slug, None)
        try:
            cache.delete(CACHE_PREFIX + org_slug)
        except Exception:  # noqa: BLE001
            pass
        raise
    return result


def throttle_in_process(org_slug: str) -> None:
    """Hold this process's calls for `org_slug` until the window ends (Redis untouched)."""
    _deadlines[org_slug] = _monotonic() + settings.ORGS_ACTIVITY_THROTTLE_SECONDS


def throttle_reset() -> None:
    """Forget the in-process throttle (tests, and a process that was forked)."""
    _deadlines.clear()
