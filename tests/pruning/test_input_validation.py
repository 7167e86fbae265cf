"""Bad numbers and names never start a prune: the error names the flag or setting."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from clusters.models import Cluster
from pruning.models import PruneRun
from pruning.services import PruneParamError, PruneParams

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    # Never reached: every case below must fail before any cluster or Prometheus is asked.
    return Cluster.objects.create(name="sim", kubeconfig_path="/nonexistent/kubeconfig",
                                  prometheus_url="http://127.0.0.1:9")


@pytest.mark.parametrize("args,message", [
    (["--idle-threshold", "nan"], "--idle-threshold: idle threshold is a fraction in (0, 1], got nan"),
    (["--idle-threshold", "inf"], "--idle-threshold: idle threshold is a fraction in (0, 1], got inf"),
    (["--idle-threshold=-inf"], "--idle-threshold: idle threshold is a fraction"),
    (["--idle-threshold", "0"], "--idle-threshold: idle threshold is a fraction in (0, 1], got 0.0"),
    (["--idle-threshold", "-0.5"], "--idle-threshold: idle threshold is a fraction"),
    (["--check-interval", "nan"], "--check-interval: seconds between runs must be between 0 and 86400, got nan"),
    (["--check-interval", "inf"], "--check-interval: seconds between runs must be between 0"),
    (["--check-interval", "-1"], "--check-interval: seconds between runs must be between 0"),
    (["--check-interval", "1e12"], "--check-interval: seconds between runs must be between 0"),
    (["-t", "0"], "--duration: minutes of idleness must be between 1 and 10080, got 0"),
    (["-t", "-30"], "--duration: minutes of idleness must be between 1"),
    (["-t", str(10 ** 30)], "--duration: minutes of idleness must be between 1"),
    (["-t", "nan"], "argument -t/--duration: invalid int value: 'nan'"),
    (["--grace-period", "-1"], "--grace-period: grace period must be >= 0 seconds, got -1"),
    (["--grace-period", str(10 ** 18)], "--grace-period: the grace period must be between 0 and 604800 seconds"),
    (["--max-scale-downs", "0"], "--max-scale-downs: the cap on scale-downs per run must be between 1 and 10000"),
    (["--max-scale-downs", "-3"], "--max-scale-downs: the cap on scale-downs per run must be between 1"),
    (["--max-scale-downs", str(10 ** 9)], "--max-scale-downs: the cap on scale-downs per run must be between 1"),
    (["--runs", "-1"], "--runs: must be between 0 (no limit) and 1000000, got -1"),
    (["-n", ""], "--namespace: is empty"),
    (["-n", "  "], "--namespace: is empty"),
    (["-m", ""], "--model-name: is empty"),
    (["--prometheus-url", ""], "--prometheus-url: is empty"),
    (["--prometheus-token", ""], "--prometheus-token: is empty"),
    (["--at", ""], "--at: is empty"),
    (["--at", "yesterday"], "--at: Invalid isoformat string"),
    (["--cluster", ""], "--cluster: is empty"),
    # Undecodable bytes of an argument (`-n $'org-\xff'`): Python keeps them as lone surrogates.
    (["-n", "org-\udcff"], "--namespace: is not UTF-8 text"),
    (["-m", "\udcffA10G"], "--model-name: is not UTF-8 text"),
    (["--cluster", "sim\udcff"], "--cluster: is not UTF-8 text"),
    # Python's `re` takes these, Prometheus' RE2 does not.
    (["-n", "a{2000}"], "namespace filter 'a{2000}' repeats '{2000}' times; Prometheus' RE2 regular expressions "
                        "allow at most 1000"),
    (["-n", "team-a\\Z"], "uses '\\\\Z', which Prometheus' RE2 regular expressions do not support"),
])
def test_bad_flags_are_named_and_nothing_starts(cluster, args, message):
    with pytest.raises(CommandError) as caught:
        call_command("prune", *(["--cluster", "sim"] if "--cluster" not in args else []), "-r", "scale-down",
                     *args)
    assert message in str(caught.value)
    assert not PruneRun.objects.exists()


@pytest.mark.parametrize("setting,value,message", [
    ("PRUNER_IDLE_THRESHOLD", float("nan"), "PRUNER_IDLE_THRESHOLD: idle threshold is a fraction"),
    ("PRUNER_GRACE_SECONDS", -5, "PRUNER_GRACE_SECONDS: grace period must be >= 0"),
    ("PRUNER_MAX_SCALE_DOWNS", 0, "PRUNER_MAX_SCALE_DOWNS: the cap on scale-downs"),
    ("PRUNER_DURATION_MINUTES", 0, "PRUNER_DURATION_MINUTES: the idle window must be whole seconds >= 60"),
])
def test_bad_settings_name_the_setting(settings, setting, value, message):
    setattr(settings, setting, value)
    with pytest.raises(PruneParamError, match=message.replace("(", r"\(")):
        PruneParams.from_settings()


@pytest.mark.parametrize("field,value", [
    ("window_seconds", 60.5), ("window_seconds", True), ("idle_threshold", "0.5"), ("grace_seconds", 1.5),
    ("max_scale_downs", float("inf")), ("namespace", ""), ("model_name", " "),
])
def test_params_refuse_wrong_types_and_empty_filters(field, value):
    with pytest.raises(PruneParamError) as caught:
        PruneParams(**{field: value})
    assert caught.value.field == field


def test_params_refuse_a_filter_that_is_not_utf8():
    with pytest.raises(PruneParamError) as caught:
        PruneParams(namespace="org-\udcff")
    assert caught.value.field == "namespace" and "is not UTF-8 text" in str(caught.value)
