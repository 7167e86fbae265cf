"""The GPU history of a cluster, shaped from Prometheus' answers (no Django, no HTTP, no clock).

Per node pool and step of the window:

* allocated: the most GPUs the live pods of the pool's nodes requested within the step, from
  the control plane's own `gpu_capacity_pool_gpus{state="allocated"}` (capacity/metrics.py);
  each web replica exports the same series, hence the `max by` before the sum;
* used: the pool's GPUs whose utilization peaked at or above the pruner's idle threshold
  within the step, by the pruner's own rule (pruning/query.py: `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
  where the exporter has it, else `DCGM_FI_DEV_GPU_UTIL / 100`; a NaN peak is not idle), so a
  GPU the chart calls idle over a step is one the pruner would call idle over it. A GPU is
  placed in a pool through its node: DCGM's `Hostname` joined with the node name of
  `gpu_capacity_node_pool_info`, as last exported within `NODE_POOL_LOOKBACK` before the step
  (a node seldom changes pools, and the control plane exports a cluster only while it keeps a
  reading of it: DCGM's samples still count while the exports lapse);
* idle: allocated − used, never below 0, and missing wherever either is.

A step without samples is missing (None: a gap in the chart, and a sentence saying so),
never 0. Steps are aligned to multiples of the step (UTC), so a chart drawn twice within a
step shows the same points.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from capacity.gpumap.planning import PALETTE
from pruning.query import GPU_UTIL, GR_ENGINE, promql_string

ALLOCATED, USED, IDLE = "allocated", "used", "idle"
SERIES = (ALLOCATED, USED, IDLE)
POOL_METRIC = "gpu_capacity_pool_gpus"
NODE_POOL_METRIC = "gpu_capacity_node_pool_info"
# How each line is drawn: an Okabe–Ito colour (capacity/gpumap/planning.py) and a dash of its
# own, so that the lines stay apart without telling colours apart.
STYLE = {ALLOCATED: {"colour": PALETTE[4], "dash": []},         # blue, solid
         USED: {"colour": PALETTE[0], "dash": [8, 4]},          # orange, dashed
         IDLE: {"colour": PALETTE[2], "dash": [2, 3]}}          # bluish green, dotted
LABELS = {ALLOCATED: "GPUs allocated", USED: "GPUs used", IDLE: "GPUs idle (allocated − used)"}
NODE_POOL_LOOKBACK = "1d"
# A time label on the chart every 3 hours, day or 5 days (UTC multiples: 03:00, 06:00…).
TICK_SECONDS = {"day": 3 * 3600, "week": 86400, "month": 5 * 86400}
GAPS_SAID_MAX = 5   # gap sentences per pool and line; more are counted in one sentence


class HistoryInputError(ValueError):
    """A window that is not one of WINDOWS."""


@dataclass(frozen=True)
class HistoryWindow:
    name: str
    span: timedelta
    step_seconds: int   # a few hundred points at most per line

    @property
    def points(self) -> int:
        return int(self.span.total_seconds()) // self.step_seconds + 1

    def bounds(self, now: datetime) -> tuple[datetime, datetime]:
        """The window's first and last step: the last is the latest multiple of the step at or
        before `now`."""
        last = math.floor(now.timestamp() / self.step_seconds) * self.step_seconds
        end = datetime.fromtimestamp(last, tz=timezone.utc)
        return end - self.span, end


WINDOWS = {w.name: w for w in (
    HistoryWindow("day", timedelta(days=1), 300),       # 289 points, 5 min apart
    HistoryWindow("week", timedelta(days=7), 3600),     # 169 points, an hour apart
    HistoryWindow("month", timedelta(days=30), 21600),  # 121 points, 6 h apart
)}
DEFAULT_WINDOW = "day"


def window_choose(value: object) -> HistoryWindow:
    if value is None or value == "":
        return WINDOWS[DEFAULT_WINDOW]
    window = WINDOWS.get(value) if isinstance(value, str) else None
    if window is None:
        raise HistoryInputError(f"window must be one of {', '.join(WINDOWS)}, got {value!r}")
    return window


def _threshold(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise HistoryInputError(f"the idle threshold (PRUNER_IDLE_THRESHOLD) is a fraction in (0, 1], "
                                f"got {value!r}")
    return repr(float(value))


def allocated_promql(*, cluster: str, step_seconds: int) -> str:
    selector = f'{POOL_METRIC}{{cluster={promql_string(cluster)},state="allocated"}}'
    return f"sum by (pool) (max by (pool, gpu_product) (max_over_time({selector}[{step_seconds}s])))"


def used_promql(*, cluster: str, step_seconds: int, idle_threshold: float) -> str:
    s, threshold = f"[{step_seconds}s]", _threshold(idle_threshold)
    # Per GPU (its series merged across the pods it served): the peak, GR_ENGINE first.
    peak = f"max by (Hostname, gpu, UUID) ((max_over_time({GR_ENGINE}{s})) or (max_over_time({GPU_UTIL}{s}) / 100))"
    busy = f"(1 - ({peak} < bool {threshold}))"   # 1 unless under the threshold (NaN counts busy)
    # One pool per node: its last export (one of them, should the node have changed pools).
    nodes = f"{NODE_POOL_METRIC}{{cluster={promql_string(cluster)}}}"
    pools = (f"label_replace(topk by (node) (1, last_over_time({nodes}[{NODE_POOL_LOOKBACK}])), "
             f"\"Hostname\", \"$1\", \"node\", \"(.*)\")")
    return f"sum by (pool) ({busy} * on (Hostname) group_left (pool) {pools})"


@dataclass(frozen=True)
class PoolHistory:
    pool: str
    times: tuple[float, ...]                         # Unix seconds, one per step
    lines: dict[str, tuple[float | None, ...]]       # SERIES -> a value per step (None: no samples)
    gaps: tuple[str, ...] = ()                       # sentences

    def average(self, line: str) -> float | None:
        """The mean of the line's points that have a value, as the chart draws them."""
        values = [v for v in self.lines[line] if v is not None]
        return round(sum(values) / len(values), 2) if values else None

    def steps_with_data(self, line: str) -> int:
        return sum(v is not None for v in self.lines[line])

    def chart_config(self, *, start: datetime, end: datetime, window: str) -> dict:
        """A Chart.js line chart: GPUs against UTC time, a gap where a line has no samples."""
        datasets = []
        for line in SERIES:
            style = STYLE[line]
            datasets.append({
                "label": LABELS[line], "borderColor": style["colour"], "backgroundColor": style["colour"],
                "borderDash": style["dash"], "borderWidth": 2, "pointRadius": 0, "spanGaps": False, "fill": False,
                "data": [{"x": round(t * 1000), "y": v} for t, v in zip(self.times, self.lines[line])]})
        return {
            "type": "line",
            "data": {"datasets": datasets},
            "options": {
                "responsive": True, "maintainAspectRatio": False, "animation": False,
                "plugins": {"title": {"display": True, "text": f"Pool {self.pool}: GPUs over the last {window}"},
                            "legend": {"labels": {"usePointStyle": True, "pointStyle": "line"}}},
                "scales": {
                    "x": {"type": "linear", "utcTime": "time" if window == "day" else "date",
                          "min": round(start.timestamp() * 1000), "max": round(end.timestamp() * 1000),
                          "title": {"display": True, "text": "time (UTC)"},
                          "ticks": {"stepSize": TICK_SECONDS[window] * 1000, "maxTicksLimit": 10}},
                    "y": {"beginAtZero": True, "title": {"display": True, "text": "GPUs"},
                          "ticks": {"precision": 0}},
                },
            },
        }


@dataclass(frozen=True)
class GpuHistory:
    cluster: str
    window: HistoryWindow
    start: datetime
    end: datetime
    pools: tuple[PoolHistory, ...]
    notes: tuple[str, ...] = field(default=())   # sentences about the whole cluster


def _when(moment: float | datetime) -> str:
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _aligned(result: list[dict], times: tuple[float, ...]) -> dict[str, list[float | None]]:
    """Per pool, a value per step of `times` (None where the answer has no sample there)."""
    index = {round(t): i for i, t in enumerate(times)}
    out: dict[str, list[float | None]] = {}
    for series in result:
        pool = series.get("metric", {}).get("pool", "")
        values = out.setdefault(pool, [None] * len(times))
        for t, v in series.get("values", []):
            i = index.get(round(float(t)))
            value = float(v)
            if i is not None and math.isfinite(value):
                values[i] = value
    return out


def _gaps(pool: str, line: str, values: list[float | None], times: tuple[float, ...], step: int) -> list[str]:
    """A sentence per run of steps without samples: a point at t reads the step (t − step, t]."""
    runs, first = [], None
    for i, v in enumerate(values + [0.0]):
        if v is None and first is None:
            first = i
        elif v is not None and first is not None:
            runs.append((first, i - 1))
            first = None
    what = {ALLOCATED: f"GPUs allocated ({POOL_METRIC})",
            USED: f"GPU utilization ({GR_ENGINE} or {GPU_UTIL}) of its nodes"}[line]
    said = [f"Pool {pool}: no samples for {what} between {_when(times[a] - step)} and {_when(times[b])}."
            for a, b in runs[:GAPS_SAID_MAX]]
    if len(runs) > GAPS_SAID_MAX:
        said.append(f"Pool {pool}: {len(runs) - GAPS_SAID_MAX} more stretches without samples for {what}.")
    return said


def history_shape(*, cluster: str, window: HistoryWindow, start: datetime, end: datetime,
                  allocated: list[dict], used: list[dict], source: str) -> GpuHistory:
    """The range queries' answers (`{"metric": {"pool": …}, "values": [[t, "v"], …]}`) as
    one history per pool, on the window's steps. `source` names the Prometheus asked."""
    step = window.step_seconds
    first = start.timestamp()
    times = tuple(first + i * step for i in range(int((end.timestamp() - first) // step) + 1))
    allocated_by_pool, used_by_pool = _aligned(allocated, times), _aligned(used, times)
    notes = []
    if not allocated_by_pool:
        notes.append(f"No samples for {POOL_METRIC} of cluster {cluster} between {_when(start)} and {_when(end)} in "
                     f"Prometheus at {source}: the GPUs allocated per pool come from the control plane's own "
                     "/metrics, which that Prometheus must scrape (deploy/servicemonitor.yaml), from a reading of "
                     "the cluster the schedule draws every minute (capacity: GPU readings kept).")
    pools = []
    for pool in sorted(allocated_by_pool):
        a = allocated_by_pool[pool]
        u = used_by_pool.get(pool, [None] * len(times))
        idle = [None if x is None or y is None else max(x - y, 0.0) for x, y in zip(a, u)]
        gaps = _gaps(pool, ALLOCATED, a, times, step) + _gaps(pool, USED, u, times, step)
        pools.append(PoolHistory(pool=pool, times=times, lines={ALLOCATED: tuple(a), USED: tuple(u),
                                                                 IDLE: tuple(idle)}, gaps=tuple(gaps)))
    return GpuHistory(cluster=cluster, window=window, start=start, end=end, pools=tuple(pools), notes=tuple(notes))
