"""Injected faults: latency, 5xx, 429 throttling, 409 on writes and dropped watches.

Configured with `PUT /simcluster/v1/faults` and drawn from one seeded `random.Random`,
so a sequence of requests meets the same faults on every run. Every request draws the
same number of random numbers whatever it is, which keeps the sequence stable when a
test adds a read here or there. Faults never touch `/simcluster/` paths or discovery.
`GET /simcluster/v1/faults` also counts what was injected since the last configuration
(`injected`: errors, throttles, conflicts, delayed requests and watches cut), so a chaos run
can say how many faults its operations met.
"""
from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, field

from . import errors

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
VERBS = {"get", "list", "watch"} | WRITE_VERBS


class FaultError(ValueError):
    """A fault configuration that makes no sense."""


@dataclass
class FaultSpec:
    seed: int = 0
    latency_ms: float = 0.0
    error_rate: float = 0.0        # 0..1: 500 InternalError
    throttle_rate: float = 0.0     # 0..1: 429 TooManyRequests with Retry-After
    conflict_rate: float = 0.0     # 0..1: 409 Conflict, writes only
    drop_watch_after: float | None = None   # wall seconds before a watch stream is cut
    match: dict = field(default_factory=dict)   # {"verbs": [...], "resources": [...]}

    @classmethod
    def from_json(cls, body) -> "FaultSpec":
        if not isinstance(body, dict):
            raise FaultError("faults must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(body) - known)
        if unknown:
            raise FaultError(f"unknown fault field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        spec = cls(**body)
        if not isinstance(spec.seed, int):
            raise FaultError(f"seed must be an integer, got {spec.seed!r}")
        for name in ("error_rate", "throttle_rate", "conflict_rate"):
            value = getattr(spec, name)
            if not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise FaultError(f"{name} must be a number between 0 and 1, got {value!r}")
        if not isinstance(spec.latency_ms, (int, float)) or spec.latency_ms < 0:
            raise FaultError(f"latency_ms must be a number >= 0, got {spec.latency_ms!r}")
        if spec.drop_watch_after is not None and (
                not isinstance(spec.drop_watch_after, (int, float)) or spec.drop_watch_after < 0):
            raise FaultError(f"drop_watch_after must be a number of seconds >= 0, got {spec.drop_watch_after!r}")
        if not isinstance(spec.match, dict) or set(spec.match) - {"verbs", "resources"}:
            raise FaultError('match must be an object with optional "verbs" and "resources" lists')
        bad_verbs = set(spec.match.get("verbs") or ()) - VERBS
        if bad_verbs:
            raise FaultError(f"unknown verb(s) in match: {', '.join(sorted(bad_verbs))}; known: {', '.join(sorted(VERBS))}")
        return spec


@dataclass
class Decision:
    latency_seconds: float = 0.0
    error: errors.ApiError | None = None
    drop_watch_after: float | None = None


class Faults:
    def __init__(self):
        self._lock = threading.Lock()
        self._spec: FaultSpec | None = None
        self._random = random.Random(0)
        self._injected = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {"internal_error": 0, "throttled": 0, "conflict": 0, "delayed": 0, "watch_dropped": 0}

    def configure(self, body) -> FaultSpec:
        spec = FaultSpec.from_json(body)
        with self._lock:
            self._spec = spec
            self._random = random.Random(spec.seed)
            self._injected = self._zero()
        return spec

    def clear(self) -> None:
        with self._lock:
            self._spec = None

    def describe(self) -> dict:
        with self._lock:
            return {"active": self._spec is not None, **(asdict(self._spec) if self._spec else {}),
                    "injected": dict(self._injected)}

    def watch_dropped(self) -> None:
        """A watch stream was cut at its injected deadline (before the client's own timeout)."""
        with self._lock:
            self._injected["watch_dropped"] += 1

    def decide(self, verb: str, resource: str, name: str | None) -> Decision:
        with self._lock:
            spec = self._spec
            if spec is None or not self._matches(spec, verb, resource):
                return Decision()
            error_draw, throttle_draw, conflict_draw = (self._random.random() for _ in range(3))
        decision = Decision(latency_seconds=spec.latency_ms / 1000.0)
        if verb == "watch":
            decision.drop_watch_after = spec.drop_watch_after
        kind = None
        if error_draw < spec.error_rate:
            decision.error, kind = errors.internal("simcluster injected fault: internal error"), "internal_error"
        elif throttle_draw < spec.throttle_rate:
            decision.error = errors.too_many_requests("simcluster injected fault: the server is throttling requests")
            kind = "throttled"
        elif verb in WRITE_VERBS and conflict_draw < spec.conflict_rate:
            decision.error, kind = errors.conflict(resource, name or "", "", ), "conflict"
        with self._lock:
            if kind:
                self._injected[kind] += 1
            if decision.latency_seconds:
                self._injected["delayed"] += 1
        return decision

    @staticmethod
    def _matches(spec: FaultSpec, verb: str, resource: str) -> bool:
        verbs = spec.match.get("verbs")
        resources = spec.match.get("resources")
        return (not verbs or verb in verbs) and (not resources or resource in resources)
