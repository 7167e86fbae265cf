"""The cost of throttled activity, the calls product code makes all day, against a floor
measured in the same run.

    .venv/bin/python bench/orgs_activity.py [--scales 1,5] [--runs 5]

At 1x, 100,000 calls spread over 1,000 orgs; at 5x, 500,000 calls over 5,000 orgs (the
in-process throttle holds one deadline per org). Each org is recorded once for real
first (SQLite in a temporary folder, removed at exit; in-process cache), so every call
measured falls inside its org's throttle window.

floor: a bare `Signal.send()` with no receivers, once per call (what any signal-based
       hook costs at least; the throttled path is one dict look-up and a comparison)
1. `orgs.activity.org_activity_record(slug)`                              target ratio <= 1
2. `orgs.signals.warmup.send(...)` (Django dispatch to one receiver)       target ratio <= 6

Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import sys

import _django

# The throttled path never reaches the cache: REDIS_URL empty keeps the in-process fast path.
_django.setup("orgs-activity-bench", env={"REDIS_URL": ""})

import django  # noqa: E402
from _runs import Report, bench_arguments, scales_of, timed  # noqa: E402
from django.dispatch import Signal  # noqa: E402

from clusters.models import Cluster  # noqa: E402
from config import clock  # noqa: E402
from orgs.activity import org_activity_record  # noqa: E402
from orgs.models import Org  # noqa: E402
from orgs.signals import warmup  # noqa: E402

BASE_CALLS, BASE_ORGS = 100_000, 1_000


def one_scale(scale: int, runs: int, report: Report, cluster: Cluster) -> None:
    calls, orgs = BASE_CALLS * scale, BASE_ORGS * scale
    have = Org.objects.count()
    Org.objects.bulk_create(Org(slug=f"org-{i}", cluster=cluster, namespace=f"org-{i}",
                                last_activity_at=clock.now()) for i in range(have, orgs))
    slugs = [f"org-{i}" for i in range(orgs)]
    for slug in slugs[have:]:
        assert org_activity_record(slug) is True, "the first activity of a window is written"
    assert org_activity_record(slugs[-1]) is False and warmup.send(sender=None, org_slug=slugs[-1])[0][1] is None
    # The calls in a fixed order over all orgs, as many as the scale asks.
    sequence = (slugs * (calls // orgs + 1))[:calls]
    bare = Signal()
    assert not bare.receivers
    send, record, signal = bare.send, org_activity_record, warmup.send

    def floor():
        for slug in sequence:
            send(sender=None, org_slug=slug)

    def plain():
        for slug in sequence:
            record(slug)

    def dispatched():
        for slug in sequence:
            signal(sender=None, org_slug=slug)

    # Interleaved, one run of each at a time, so that a noisy neighbour on the shared
    # cores hits all three alike.
    samples: dict[str, list[float]] = {"floor": [], "plain": [], "signal": []}
    for _ in range(runs):
        for name, fn in (("floor", floor), ("plain", plain), ("signal", dispatched)):
            samples[name] += timed(fn, 1)
    print(f"scale {scale}x: {calls:,} calls over {orgs:,} orgs", flush=True)
    report.add(scale, "org_activity_record (throttled)", samples["plain"], floor="bare Signal.send()",
               floor_samples=samples["floor"], note="target ratio <= 1")
    report.add(scale, "warmup.send (throttled, 1 receiver)", samples["signal"], floor="bare Signal.send()",
               floor_samples=samples["floor"], note="target ratio <= 6")


def main() -> int:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, Django {django.get_version()}")
    report = Report("orgs_activity", runs=args.runs)
    cluster = Cluster.objects.create(name="bench", kubeconfig_path="/nonexistent")
    for scale in scales_of(args):
        one_scale(scale, args.runs, report, cluster)
    report.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
