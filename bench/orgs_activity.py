"""The cost of a throttled activity (seed 004), as ratios to a floor measured in the same run.

floor: a bare `Signal.send()` with no receivers (what any signal-based hook costs at least)
1. `orgs.activity.org_activity_record(slug)` inside its throttle window   target ≤ 1
2. `orgs.signals.warmup.send(...)` inside the window (Django dispatch to one receiver)
                                                                           target ≤ 6

The org is recorded once for real first (SQLite in a temporary directory, in-process
cache), so the calls measured are the ones product code makes all day: throttled.

    .venv/bin/python bench/orgs_activity.py
"""
from __future__ import annotations

import sys
import timeit

import _django

# The throttled path never reaches the cache: REDIS_URL empty keeps the in-process fast path.
_django.setup("orgs-activity-bench", env={"REDIS_URL": ""})

import django  # noqa: E402
from django.dispatch import Signal  # noqa: E402

from clusters.models import Cluster  # noqa: E402
from config import clock  # noqa: E402
from orgs.activity import org_activity_record  # noqa: E402
from orgs.models import Org  # noqa: E402
from orgs.signals import warmup  # noqa: E402

CALLS = 100_000
REPEATS = 5
ROUNDS = 5


def best_ns(stmt, calls: int = CALLS) -> float:
    """Best of REPEATS runs, per call, in nanoseconds (the least disturbed run)."""
    return min(timeit.repeat(stmt, number=calls, repeat=REPEATS)) / calls * 1e9


def main() -> None:
    cluster = Cluster.objects.create(name="bench", kubeconfig_path="/nonexistent")
    Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=clock.now())
    assert org_activity_record("acme") is True, "the first activity of a window is written"
    assert org_activity_record("acme") is False and warmup.send(sender=None, org_slug="acme")[0][1] is None

    bare = Signal()
    assert not bare.receivers

    def floor():
        bare.send(sender=None, org_slug="acme")

    def plain():
        org_activity_record("acme")

    def signal():
        warmup.send(sender=None, org_slug="acme")

    # Interleaved so that a noisy neighbour on the shared cores hits all three alike.
    results = {"floor": [], "plain": [], "signal": []}
    for _ in range(ROUNDS):
        for name, fn in (("floor", floor), ("plain", plain), ("signal", signal)):
            results[name].append(best_ns(fn))
    floor_ns, plain_ns, signal_ns = (min(results[k]) for k in ("floor", "plain", "signal"))
    print(f"python {sys.version.split()[0]}, Django {django.get_version()}, {CALLS:,} calls x {REPEATS} repeats x {ROUNDS} rounds, best")
    print(f"floor  bare Signal.send(), no receivers      {floor_ns:7.1f} ns/call")
    print(f"plain  org_activity_record (throttled)       {plain_ns:7.1f} ns/call  "
          f"ratio {plain_ns / floor_ns:.2f}  (target <= 1)  {'OK' if plain_ns <= floor_ns else 'MISSED'}")
    print(f"signal warmup.send (throttled, 1 receiver)   {signal_ns:7.1f} ns/call  "
          f"ratio {signal_ns / floor_ns:.2f}  (target <= 6)  {'OK' if signal_ns <= 6 * floor_ns else 'MISSED'}")


if __name__ == "__main__":
    main()
