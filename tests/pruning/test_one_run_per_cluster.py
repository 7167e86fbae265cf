"""One prune run acts on a cluster at a time: a pass queued while a run of the cluster is
still `running` (its worker alive, or dead and its run not yet completed by the reconcile)
is skipped, so no owner is scaled down by two runs and counted twice."""
from __future__ import annotations

import socket

import pytest

from clusters.models import Cluster
from config import clock
from pruning.models import PruneRun
from pruning.tasks import prune_cluster

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as probe:   # nothing listens once it is closed: connection refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_pass_while_a_run_of_the_cluster_is_running_is_skipped_and_runs_once_it_is_done(settings, tmp_path):
    from simcluster.kubeconfig import write_kubeconfig

    settings.PRUNER_RUN_MODE = "scale-down"
    cluster = Cluster.objects.create(name="gpu-a", prometheus_url=f"http://127.0.0.1:{_closed_port()}",
                                     kubeconfig_path=str(write_kubeconfig(tmp_path / "gpu-a",
                                                                          f"http://127.0.0.1:{_closed_port()}")))
    other = Cluster.objects.create(name="gpu-b")
    running = PruneRun.objects.create(cluster=cluster, mode=PruneRun.Mode.SCALE_DOWN, evaluated_at=clock.now(),
                                      status=PruneRun.Status.RUNNING, lease_owner="worker:gone")
    PruneRun.objects.create(cluster=other, mode=PruneRun.Mode.SCALE_DOWN, evaluated_at=clock.now(),
                            status=PruneRun.Status.RUNNING, lease_owner="worker:elsewhere")

    assert prune_cluster(cluster.pk) is None
    assert list(PruneRun.objects.filter(cluster=cluster).values_list("pk", flat=True)) == [running.pk], \
        "no second run was started"

    # Completed (by its worker or the reconcile): the next pass runs; here it reaches the
    # cluster's Prometheus, which does not answer, and its run records that. Another
    # cluster's running run does not hold this one back.
    PruneRun.objects.filter(pk=running.pk).update(status=PruneRun.Status.SUCCEEDED, lease_expires_at=None)
    with pytest.raises(Exception):  # noqa: B017 - the transient failure the task's retry policy handles
        prune_cluster(cluster.pk)
    [second] = PruneRun.objects.filter(cluster=cluster).exclude(pk=running.pk)
    assert second.status == PruneRun.Status.FAILED and second.errors[0].startswith("transient: ")
