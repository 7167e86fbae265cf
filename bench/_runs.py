"""What every bench prints: min/median/max over N runs (5 by default) at 1x and 5x its size,
each measure's ratio to its floor (medians), and its growth from 1x to 5x (medians).

    from _runs import Report, bench_arguments
    parser = bench_arguments(argparse.ArgumentParser(...))      # --scales 1,5 --runs 5
    report = Report("simcluster_list", runs=args.runs)
    report.add(scale, "LIST label selector", samples, floor="orjson.dumps", floor_samples=floor)
    report.print()

Timings are wall-clock seconds from time.perf_counter(); a measure may also be a count
(calls, bytes), printed as is.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


def bench_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--scales", default="1,5",
                        help="sizes to run, as multiples of the bench's base size (default 1,5)")
    parser.add_argument("--runs", type=int, default=5, help="runs per measure (default 5)")
    return parser


def scales_of(args: argparse.Namespace) -> list[int]:
    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--scales must be integers separated by commas, got {args.scales!r}") from None
    if not scales or any(s < 1 or s > 50 for s in scales):
        raise SystemExit(f"--scales must be between 1 and 50, got {args.scales!r}")
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    return scales


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    """Seconds per call of `fn`, `runs` times."""
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return samples


def spread(samples: list[float], unit: str = "s") -> str:
    if unit == "s":
        scale, suffix = (1000, " ms") if max(samples) < 1 else (1, " s")
        digits = 1 if scale == 1000 and max(samples) < 0.1 else (0 if scale == 1000 else 2)
        return "/".join(f"{s * scale:.{digits}f}" for s in
                        (min(samples), statistics.median(samples), max(samples))) + suffix
    return "/".join(f"{s:,.0f}" for s in (min(samples), statistics.median(samples), max(samples))) + f" {unit}"


@dataclass
class Row:
    scale: int
    measure: str
    samples: list[float]
    unit: str = "s"
    floor: str | None = None
    floor_samples: list[float] | None = None
    note: str = ""


@dataclass
class Report:
    bench: str
    runs: int
    rows: list[Row] = field(default_factory=list)

    def add(self, scale: int, measure: str, samples: list[float], *, unit: str = "s",
            floor: str | None = None, floor_samples: list[float] | None = None, note: str = "") -> None:
        self.rows.append(Row(scale, measure, list(samples), unit, floor, floor_samples, note))
        row = self.rows[-1]
        print(f"  [{self.bench} {scale}x] {measure}: {spread(row.samples, unit)}"
              + (f"; floor ({floor}) {spread(floor_samples, unit)}, ratio {self._ratio(row):.2f}"
                 if floor_samples else "") + (f"; {note}" if note else ""), flush=True)

    @staticmethod
    def _ratio(row: Row) -> float:
        return statistics.median(row.samples) / statistics.median(row.floor_samples)

    def print(self) -> None:
        """The table: per measure and scale, min/median/max, ratio to floor, growth from the smallest scale."""
        print(f"\n{self.bench}: min/median/max over {self.runs} runs; ratio = median / floor median; "
              "growth = median / median at the smallest scale")
        base: dict[str, Row] = {}
        for row in sorted(self.rows, key=lambda r: r.scale):
            base.setdefault(row.measure, row)
        width = max(len(r.measure) for r in self.rows) if self.rows else 10
        for row in self.rows:
            ratio = f"{self._ratio(row):6.2f}" if row.floor_samples else "     -"
            first = base[row.measure]
            growth = f"{statistics.median(row.samples) / statistics.median(first.samples):5.2f}x" \
                if first is not row and statistics.median(first.samples) else "     -"
            print(f"  {row.measure:<{width}}  {row.scale}x  {spread(row.samples, row.unit):>28}  "
                  f"ratio {ratio}  growth {growth}" + (f"  floor: {row.floor}" if row.floor else ""))


def paired(runs: int, floor: Callable[[], object], measure: Callable[[], object],
           prepare: Callable[[], object] | None = None) -> tuple[list[float], list[float]]:
    """`runs` times: the floor, then the measure, back to back (so each run has its own
    ratio, both taken under the same load); `prepare`, untimed, right before each measure.
    What each returns is let go after its clock stops: freeing a result its caller goes on
    to use is not part of making it."""
    floors, samples = [], []
    for _ in range(runs):
        began = time.perf_counter()
        kept = floor()
        floors.append(time.perf_counter() - began)
        del kept
        if prepare is not None:
            prepare()
        began = time.perf_counter()
        kept = measure()
        samples.append(time.perf_counter() - began)
        del kept
    return floors, samples


def per_run(samples: list[float], floors: list[float], *, target: float | None = None) -> str:
    """Each run's ratio to the floor measured right before it, and how many are within `target`."""
    ratios = [s / f for s, f in zip(samples, floors)]
    text = f"per-run ratio {'/'.join(f'{r:.2f}' for r in ratios)}"
    if target is not None:
        text += f" ({sum(r <= target for r in ratios)} of {len(ratios)} <= {target:g})"
    return text


def raw_lists(pool, url: str, paths: tuple[str, ...], *, page_size: int | None,
              headers: dict[str, str] | None = None) -> int:
    """A LIST floor: each path read page by page (`limit`, following `continue`) over the
    urllib3 `pool` (keep-alive, as the Kubernetes client's), every page decoded as the
    product decodes it and let go, with Python's cyclic collector paused as the product
    pauses it while it reads (clusters.snapshot.gc_paused): nodes and pods, decoded into
    just the fields the snapshot's views read (`NODE_LIST`, `POD_LIST`: msgspec, the
    cheapest decode the product has). Returns the objects read."""
    from clusters.snapshot import NODE_LIST, POD_LIST, gc_paused

    decoders = {"/api/v1/nodes": NODE_LIST, "/api/v1/pods": POD_LIST}
    count = 0
    with gc_paused():
        for path in paths:
            decoder, token = decoders[path], None
            while True:
                fields = {k: v for k, v in (("limit", page_size), ("continue", token)) if v}
                response = pool.request("GET", url + path, fields=fields,
                                        headers={"Accept": "application/json", **(headers or {})})
                if response.status != 200:
                    raise SystemExit(f"floor LIST {path}: HTTP {response.status}")
                page = decoder.decode(response.data)
                count += len(page.items or ())
                token = page.continue_token
                del page, response
                if not token:
                    break
    return count
