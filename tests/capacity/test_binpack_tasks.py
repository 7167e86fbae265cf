"""The scheduled binpack task on the simulated cluster: a refusal (403) runs once and its
run says why; a server error (5xx) is retried with back-off, each attempt recorded."""
from __future__ import annotations

import pytest

from capacity.binpack.tasks import binpack_cluster
from capacity.binpack.models import BinpackRun
from clusters import kube
from clusters.errors import Forbidden, Unavailable
from tests.kube_access import cluster_denied, denials

pytestmark = pytest.mark.django_db


def test_a_binpack_the_cluster_refuses_runs_once_and_its_run_says_why(sim_cluster_factory, tmp_path, celery_eager,
                                                                      caplog):
    handle = sim_cluster_factory()
    denied = cluster_denied(handle, tmp_path)

    result = binpack_cluster.apply(args=[denied.pk])

    assert result.failed() and isinstance(result.result, Forbidden)
    assert len(denials(handle)) == 1, "asked once: the same request would be refused the same way"
    [run] = BinpackRun.objects.filter(cluster=denied)
    assert (run.planned, run.written) == (0, 0)
    assert run.errors[0].startswith("cluster not read, nothing written: refused: 403 Forbidden")
    assert "binpack_cluster(" in caplog.text and "failed, not retried: refused: 403 Forbidden" in caplog.text


def test_a_binpack_that_meets_server_errors_is_retried_then_fails_with_them(sim_cluster_factory, settings,
                                                                            celery_eager):
    settings.KUBE_RETRY_ATTEMPTS = 1   # one API request per task attempt: the task's retries are what is counted
    handle = sim_cluster_factory()
    handle.control.set_faults(seed=0, error_rate=1.0)

    result = binpack_cluster.apply(args=[handle.cluster.pk])

    assert result.failed() and isinstance(result.result, Unavailable)
    assert kube.gateway_for(handle.cluster).calls_total() == 1 + binpack_cluster.max_retries
    runs = BinpackRun.objects.filter(cluster=handle.cluster)
    assert runs.count() == 1 + binpack_cluster.max_retries
    assert all(r.errors[0].startswith("cluster not read, nothing written: transient: 500 InternalError") for r in runs)


def test_a_binpack_retried_after_a_server_error_writes_when_the_cluster_answers(sim_cluster_factory, settings,
                                                                                celery_eager):
    settings.KUBE_RETRY_ATTEMPTS = 1
    handle = sim_cluster_factory()
    # Seed 8 draws 0.23, 0.70, 1.00 for the node lists: the first meets a 500, the next are answered.
    handle.control.set_faults(seed=8, error_rate=0.5, match={"verbs": ["list"], "resources": ["nodes"]})

    result = binpack_cluster.apply(args=[handle.cluster.pk])

    assert result.successful(), result.result
    failed, done = BinpackRun.objects.filter(cluster=handle.cluster).order_by("id")
    assert failed.errors[0].startswith("cluster not read, nothing written: transient: 500")
    assert done.errors == [] and result.result["run"] == done.pk

