"""The simulated clock: manual (tests advance it) or running at `speed` times real time."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

UTC = timezone.utc


def rfc3339(moment: datetime) -> str:
    """Kubernetes' metav1.Time format: seconds precision, trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


class SimClock:
    """`speed=None` is a manual clock: time moves only through `advance`/`set`."""

    def __init__(self, *, start: datetime | None = None, speed: float | None = None):
        self._lock = threading.Lock()
        self._base = (start or datetime.now(UTC)).astimezone(UTC)
        self._mono = time.monotonic()
        self.speed = speed

    @property
    def manual(self) -> bool:
        return self.speed is None

    def now(self) -> datetime:
        with self._lock:
            if self.speed is None:
                return self._base
            return self._base + timedelta(seconds=(time.monotonic() - self._mono) * self.speed)

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("the simulated clock never goes back")
        with self._lock:
            self._base += timedelta(seconds=seconds)
        return self.now()

    def set(self, moment: datetime) -> None:
        """Move forward to `moment` (ignored when already past it)."""
        with self._lock:
            current = self._base if self.speed is None else \
                self._base + timedelta(seconds=(time.monotonic() - self._mono) * self.speed)
            if moment > current:
                self._base += moment - current
