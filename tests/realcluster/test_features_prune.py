"""Prune scale-down and restore end to end on both backends: idle GPU pods (their DCGM
history, keyed by the pods' real names, backfilled into a real Prometheus) scaled to
zero through their owners, announced, and put back — by the Deployment and ReplicaSet
controllers of simcluster, and of upstream kube-controller-manager on the real tier.

The pruner only judges a pod older than its window plus grace, and a real pod's
creationTimestamp is the apiserver's: the window is 30 s (two 15 s steps), the grace 0,
and the test waits until the pods are that old — simcluster by advancing its clock, the
real tier in real time with a deadline. The history covers the window up to that `now`.
"""
from __future__ import annotations

from datetime import timedelta

import pytest

from clusters import kube
from clusters.prometheus import PrometheusGateway
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, prune_decision_restore, prune_run_execute
from tests.prometheus_fixtures import PrometheusServer, Series, gpu_labels

from .pool import GpuPool

pytestmark = pytest.mark.prometheus

WINDOW, STEP, SAMPLE_EVERY = 30, 15, 5      # seconds
UTILIZATION = {"web": 0.0, "bare": 0.0, "keep": 0.0, "busy": 60.0}   # DCGM_FI_DEV_GPU_UTIL, percent
SECONDS = 40                                 # simulated on simcluster, wall time on the real tier


@pytest.fixture
def gpus(tier_cluster):
    _, backend = tier_cluster
    pool = GpuPool(backend, "prune")
    yield pool
    pool.close()


@pytest.fixture
def prometheus(tmp_path):
    servers = []

    def start(series: list[Series]) -> PrometheusGateway:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}")
        server.backfill(series)
        servers.append(server.start())
        return PrometheusGateway(server.url)

    yield start
    for server in servers:
        server.stop()


def running(pool: GpuPool, app: str) -> list:
    return [p for p in pool.pods(app=app) if p.status.phase == "Running"]


def history(pool: GpuPool, now) -> list[Series]:
    """One GPU per pod, sampled every 5 s from well before the window up to `now`."""
    moments = [now - timedelta(seconds=s) for s in range(WINDOW + 60, -1, -SAMPLE_EVERY)]
    series = []
    for pod in pool.pods():
        value = UTILIZATION[pod.metadata.labels["app"]]
        labels = gpu_labels(pool.ns, pod.metadata.name, node=pod.spec.node_name)
        series.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(moment, value) for moment in moments]))
    return series


def test_idle_deployment_and_replicaset_are_scaled_to_zero_announced_and_restored(tier_cluster, gpus,
                                                                                  prometheus):
    cluster, backend = tier_cluster
    gateway = kube.gateway_for(cluster)
    gpus.node_add("n1")
    gpus.deployment("web", replicas=2)
    gpus.deployment("busy", replicas=1)
    gpus.deployment("keep", replicas=1, annotations={"capacity.io/prune": "false"})
    gpus.replicaset("bare", replicas=1)
    expected = {"web": 2, "busy": 1, "keep": 1, "bare": 1}
    backend.settle(lambda: all(len(running(gpus, app)) == n for app, n in expected.items()),
                   what="every pod Running", seconds=SECONDS)
    oldest = min(p.metadata.creation_timestamp for p in gpus.pods())
    youngest = max(p.metadata.creation_timestamp for p in gpus.pods())
    backend.settle(lambda: backend.now() - youngest >= timedelta(seconds=WINDOW + 1),
                   what=f"every pod older than the {WINDOW} s window", seconds=SECONDS)
    now = backend.now()
    assert now - oldest < timedelta(seconds=WINDOW + SECONDS)
    prom = prometheus(history(gpus, now))

    run = prune_run_execute(kube_gateway=gateway, prometheus=prom, now=now, cluster=cluster, actor="test",
                            params=PruneParams(run_mode="scale-down", namespace=gpus.ns, window_seconds=WINDOW,
                                               step_seconds=STEP, max_gap_seconds=STEP * 2, grace_seconds=0))

    owners: dict = {}
    for d in run.decisions.all():
        owners.setdefault((d.owner_kind, d.owner_name), []).append(d)
    acted = {k for k, ds in owners.items() if any(d.result == "succeeded" for d in ds)}
    assert acted == {("Deployment", "web"), ("ReplicaSet", "bare")}
    assert sorted(d.reason for d in owners[("Deployment", "web")]) == ["idle", "owner-already-in-plan"]
    assert [d.reason for d in owners[("Deployment", "keep")]] == ["opted-out"]
    assert ("Deployment", "busy") not in owners
    assert run.busy_pods == 1
    assert run.status == "succeeded" and run.acted == 2 and run.failed == 0

    # The Deployment, not its Scale: upstream's autoscaling/v1 Scale omits `replicas: 0`
    # (omitempty), which the client reads as None; simcluster serves the 0.
    assert gpus.apps.read_namespaced_deployment("web", gpus.ns).spec.replicas == 0
    assert gpus.apps.read_namespaced_replica_set("bare", gpus.ns).spec.replicas == 0
    assert gpus.apps.read_namespaced_deployment("keep", gpus.ns).spec.replicas == 1
    backend.settle(lambda: not gpus.pods(app="web") and not gpus.pods(app="bare"),
                   what="the idle pods gone", seconds=SECONDS)
    assert len(running(gpus, "busy")) == 1 and len(running(gpus, "keep")) == 1
    announced = {(e.involved_object.kind, e.involved_object.name, e.involved_object.api_version)
                 for e in gpus.events(gpus.ns, "GPUIdleScaledToZero")}
    assert announced == {("Deployment", "web", "apps/v1"), ("ReplicaSet", "bare", "apps/v1")}

    # Restore puts back exactly what was taken away, and the controllers bring the pods back.
    # The operator restores later than the prune: the gateway names an Event
    # `<object>.<unix nanoseconds, hex>` (as client-go does), so on simcluster's manual clock
    # a restore at the prune's very instant would be refused as AlreadyExists.
    backend.wait(1)
    for d in PruneDecision.objects.filter(run=run, result="succeeded"):
        restored = prune_decision_restore(kube_gateway=gateway, decision=d, actor="alice", now=backend.now())
        assert (restored.restore, restored.error) == ("restored", "")
    assert gpus.apps.read_namespaced_deployment("web", gpus.ns).spec.replicas == 2
    assert gpus.apps.read_namespaced_replica_set("bare", gpus.ns).spec.replicas == 1
    backend.settle(lambda: len(running(gpus, "web")) == 2 and len(running(gpus, "bare")) == 1,
                   what="the restored pods Running", seconds=SECONDS)
    assert {e.involved_object.name for e in gpus.events(gpus.ns, "GPUIdleRestored")} == {"web", "bare"}
    assert PruneRun.objects.get(pk=run.pk).decisions.filter(restore="restored").count() == 2
