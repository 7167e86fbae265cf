"""The cost of throttled activity, the calls product code makes all day, against a floor
measured in the same run.

    .venv/bin/python bench/orgs_activity.py [--scales 1,5] [--runs 5]

At 1x, 100,000 calls spread over 1,000 orgs; at 5x, 500,000 calls over 5,000 orgs (the
in-process throttle holds one deadline per org). Each org is recorded once for real
first (SQLite in a temporary folder, removed at exit; in-process cache), so every call
measured falls inside its org's throttle window.

Honest floors: the least code that does the same work in Python, run in the same loop:
floor 1: the throttle's check inline in a plain function: the org's deadline looked up in
         the same dict (`orgs.activity._deadlines`) and compared with `time.monotonic()`,
         False when inside the window (what a throttled call must do, and nothing more)
floor 2: the same check in a function with `Signal.send`'s signature, answering what
         Django's dispatch answers ([(receiver, None)], a new list per call)
1. `orgs.activity.org_activity_record(slug)` against floor 1               target ratio <= 2
2. `orgs.signals.warmup.send(...)` against floor 2                         target ratio <= 2
Each floor runs right before its measure, so each run has its own ratio.

Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import sys
import time

import _django

# The throttled path never reaches the cache: REDIS_URL empty keeps the in-process fast path.
_django.setup("orgs-activity-bench", env={"REDIS_URL": ""})

import django  # noqa: E402
from _runs import Report, bench_arguments, per_run, scales_of, timed  # noqa: E402

from clusters.models import Cluster  # noqa: E402
from config import clock  # noqa: E402
from orgs import activity  # noqa: E402
from orgs.activity import org_activity_record  # noqa: E402
from orgs.models import Org  # noqa: E402
from orgs.signals import _record_warmup, warmup  # noqa: E402

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
    deadlines, monotonic = activity._deadlines, time.monotonic
    record, signal = org_activity_record, warmup.send
    receiver = _record_warmup

    def throttled(slug):
        if deadlines.get(slug, 0.0) > monotonic():
            return False

    def floor_record():
        for slug in sequence:
            throttled(slug)

    def send(sender, **named):
        if deadlines.get(named.get("org_slug"), 0.0) > monotonic():
            return [(receiver, None)]

    def floor_send():
        for slug in sequence:
            send(sender=None, org_slug=slug)

    def plain():
        for slug in sequence:
            record(slug)

    def dispatched():
        for slug in sequence:
            signal(sender=None, org_slug=slug)

    samples: dict[str, list[float]] = {"floor_record": [], "plain": [], "floor_send": [], "signal": []}
    for _ in range(runs):   # each floor right before its measure: a noisy neighbour hits both alike
        for name, fn in (("floor_record", floor_record), ("plain", plain), ("floor_send", floor_send),
                         ("signal", dispatched)):
            samples[name] += timed(fn, 1)
    print(f"scale {scale}x: {calls:,} calls over {orgs:,} orgs", flush=True)
    report.add(scale, "org_activity_record (throttled)", samples["plain"],
               floor="the throttle check inline in a function", floor_samples=samples["floor_record"],
               note=per_run(samples["plain"], samples["floor_record"], target=2))
    report.add(scale, "warmup.send (throttled, 1 receiver)", samples["signal"],
               floor="the same check answering as Django's dispatch", floor_samples=samples["floor_send"],
               note=per_run(samples["signal"], samples["floor_send"], target=2))


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
