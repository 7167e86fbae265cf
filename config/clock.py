"""The one clock the product reads for "now" (services, tasks and beat).

Injected for tests and demos: with `CLOCK_OFFSET_FILE` set, the number of seconds in
that file is added to the wall clock, so a test can move a real worker and beat an hour
ahead by writing one number. Planning code never calls this: it is given `now`.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone


def offset_seconds() -> float:
    path = settings.CLOCK_OFFSET_FILE
    if not path:
        return 0.0
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return 0.0
    try:
        return float(text or 0)
    except ValueError as exc:
        raise ValueError(f"CLOCK_OFFSET_FILE {path!r} must hold a number of seconds, not {text!r}") from exc


def now() -> datetime:
    offset = offset_seconds()
    current = timezone.now()
    return current + timedelta(seconds=offset) if offset else current
