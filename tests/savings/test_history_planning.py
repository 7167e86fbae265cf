"""The GPU history's shaping (savings/history/planning.py): windows, steps, the queries,
alignment on the steps, idle = allocated − used, gaps. Plain pytest, no database."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from capacity.gpumap.planning import PALETTE
from savings.history.planning import (ALLOCATED, IDLE, USED, WINDOWS, HistoryInputError, allocated_promql,
                                      history_shape, used_promql, window_choose)

NOW = datetime(2025, 3, 14, 12, 7, 31, tzinfo=timezone.utc)


@pytest.mark.parametrize("given, name", [(None, "day"), ("", "day"), ("day", "day"), ("week", "week"),
                                         ("month", "month")])
def test_a_window_is_day_week_or_month_and_day_when_not_given(given, name):
    assert window_choose(given).name == name


@pytest.mark.parametrize("given", ["year", "Day", " week", "7", "1d", 7])
def test_any_other_window_is_refused_naming_the_allowed_ones(given):
    with pytest.raises(HistoryInputError) as caught:
        window_choose(given)
    assert str(caught.value) == f"window must be one of day, week, month, got {given!r}"


@pytest.mark.parametrize("name, step, points", [("day", 300, 289), ("week", 3600, 169), ("month", 21600, 121)])
def test_each_window_ends_on_its_step_and_holds_a_few_hundred_points(name, step, points):
    window = WINDOWS[name]
    start, end = window.bounds(NOW)
    assert end <= NOW < end + timedelta(seconds=step)
    assert end.timestamp() % step == 0
    assert end - start == window.span
    assert window.step_seconds == step and window.points == points <= 300


def test_the_cluster_name_goes_into_the_queries_as_a_quoted_literal():
    tricky = 'a"b\\c'
    assert 'cluster="a\\"b\\\\c"' in allocated_promql(cluster=tricky, step_seconds=300)
    used = used_promql(cluster=tricky, step_seconds=300, idle_threshold=0.01)
    assert 'cluster="a\\"b\\\\c"' in used
    # the pruner's rule: GR_ENGINE first, else GPU_UTIL / 100, compared with its threshold
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE[300s]" in used and "DCGM_FI_DEV_GPU_UTIL[300s]) / 100" in used
    assert "< bool 0.01" in used


@pytest.mark.parametrize("threshold", [0, -0.1, 1.5, float("nan"), True])
def test_a_threshold_that_is_no_fraction_is_refused(threshold):
    with pytest.raises(HistoryInputError, match="PRUNER_IDLE_THRESHOLD"):
        used_promql(cluster="c", step_seconds=300, idle_threshold=threshold)


def _series(pool: str, points: dict[float, float]) -> dict:
    return {"metric": {"pool": pool}, "values": [[t, str(v)] for t, v in sorted(points.items())]}


def _shape(allocated, used, window="day"):
    w = WINDOWS[window]
    start, end = w.bounds(NOW)
    return history_shape(cluster="sim", window=w, start=start, end=end, allocated=allocated, used=used,
                         source="http://prom:9090"), start.timestamp(), end.timestamp()


def test_points_are_aligned_on_the_steps_and_missing_ones_stay_missing():
    w = WINDOWS["day"]
    start, end = w.bounds(NOW)
    t0, t_end = start.timestamp(), end.timestamp()
    allocated = {t0 + i * 300: 8 for i in range(w.points) if not 100 <= i < 110}   # 10 steps without samples
    used = {t0 + i * 300: 3 for i in range(w.points) if i >= 50}                   # DCGM from step 50 on
    history, *_ = _shape([_series("h100", allocated)], [_series("h100", used)])
    [pool] = history.pools
    assert len(pool.times) == w.points and pool.times[0] == t0 and pool.times[-1] == t_end
    a, u, idle = (pool.lines[k] for k in (ALLOCATED, USED, IDLE))
    assert a[99] == 8 and a[100] is None and a[109] is None and a[110] == 8
    assert u[49] is None and u[50] == 3
    assert idle[49] is None and idle[50] == 5 and idle[105] is None
    assert pool.steps_with_data(ALLOCATED) == w.points - 10
    assert pool.steps_with_data(IDLE) == w.points - 50 - 10


def test_idle_is_allocated_less_used_and_never_below_zero():
    w = WINDOWS["day"]
    t0 = w.bounds(NOW)[0].timestamp()
    ts = [t0 + i * 300 for i in range(w.points)]
    allocated = _series("a100", {t: (4 if i % 2 else 1) for i, t in enumerate(ts)})
    used = _series("a100", {t: 2 for t in ts})
    history, *_ = _shape([allocated], [used])
    idle = history.pools[0].lines[IDLE]
    assert idle[0] == 0 and idle[1] == 2   # 1 allocated, 2 busy: 0 idle, not -1
    assert history.pools[0].average(IDLE) == round(sum(idle) / len(idle), 2)


def test_each_stretch_without_samples_is_said_with_its_times():
    w = WINDOWS["day"]
    start, end = w.bounds(NOW)
    t0 = start.timestamp()
    allocated = {t0 + i * 300: 8 for i in range(w.points) if i < 10 or i >= 20}
    history, *_ = _shape([_series("h100", allocated)], [])
    gap_from = datetime.fromtimestamp(t0 + 9 * 300, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gap_to = datetime.fromtimestamp(t0 + 19 * 300, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    before_first = (start - timedelta(seconds=300)).strftime("%Y-%m-%d %H:%M UTC")
    last = end.strftime("%Y-%m-%d %H:%M UTC")
    assert history.pools[0].gaps == (
        f"Pool h100: no samples for GPUs allocated (gpu_capacity_pool_gpus) between {gap_from} and {gap_to}.",
        "Pool h100: no samples for GPU utilization (DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL) of "
        f"its nodes between {before_first} and {last}.")   # the first step reads the step before the window


def test_many_stretches_are_counted_past_the_first_five():
    w = WINDOWS["day"]
    start, _ = w.bounds(NOW)
    allocated = {start.timestamp() + i * 300: 1 for i in range(w.points) if i % 2}
    history, *_ = _shape([_series("p", allocated)], [_series("p", {start.timestamp() + i * 300: 0
                                                                  for i in range(w.points)})])
    gaps = history.pools[0].gaps
    assert len(gaps) == 6 and gaps[-1] == "Pool p: 140 more stretches without samples for GPUs allocated " \
                                          "(gpu_capacity_pool_gpus)."


def test_no_product_metric_at_all_says_where_it_comes_from_and_draws_no_pool():
    history, *_ = _shape([], [_series("h100", {})])
    assert history.pools == ()
    [note] = history.notes
    assert note.startswith("No samples for gpu_capacity_pool_gpus of cluster sim between ")
    assert "in Prometheus at http://prom:9090" in note and "deploy/servicemonitor.yaml" in note


def test_the_chart_has_titled_axes_gaps_as_nulls_and_okabe_ito_lines_told_apart_by_dash():
    w = WINDOWS["week"]
    start, end = w.bounds(NOW)
    history, *_ = _shape([_series("h100", {start.timestamp(): 4})], [], window="week")
    config = history.pools[0].chart_config(start=start, end=end, window="week")
    assert config["options"]["scales"]["x"]["title"]["text"] == "time (UTC)"
    assert config["options"]["scales"]["y"]["title"]["text"] == "GPUs"
    assert config["options"]["scales"]["x"]["utcTime"] == "date"
    datasets = config["data"]["datasets"]
    assert [d["label"] for d in datasets] == ["GPUs allocated", "GPUs used", "GPUs idle (allocated − used)"]
    assert {d["borderColor"] for d in datasets} <= set(PALETTE)
    assert len({tuple(d["borderDash"]) for d in datasets}) == 3
    assert all(d["spanGaps"] is False for d in datasets)
    allocated = datasets[0]["data"]
    assert allocated[0] == {"x": round(start.timestamp() * 1000), "y": 4.0}
    assert allocated[1]["y"] is None and len(allocated) == w.points
