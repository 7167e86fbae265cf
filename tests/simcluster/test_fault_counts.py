"""The simulated cluster counts the faults it injected, so a chaos run can report them."""
from __future__ import annotations

import kubernetes
import pytest


def test_injected_faults_are_counted_by_kind_and_reset_by_a_new_configuration(kube):
    kube.control.set_faults(seed=7, error_rate=1.0, match={"verbs": ["list"]})
    for _ in range(3):
        with pytest.raises(kubernetes.client.ApiException) as failure:
            kube.core.list_namespaced_pod("team-a", _preload_content=False)
        assert failure.value.status == 500
    kube.core.read_namespace("team-a")   # a get: not matched, not counted
    assert kube.control.faults()["injected"] == {"internal_error": 3, "throttled": 0, "conflict": 0, "delayed": 0,
                                                 "watch_dropped": 0}

    kube.control.set_faults(seed=7, conflict_rate=1.0, latency_ms=1)
    kube.core.read_namespace("team-a")   # delayed, never a conflict: reads do not conflict
    with pytest.raises(kubernetes.client.ApiException) as failure:
        kube.core.patch_namespace("team-a", {"metadata": {"labels": {"x": "y"}}})
    assert failure.value.status == 409
    assert kube.control.faults()["injected"] == {"internal_error": 0, "throttled": 0, "conflict": 1, "delayed": 2,
                                                 "watch_dropped": 0}


def test_a_watch_cut_at_its_injected_deadline_is_counted(kube):
    kube.control.set_faults(seed=1, drop_watch_after=0.3, match={"verbs": ["watch"]})
    events = list(kubernetes.watch.Watch().stream(kube.core.list_namespaced_pod, "team-a", timeout_seconds=30))
    assert events == []   # the stream ended long before its 30 s: the injected cut
    assert kube.control.faults()["injected"]["watch_dropped"] == 1
    # A watch that ends at its own timeout, before the injected cut, is not counted as cut.
    kube.control.set_faults(seed=1, drop_watch_after=5.0, match={"verbs": ["watch"]})
    list(kubernetes.watch.Watch().stream(kube.core.list_namespaced_pod, "team-a", timeout_seconds=1))
    assert kube.control.faults()["injected"]["watch_dropped"] == 0
