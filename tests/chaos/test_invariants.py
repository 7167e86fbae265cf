"""The chaos suite's invariant checks fail when the cluster or the database shows what they
forbid: a node cordoned by no job, a pod orphaned with no record, an org dormant in the
database while its pynode stays warm, an idle org left warm. No workers here."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest

from config import clock
from orgs.models import Org
from orgs.services import orgs_sync

from .driver import ChaosDriver, _model_pods_running
from .world import MODEL_NS, Kube, org_slug, scenario_objects

pytestmark = pytest.mark.django_db(transaction=True)


def _driver() -> tuple[ChaosDriver, list[str]]:
    said: list[str] = []
    return ChaosDriver(seed=7, procs=None, make_cluster=None, send_task=None, say=said.append), said


def test_defrag_checks_see_a_stray_cordon_and_an_unrecorded_orphan(sim_cluster_factory):
    handle = sim_cluster_factory(scenario_objects(0), name="chaos-check", speed=50.0)
    kube = Kube(handle.kubeconfig_path)
    deadline = time.monotonic() + 30          # wall time: the cluster's clock runs
    while not _model_pods_running(kube):
        assert time.monotonic() < deadline, "the model pods did not start"
        time.sleep(0.1)
    driver, _ = _driver()
    driver.check_defrag(handle.cluster, kube)
    assert driver.stats.violations == []

    kube.core.patch_node("n2", {"spec": {"unschedulable": True}})
    pod = kube.core.list_namespaced_pod(MODEL_NS).items[0]
    kube.core.patch_namespaced_pod(pod.metadata.name, MODEL_NS, [
        {"op": "remove", "path": "/metadata/ownerReferences"},
        {"op": "remove", "path": "/metadata/labels/pod-template-hash"}])
    driver.check_defrag(handle.cluster, kube)
    assert driver.stats.violations == [
        "[chaos seed=7 scenario=0] node n2 cordoned without a live job",
        f"[chaos seed=7 scenario=0] pod {MODEL_NS}/{pod.metadata.name} orphaned without a record",
    ]


def test_org_checks_see_a_wrongly_dormant_org_and_one_left_warm(sim_cluster_factory):
    handle = sim_cluster_factory(scenario_objects(0), name="chaos-check")
    kube = Kube(handle.kubeconfig_path)
    orgs_sync(cluster=handle.cluster, now=clock.now())
    idle, busy = org_slug(0, "idle-a"), org_slug(0, "busy")
    Org.objects.filter(slug=busy).update(dormant=True, dormant_since=clock.now())
    Org.objects.filter(slug=idle).update(last_activity_at=clock.now() - timedelta(hours=25))
    driver, _ = _driver()
    driver.org_roles = {idle: "none", busy: "busy"}
    driver.check_orgs(handle.cluster, kube)
    assert driver.stats.violations == [
        f"[chaos seed=7 scenario=0] org {idle} idle 25 h without activity left warm (not dormant)",
        f"[chaos seed=7 scenario=0] org {busy} (busy) wrongly dormant",
        f"[chaos seed=7 scenario=0] org {busy} (busy, dormant=True): pynode min-scale '1'",
    ]
