"""The scheduled registry sync on the simulated cluster: a refusal (403) runs once and
fails with its reason; a server error (5xx) is retried with back-off."""
from __future__ import annotations

import pytest

from capacity.runbook.models import ServedModel
from capacity.runbook.tasks import registry_sync_cluster
from clusters import kube
from clusters.errors import Forbidden, Unavailable
from tests.kube_access import cluster_denied, denials

pytestmark = pytest.mark.django_db


def test_a_registry_sync_the_cluster_refuses_runs_once_and_says_why(sim_cluster_factory, tmp_path, celery_eager,
                                                                    caplog):
    handle = sim_cluster_factory()
    denied = cluster_denied(handle, tmp_path)

    result = registry_sync_cluster.apply(args=[denied.pk])

    assert result.failed() and isinstance(result.result, Forbidden)
    assert len(denials(handle)) == 1, "asked once: the same request would be refused the same way"
    assert "registry_sync_cluster(" in caplog.text and "failed, not retried: refused: 403 Forbidden" in caplog.text
    assert not ServedModel.objects.filter(cluster=denied).exists()


def test_a_registry_sync_that_meets_server_errors_is_retried(sim_cluster_factory, settings, celery_eager, caplog):
    settings.KUBE_RETRY_ATTEMPTS = 1   # one API request per task attempt
    handle = sim_cluster_factory()
    handle.control.set_faults(seed=0, error_rate=1.0)

    result = registry_sync_cluster.apply(args=[handle.cluster.pk])

    assert result.failed() and isinstance(result.result, Unavailable)
    assert kube.gateway_for(handle.cluster).calls_total() == 1 + registry_sync_cluster.max_retries
    assert caplog.text.count("failed (attempt ") == 1 + registry_sync_cluster.max_retries
    assert "not retried" not in caplog.text
