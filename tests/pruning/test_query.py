"""The PromQL builder: shape fixed whatever the filters say; bad regexes named clearly."""
import re
from types import SimpleNamespace

import pytest

from pruning.query import FilterError, IdleQuery, parse_result, promql_string

HOSTILE = ['"}', '"} or vector(1)', 'a"} or vector(1) #', '\\\\', '\\"} or vector(1)',
           "x\ny", "ns`", "'}", "ünï\u2028"]


def _strip_literals(q: str) -> str:
    # Remove every PromQL double-quoted literal (with escapes) to compare shapes.
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', q)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_no_filter_text_changes_the_shape_of_the_query(hostile):
    benign = IdleQuery(namespace="team-a", model_name="NVIDIA A10G").promql()
    q = IdleQuery(namespace=hostile, model_name=hostile).promql()
    assert _strip_literals(q) == _strip_literals(benign)
    assert promql_string(hostile) in q


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
    pod = IdleQuery(namespace="a", label_scheme="pod").promql()
    exported = IdleQuery(namespace="a", label_scheme="exported").promql()
    assert 'namespace=~"a"' in pod and "exported_namespace" not in pod
    assert 'exported_namespace=~"a"' in exported and 'pod!=""' not in exported.replace("exported_pod", "")
    auto = IdleQuery(namespace="a").promql()
    assert 'exported_pod=""' in auto and 'exported_namespace=~"a"' in auto


def test_window_and_gap_resolution_appear_in_the_query():
    q = IdleQuery(window_seconds=600, step_seconds=60, max_gap_seconds=120).promql()
    assert "[600s]" in q and "[120s])[600s:60s]" in q and "< bool 10) * 10" in q
    assert IdleQuery(window_seconds=600).expected_steps == 10


def test_parse_result_reads_the_gap_flag_and_both_schemes():
    result = [
        ({"namespace": "a", "pod": "p", "UUID": "G1", "modelName": "A10G", "Hostname": "n1"}, 0.005),
        ({"namespace": "a", "pod": "gappy", "UUID": "G2"}, 10.25),
        ({"namespace": "a", "pod": "nan", "UUID": "G3"}, float("nan")),
        ({"namespace": "gpu-operator", "pod": "dcgm-x", "exported_namespace": "b", "exported_pod": "q",
          "UUID": "G4"}, 0.5),
        ({"namespace": "a", "UUID": "G5"}, 0.0),   # a GPU no pod holds
    ]
    got = {(s.namespace, s.pod): s for s in parse_result([SimpleNamespace(labels=l, value=v) for l, v in result])}
    assert set(got) == {("a", "p"), ("a", "gappy"), ("a", "nan"), ("b", "q")}
    assert (got[("a", "p")].max_utilization, got[("a", "p")].complete, got[("a", "p")].model) == (0.005, True, "A10G")
    assert got[("a", "gappy")].max_utilization == pytest.approx(0.25) and not got[("a", "gappy")].complete
    assert got[("a", "nan")].max_utilization is None
    assert got[("b", "q")].max_utilization == 0.5 and got[("b", "q")].gpu == "G4"


def test_the_pod_scheme_reads_pod_labels_even_beside_exported_ones():
    # honor_labels=false: `pod`/`namespace` are the exporter's own; asked for the "pod"
    # scheme, the series belongs to the exporter, not to the workload in exported_pod.
    labels = {"pod": "dcgm-exporter-x", "namespace": "gpu-operator",
              "exported_pod": "web-1", "exported_namespace": "team-a", "UUID": "GPU-1"}
    item = [SimpleNamespace(labels=labels, value=0.0)]
    assert [(s.namespace, s.pod) for s in parse_result(item, label_scheme="pod")] == \
        [("gpu-operator", "dcgm-exporter-x")]
    assert [(s.namespace, s.pod) for s in parse_result(item, label_scheme="exported")] == [("team-a", "web-1")]
    assert [(s.namespace, s.pod) for s in parse_result(item)] == [("team-a", "web-1")]
    plain = [SimpleNamespace(labels={"pod": "web-1", "namespace": "team-a"}, value=0.0)]
    assert parse_result(plain, label_scheme="exported") == []
    with pytest.raises(FilterError, match="label scheme"):
        parse_result(plain, label_scheme="both")
