"""The savings page's GPU history, as an operator sees it: a real Prometheus holding a day of
DCGM utilization and of the control plane's own pool metrics (backfilled by promtool), the
page asked for through Django's test client by a logged-in operator."""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from html import unescape

import pytest

from clusters.models import Cluster
from config import clock
from tests.prometheus_fixtures import Series, free_port, gpu_labels
from tests.savings.test_views import staff_user

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]

PAGE = "/savings/clusters/sim/"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
STEP = 300   # the day window's step
H = 3600


def _pinned_clock(tmp_path, settings) -> float:
    """Pin the product's "now" just past the latest 5-minute boundary (it then stays within
    that step for the test's few seconds): the page's last step is that boundary."""
    wall = datetime.now(timezone.utc).timestamp()
    end = math.floor(wall / STEP) * STEP
    offset = tmp_path / "clock-offset"
    offset.write_text(str(end + 1 - wall))
    settings.CLOCK_OFFSET_FILE = str(offset)
    assert math.floor(clock.now().timestamp() / STEP) * STEP == end
    return end


def _history(end: float) -> list[Series]:
    """Six hours of samples every minute up to `end` (each window says what it reads):

    h100 (nodes h1, h2): 10 GPUs allocated until end − 2 h, then 12 (two web replicas export
    the same rows). h1: GPUs 0–4 busy at 80 %, GPU 5 at 0.5 % (under the 1 % threshold), GPU 6
    busy by GPU_UTIL but idle by GR_ENGINE (the pruner reads GR_ENGINE first), GPU 7 at 0. h2:
    GPUs 0–2 busy at 50 % until end − 1 h, idle after. So used is 8, then 5 from end − 1 h.
    a100 (node a1): 4 allocated, 1 between end − 90 min and end − 60 min, no samples at all
    between end − 3 h and end − 2 h; GPUs 0–1 busy at 30 %, no DCGM samples between end − 5 h
    and end − 4 h.
    """
    # Half a minute off the steps, as a scrape would be: no sample sits on a step's edge.
    times = [end - 6 * H + 30 + i * 60 for i in range(6 * 60)]
    series: dict[tuple, Series] = {}

    def add(metric, labels, t, value):
        key = (metric, tuple(sorted(labels.items())))
        series.setdefault(key, Series(metric, dict(labels))).samples.append((t, value))

    for t in times:
        a100_scraped = not end - 3 * H < t < end - 2 * H
        for instance in ("web-0:8000", "web-1:8000"):
            own = {"job": "gpu-capacity", "instance": instance, "cluster": "sim"}
            add("gpu_capacity_pool_gpus", {**own, "pool": "h100", "gpu_product": H100, "state": "allocated"}, t,
                10 if t < end - 2 * H else 12)
            add("gpu_capacity_pool_gpus", {**own, "pool": "h100", "gpu_product": H100, "state": "allocatable"}, t, 16)
            for node in ("h1", "h2"):
                add("gpu_capacity_node_pool_info", {**own, "node": node, "pool": "h100"}, t, 1)
            if a100_scraped:
                add("gpu_capacity_pool_gpus", {**own, "pool": "a100", "gpu_product": A100, "state": "allocated"}, t,
                    1 if end - 90 * 60 <= t < end - 60 * 60 else 4)
                add("gpu_capacity_node_pool_info", {**own, "node": "a1", "pool": "a100"}, t, 1)
        for gpu in range(8):
            util = 80 if gpu < 5 else (0.5 if gpu == 5 else (50 if gpu == 6 else 0))
            add("DCGM_FI_DEV_GPU_UTIL", gpu_labels("team-a", f"p{gpu}", gpu, node="h1", model=H100), t, util)
            busy = gpu < 3 and t < end - H
            add("DCGM_FI_DEV_GPU_UTIL", gpu_labels("team-b", f"q{gpu}", gpu, node="h2", model=H100), t,
                50 if busy else 0)
        add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu_labels("team-a", "p6", 6, node="h1", model=H100), t, 0.0)
        if not end - 5 * H < t < end - 4 * H:
            for gpu in range(4):
                add("DCGM_FI_DEV_GPU_UTIL", gpu_labels("team-c", f"r{gpu}", gpu, node="a1", model=A100), t,
                    30 if gpu < 2 else 0)
    return list(series.values())


def _nodes() -> list[dict]:
    def node(name, product, pool):
        labels = {"nvidia.com/gpu.product": product, **({"karpenter.sh/nodepool": pool} if pool else {})}
        gpus = {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "status": {"capacity": gpus, "allocatable": gpus}}
    return [node("h1", H100, "h100"), node("h2", H100, "h100"), node("a1", A100, "a100")]


@pytest.fixture
def operator(client, django_user_model):
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    return client


def _charts(html: str) -> dict[str, list[dict]]:
    """Each pool's chart data as the page carries it: pool → datasets."""
    out = {}
    for body in re.findall(r'<script id="gpu-history-\d+" type="application/json">(.*?)</script>', html, re.S):
        config = json.loads(unescape(body))
        pool = re.match(r"Pool (\S+):", config["options"]["plugins"]["title"]["text"]).group(1)
        out[pool] = config["data"]["datasets"]
        assert config["options"]["scales"]["x"]["title"]["text"] == "time (UTC)"
        assert config["options"]["scales"]["y"]["title"]["text"] == "GPUs"
    return out


def _points(datasets: list[dict], label: str) -> dict[float, float | None]:
    [ds] = [d for d in datasets if d["label"].startswith(label)]
    return {p["x"] / 1000: p["y"] for p in ds["data"]}


def _averages(html: str, pool: str) -> dict[str, str]:
    block = re.search(rf'<div class="pool" data-pool="{pool}">(.*?)</table></div>', html, re.S).group(1)
    return {line: cell for line, cell in
            re.findall(r'<tr data-line="(\w+)">.*?<td class="num">([^<]*)</td>', block, re.S)}


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def test_allocated_used_and_idle_per_pool_over_the_day_with_gaps_where_samples_are_missing(
        tmp_path, settings, sim_cluster_factory, prometheus_factory, operator):
    end = _pinned_clock(tmp_path, settings)
    prometheus = prometheus_factory(_history(end))
    sim = sim_cluster_factory(_nodes(), name="sim")
    Cluster.objects.filter(pk=sim.cluster.pk).update(prometheus_url=prometheus.url)
    settings.PRUNER_IDLE_THRESHOLD = 0.01

    response = operator.get(PAGE + "?window=day")
    assert response.status_code == 200
    html = response.content.decode()
    charts = _charts(html)
    assert sorted(charts) == ["a100", "h100"]

    h100 = {k: _points(charts["h100"], k) for k in ("GPUs allocated", "GPUs used", "GPUs idle")}
    assert len(h100["GPUs allocated"]) == 289 and min(h100["GPUs allocated"]) == end - 24 * H
    # Before the history: missing, never 0.
    assert {h100[k][end - 12 * H] for k in h100} == {None}
    expected = {end - 5 * H: (10, 8, 2), end - 90 * 60: (12, 8, 4), end - 30 * 60: (12, 5, 7), end: (12, 5, 7)}
    for t, values in expected.items():
        assert tuple(h100[k][t] for k in ("GPUs allocated", "GPUs used", "GPUs idle")) == values, _utc(t)
    # Two replicas' rows counted once: never 20 or 24.
    assert max(v for v in h100["GPUs allocated"].values() if v is not None) == 12

    a100 = {k: _points(charts["a100"], k) for k in ("GPUs allocated", "GPUs used", "GPUs idle")}
    assert tuple(a100[k][end - 30 * 60] for k in a100) == (4, 2, 2)
    assert tuple(a100[k][end - 70 * 60] for k in a100) == (1, 2, 0)   # 2 busy, 1 allocated: 0 idle, not -1
    assert a100["GPUs allocated"][end - 150 * 60] is None and a100["GPUs idle"][end - 150 * 60] is None
    assert a100["GPUs used"][end - 150 * 60] == 2                       # DCGM went on; the pool metric did not
    assert a100["GPUs used"][end - 270 * 60] is None and a100["GPUs allocated"][end - 270 * 60] == 4

    text = unescape(html)
    assert (f"Pool a100: no samples for GPUs allocated (gpu_capacity_pool_gpus) between {_utc(end - 3 * H)} and "
            f"{_utc(end - 2 * H)}.") in text
    assert ("Pool a100: no samples for GPU utilization (DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL) of "
            f"its nodes between {_utc(end - 5 * H)} and {_utc(end - 4 * H)}.") in text

    # The averages beside each chart are the chart's own points.
    for pool, points in (("h100", h100), ("a100", a100)):
        shown = _averages(html, pool)
        for line, label in (("allocated", "GPUs allocated"), ("used", "GPUs used"), ("idle", "GPUs idle")):
            values = [v for v in points[label].values() if v is not None]
            assert float(shown[line]) == round(sum(values) / len(values), 2), (pool, line)
    # The savings are still there.
    assert 'id="savings-total"' in html


def test_a_week_has_hourly_steps_and_the_window_switch_keeps_the_days(
        tmp_path, settings, sim_cluster_factory, prometheus_factory, operator):
    end = _pinned_clock(tmp_path, settings)
    prometheus = prometheus_factory(_history(end))
    sim = sim_cluster_factory(_nodes(), name="sim")
    Cluster.objects.filter(pk=sim.cluster.pk).update(prometheus_url=prometheus.url)

    html = operator.get(PAGE + "?window=week&days=7").content.decode()
    charts = _charts(html)
    allocated = _points(charts["h100"], "GPUs allocated")
    assert len(allocated) == 169 and all(t % H == 0 for t in allocated)
    last_hour = math.floor(end / H) * H
    assert allocated[last_hour] == 12 and allocated[last_hour - 7 * 24 * H] is None
    assert '<option value="week" selected>' in html
    assert '<input type="hidden" name="days" value="7">' in html


@pytest.mark.parametrize("window", ["year", "DAY", "1d"])
def test_a_bad_window_is_refused_naming_the_allowed_ones(sim_cluster_factory, operator, window):
    sim_cluster_factory(_nodes(), name="sim")
    response = operator.get(PAGE, {"window": window})
    assert response.status_code == 400
    assert response.content.decode() == f"window must be one of day, week, month, got {window!r}\n"


def test_without_a_prometheus_the_page_says_so_and_shows_the_savings(sim_cluster_factory, operator, settings):
    settings.PROMETHEUS_URL = ""
    sim_cluster_factory(_nodes(), name="sim")
    response = operator.get(PAGE)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert ("No Prometheus is configured for cluster sim (its Prometheus URL in Admin → Clusters, or "
            "PROMETHEUS_URL): GPUs allocated, used and idle over time cannot be shown.") in html
    assert "gpu-history-1" not in html and 'id="savings-total"' in html


def test_a_prometheus_that_does_not_answer_is_said_on_the_page(sim_cluster_factory, operator):
    sim = sim_cluster_factory(_nodes(), name="sim")
    url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    Cluster.objects.filter(pk=sim.cluster.pk).update(prometheus_url=url)
    response = operator.get(PAGE)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert f"GPUs allocated, used and idle over time cannot be shown: no answer from Prometheus at {url}" in html
    assert 'id="savings-total"' in html


def test_a_prometheus_without_the_control_planes_metrics_is_named(
        tmp_path, settings, sim_cluster_factory, prometheus_factory, operator):
    end = _pinned_clock(tmp_path, settings)
    dcgm_only = [s for s in _history(end) if s.metric.startswith("DCGM_")]
    prometheus = prometheus_factory(dcgm_only)
    sim = sim_cluster_factory(_nodes(), name="sim")
    Cluster.objects.filter(pk=sim.cluster.pk).update(prometheus_url=prometheus.url)
    html = unescape(operator.get(PAGE).content.decode())
    assert (f"No samples for gpu_capacity_pool_gpus of cluster sim between {_utc(end - 24 * H)} and {_utc(end)} in "
            f"Prometheus at {prometheus.url}") in html
    assert "gpu-history-1" not in html
