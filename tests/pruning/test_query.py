"""The PromQL builder: shape fixed whatever the filters say; bad regexes named clearly."""
import re
from types import SimpleNamespace

import pytest

from pruning.query import FilterError, IdleQuery, parse_candidates, parse_census, parse_followup, promql_string

HOSTILE = ['"}', '"} or vector(1)', 'a"} or vector(1) #', '\\\\', '\\"} or vector(1)',
           "x\ny", "ns`", "'}", "ünï\u2028"]


def _strip_literals(q: str) -> str:
    # Remove every PromQL double-quoted literal (with escapes) to compare shapes.
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', q)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_no_filter_text_changes_the_shape_of_the_query(hostile):
    pods = [("team-a", "web-1")]
    for build in (lambda q: q.candidates_promql(), lambda q: q.census_promql(), lambda q: q.followup_promql(pods)):
        benign = build(IdleQuery(namespace="team-a", model_name="NVIDIA A10G", power_threshold_watts=80))
        q = build(IdleQuery(namespace=hostile, model_name=hostile, power_threshold_watts=80))
        assert _strip_literals(q) == _strip_literals(benign)
        assert promql_string(hostile) in q


@pytest.mark.parametrize("hostile", HOSTILE)
def test_no_pod_or_namespace_name_changes_the_shape_of_the_follow_up(hostile):
    benign = IdleQuery().followup_promql([("team-a", "web-1")])
    q = IdleQuery().followup_promql([(hostile, hostile)])
    assert _strip_literals(q) == _strip_literals(benign)


def test_literal_round_trips_through_go_style_unquoting():
    import json
    for text in HOSTILE:
        assert json.loads(promql_string(text)) == text


@pytest.mark.parametrize("bad,words", [
    ("team-(a", "not a valid regular expression"),
    ("[z-a]", "not a valid regular expression"),
    ("(?=x)team", "RE2"),
    ("(a)\\1", "RE2"),
])
def test_invalid_regex_is_a_clear_error_naming_the_filter(bad, words):
    with pytest.raises(FilterError) as err:
        IdleQuery(namespace=bad)
    assert "namespace filter" in str(err.value) and words in str(err.value)
    with pytest.raises(FilterError, match="GPU model filter"):
        IdleQuery(model_name=bad)


def test_label_scheme_is_checked_and_selects_the_right_labels():
    with pytest.raises(FilterError, match="label scheme"):
        IdleQuery(label_scheme="pods")
    pod = IdleQuery(namespace="a", label_scheme="pod").candidates_promql()
    exported = IdleQuery(namespace="a", label_scheme="exported").candidates_promql()
    assert 'namespace=~"a"' in pod and "exported_namespace" not in pod
    assert 'exported_namespace=~"a"' in exported and 'pod!=""' not in exported.replace("exported_pod", "")
    auto = IdleQuery(namespace="a").candidates_promql()
    assert 'exported_pod=""' in auto and 'exported_namespace=~"a"' in auto


def test_window_and_gap_resolution_appear_in_the_query():
    q = IdleQuery(window_seconds=600, step_seconds=60, max_gap_seconds=120).followup_promql([("a", "p")])
    assert "[600s]" in q and "[120s])[600s:60s]" in q and "< 10)" in q
    assert "[600s]" in IdleQuery(window_seconds=600).candidates_promql()


def test_power_is_asked_only_with_a_threshold_and_in_both_schemes():
    assert "DCGM_FI_DEV_POWER_USAGE" not in IdleQuery().followup_promql([("a", "p")])
    q = IdleQuery(power_threshold_watts=75.5).followup_promql([("a", "p")])
    assert 'DCGM_FI_DEV_POWER_USAGE{pod=~"p",namespace=~"a",exported_pod=""}' in q
    assert 'DCGM_FI_DEV_POWER_USAGE{exported_pod=~"p",exported_namespace=~"a"}' in q
    with pytest.raises(ValueError, match="finite"):
        IdleQuery(power_threshold_watts=float("nan"))
    assert IdleQuery(window_seconds=600).expected_steps == 10


def item(labels, value):
    return SimpleNamespace(labels=labels, value=value)


def test_parse_follow_up_reads_peaks_gaps_power_and_both_schemes():
    exported = {"namespace": "gpu-operator", "pod": "dcgm-x", "exported_namespace": "b", "exported_pod": "q",
                "UUID": "G4"}
    result = [
        item({"namespace": "a", "pod": "p", "UUID": "G1", "modelName": "A10G", "Hostname": "n1",
              "prune_part": "peak"}, 0.005),
        item({"namespace": "a", "pod": "p", "UUID": "G1", "prune_part": "watts"}, 61.5),
        item({"namespace": "a", "pod": "gappy", "UUID": "G2", "prune_part": "peak"}, 0.25),
        item({"namespace": "a", "pod": "gappy", "UUID": "G2", "prune_part": "gap"}, 12),
        item({"namespace": "a", "pod": "nan", "UUID": "G3", "prune_part": "peak"}, float("nan")),
        item({**exported, "prune_part": "peak"}, 0.5),
        item({"namespace": "a", "UUID": "G5", "prune_part": "peak"}, 0.0),   # a GPU no pod holds
        item({"namespace": "z", "pod": "p", "UUID": "G6", "prune_part": "peak"}, 0.0),   # not a candidate
    ]
    series = parse_followup(result, pods={("a", "p"), ("a", "gappy"), ("a", "nan"), ("b", "q")})
    got = {(s.namespace, s.pod): s for s in series}
    assert set(got) == {("a", "p"), ("a", "gappy"), ("a", "nan"), ("b", "q")}
    p = got[("a", "p")]
    assert (p.max_utilization, p.complete, p.model, p.max_power_watts) == (0.005, True, "A10G", 61.5)
    assert got[("a", "gappy")].max_utilization == pytest.approx(0.25) and not got[("a", "gappy")].complete
    assert got[("a", "nan")].max_utilization is None and got[("a", "nan")].max_power_watts is None
    assert got[("b", "q")].max_utilization == 0.5 and got[("b", "q")].gpu == "G4"


def test_census_counts_pods_per_namespace_in_both_schemes():
    # One series per namespace and scheme; the same namespace in both schemes adds up.
    counted = [item({"namespace": "a"}, "7"), item({"exported_namespace": "b"}, 3),
               item({"exported_namespace": "a"}, 2)]
    assert parse_census(counted) == (12, {"a": 9, "b": 3})
    assert parse_census([]) == (0, {})


def test_census_counts_each_scheme_on_its_own_namespace_label():
    auto = IdleQuery(namespace="a").census_promql()
    assert "count by (namespace) (group by (namespace, pod)" in auto
    assert "count by (exported_namespace) (group by (exported_namespace, exported_pod)" in auto
    assert 'namespace=~"a"' in auto and 'exported_pod=""' in auto
    assert "_over_time" not in auto   # the last samples only, not the whole window
    pod = IdleQuery(label_scheme="pod").census_promql()
    assert "exported" not in pod


def test_the_pod_scheme_reads_pod_labels_even_beside_exported_ones():
    # honor_labels=false: `pod`/`namespace` are the exporter's own; asked for the "pod"
    # scheme, the series belongs to the exporter, not to the workload in exported_pod.
    labels = {"pod": "dcgm-exporter-x", "namespace": "gpu-operator",
              "exported_pod": "web-1", "exported_namespace": "team-a", "UUID": "GPU-1"}
    one = [SimpleNamespace(labels=labels, value=1)]
    assert parse_candidates(one, label_scheme="pod") == {("gpu-operator", "dcgm-exporter-x")}
    assert parse_candidates(one, label_scheme="exported") == {("team-a", "web-1")}
    assert parse_candidates(one) == {("team-a", "web-1")}
    plain = [SimpleNamespace(labels={"pod": "web-1", "namespace": "team-a"}, value=1)]
    assert parse_candidates(plain, label_scheme="exported") == set()
    with pytest.raises(FilterError, match="label scheme"):
        parse_candidates(plain, label_scheme="both")
