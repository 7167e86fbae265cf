"""The idle queries (candidates and census, then the follow-up about them) against a real Prometheus
with backfilled DCGM history."""
from datetime import datetime, timedelta, timezone

import pytest
from tests.prometheus_fixtures import Series, gpu_labels

from clusters.errors import PrometheusError
from clusters.prometheus import PrometheusGateway
from pruning.planning import PruneSettings, pods_to_look_up
from pruning.query import IdleQuery
from pruning.reads import idle_gpus_read

pytestmark = pytest.mark.prometheus

# The pruner's "now": a little in the past so every sample is history, not head data.
NOW = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=10)
STEP = timedelta(seconds=30)


def history(metric, labels, value=0.0, *, start=timedelta(minutes=45), gap=None, spike=None):
    """Samples every 30 s from NOW-start to NOW; `gap`=(from, to) before NOW is left out;
    `spike`=(minutes before NOW, value) puts one busy sample in."""
    out, t = [], NOW - start
    while t <= NOW:
        if not (gap and NOW - timedelta(minutes=gap[0]) <= t < NOW - timedelta(minutes=gap[1])):
            v = value
            if spike and abs((NOW - t) - timedelta(minutes=spike[0])) < STEP / 2:
                v = spike[1]
            out.append((t, v))
        t += STEP
    return Series(metric, labels, out)


GR, UTIL = "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"


def both(labels, frac=0.0, **kw):
    """A GPU whose exporter has both metrics (UTIL in %, GR as a fraction)."""
    spike = kw.pop("spike", None)
    return [history(GR, labels, frac, spike=spike and (spike[0], spike[1]), **kw),
            history(UTIL, labels, frac * 100, spike=spike and (spike[0], spike[1] * 100), **kw)]


@pytest.fixture
def prom(prometheus_factory):
    data = [
        *both(gpu_labels("team-a", "idle-0")),
        *both(gpu_labels("team-a", "busy-0", node="n2"), spike=(12, 0.6)),
        history(UTIL, gpu_labels("team-b", "util-only", node="n3"), 0),         # no GR_ENGINE
        history(UTIL, gpu_labels("team-b", "util-busy", node="n4"), 35),
        *both(gpu_labels("team-c", "gappy", node="n5"), gap=(20, 10)),
        *both(gpu_labels("team-c", "young", node="n6"), start=timedelta(minutes=12)),
        *both(gpu_labels("team-d", "multi", 0, node="n7")),
        *both(gpu_labels("team-d", "multi", 1, node="n7"), spike=(3, 0.9)),
        *both(gpu_labels("team-e", "exported", node="n8", scheme="exported")),
        *both(gpu_labels("team-f", "h100", node="n9", model="NVIDIA H100 80GB HBM3")),
        # Busy long ago, idle for the whole window.
        *both(gpu_labels("team-a", "was-busy", node="n10"), spike=(40, 0.9)),
        # Busy, gone ten minutes ago: in the window, but no longer reporting.
        history(UTIL, gpu_labels("team-b", "ended", node="n11"), 50, gap=(10, -1)),
    ]
    server = prometheus_factory(data)
    return PrometheusGateway(server.url)


def run(prom, **kw):
    """Every GPU of the pods that may be idle (a pod none of whose GPUs was idle is absent)."""
    q = IdleQuery(**kw)
    answer, _ = idle_gpus_read(prom, q, at=NOW)
    return {(s.namespace, s.pod, s.gpu): s for s in answer.series}, answer


def by_pod(result):
    out = {}
    for (ns, pod, _), s in result.items():
        out.setdefault((ns, pod), []).append(s)
    return out


def test_max_per_gpu_gr_engine_first_util_as_fallback(prom):
    result, q = run(prom)
    pods = by_pod(result)
    assert [s.max_utilization for s in pods[("team-a", "idle-0")]] == [0.0]
    assert pods[("team-b", "util-only")][0].max_utilization == 0.0
    # Busy pods stay in Prometheus: only their number comes back.
    assert ("team-a", "busy-0") not in pods and ("team-b", "util-busy") not in pods
    # The census counts the GPU pods reporting now ("ended" stopped ten minutes ago), per namespace.
    assert q.pods_seen == 10 and len(pods) == 8
    assert q.pods_per_namespace == {"team-a": 3, "team-b": 2, "team-c": 2, "team-d": 1, "team-e": 1, "team-f": 1}
    assert pods[("team-a", "was-busy")][0].max_utilization == 0.0
    assert pods[("team-a", "idle-0")][0].complete


@pytest.mark.parametrize("scheme", ["pod", "exported"])
def test_gr_engine_decides_for_its_gpu_and_util_is_held_to_the_threshold_exactly(prometheus_factory, scheme):
    def gpu(pod, node):
        return gpu_labels("team-g", pod, node=node, scheme=scheme)

    data = [
        # GR_ENGINE busy while GPU_UTIL reads 0: busy (GR_ENGINE decides where it exists).
        history(GR, gpu("gr-busy", "n1"), 0.5), history(UTIL, gpu("gr-busy", "n1"), 0),
        # GR_ENGINE idle while GPU_UTIL reads 60 %: idle.
        history(GR, gpu("gr-idle", "n2"), 0.0), history(UTIL, gpu("gr-idle", "n2"), 60),
        # GPU_UTIL only: 1 % is the 0.01 threshold itself (not under it), 0.99 % is under.
        history(UTIL, gpu("at-threshold", "n3"), 1.0),
        history(UTIL, gpu("under", "n4"), 0.99),
        # Two GPUs, one of them busy: the pod is busy.
        history(UTIL, gpu_labels("team-g", "half", 0, node="n5", scheme=scheme), 0),
        history(UTIL, gpu_labels("team-g", "half", 1, node="n5", scheme=scheme), 40),
    ]
    prom = PrometheusGateway(prometheus_factory(data).url)
    answer, _ = idle_gpus_read(prom, IdleQuery(idle_threshold=0.01), at=NOW)
    idle = pods_to_look_up(list(answer.series), PruneSettings(idle_threshold=0.01))
    assert idle == {("team-g", "gr-idle"), ("team-g", "under")}
    assert answer.pods_seen == 5 and answer.pods_per_namespace == {"team-g": 5}


def test_gaps_and_short_histories_are_flagged_incomplete(prom):
    result, q = run(prom, namespace="team-c")
    pods = by_pod(result)
    assert set(pods) == {("team-c", "gappy"), ("team-c", "young")}
    assert [(s.complete, s.max_utilization) for s in pods[("team-c", "gappy")]] == [(False, 0.0)]
    assert [(s.complete, s.max_utilization) for s in pods[("team-c", "young")]] == [(False, 0.0)]


def test_multi_gpu_pod_has_one_series_per_gpu(prom):
    pods = by_pod(run(prom, namespace="team-d")[0])
    assert sorted(s.max_utilization for s in pods[("team-d", "multi")]) == [0.0, pytest.approx(0.9)]


@pytest.mark.parametrize("scheme,expected", [
    ("auto", {("team-a", "idle-0"), ("team-e", "exported")}),
    ("pod", {("team-a", "idle-0")}),
    ("exported", {("team-e", "exported")}),
])
def test_both_label_schemes(prom, scheme, expected):
    pods = by_pod(run(prom, namespace="team-a|team-e", label_scheme=scheme)[0])
    assert {p for p in pods if p[1] in ("idle-0", "exported")} == expected


def test_model_filter_is_a_regex(prom):
    pods = by_pod(run(prom, model_name="NVIDIA H100.*")[0])
    assert set(pods) == {("team-f", "h100")}


@pytest.mark.parametrize("hostile", ['"}', '"} or vector(1)', 'team-a"} or vector(1) or {x="',
                                     '.*"} or vector(1) #', '\\"} or vector(1)'])
def test_hostile_filters_match_nothing_and_cannot_add_series(prom, hostile):
    for kw in ({"namespace": hostile}, {"model_name": hostile}):
        result, _ = run(prom, **kw)
        assert result == {}


def test_prometheus_rejecting_a_query_is_a_clear_error(prom):
    with pytest.raises(PrometheusError, match="Prometheus at"):
        prom.query("max_over_time(", at=NOW)


def test_utilization_history_charts_the_busiest_gpu_per_pod_in_both_schemes(prom):
    from pruning.query import utilization_history_promql

    pods = [("team-d", "multi"), ("team-e", "exported"), ("team-b", "util-busy"), ("team-a", 'x"} or vector(1)')]
    result = prom.query_range(utilization_history_promql(pods), start=NOW - timedelta(minutes=30), end=NOW,
                              step="60s")
    peaks = {}
    for series in result:
        m = series["metric"]
        key = (m.get("exported_namespace") or m["namespace"], m.get("exported_pod") or m["pod"])
        peaks[key] = max(float(v) for _, v in series["values"])
    assert peaks == {("team-d", "multi"): pytest.approx(0.9), ("team-e", "exported"): 0.0,
                     ("team-b", "util-busy"): pytest.approx(0.35)}


def test_queries_sent_at_once_answer_in_order_and_fail_clearly(prom):
    first, second = prom.query_many(["vector(1)", "vector(2)"], at=NOW)
    assert [s.value for s in first] == [1.0] and [s.value for s in second] == [2.0]
    calls = prom.calls
    with pytest.raises(PrometheusError, match="Prometheus at"):
        prom.query_many(["vector(1)", "max_over_time("], at=NOW)
    assert prom.calls == calls + 2   # both were sent; the bad one named
