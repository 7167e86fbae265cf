"""The pruner and an org's scale to zero on one workload.

A workload asleep for two reasons (its GPUs idled, and its org went dormant) wakes only
when both let it, and never above its owner's floor: the org's wake leaves the pruner's
"0" alone, and the pruner's restore leaves the org's "0" alone — a pynode's owner values
go to the org's record and come back at the wake; a model is left as it is, the
decision still restorable, until the org is awake. End to end: the simulated cluster
through the official client, a real Prometheus, the database.
"""
from __future__ import annotations

import pytest
from kubernetes import client as k8s

from audit.models import AuditEntry
from clusters.labels import MIN_SCALE, OWNER_MIN_SCALE
from clusters.models import Cluster
from config import clock
from orgs import services as org_services
from orgs.models import Org
from pruning.models import PruneDecision
from pruning.services import PruneParams, prune_decision_restore, prune_run_execute

from pruning_world import World, inference_service, knative_service

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.prometheus]

NS = "team-c"
KN = ("serving.knative.dev", "v1")


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        yield w


def org_of(world: World) -> Org:
    cluster = Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig)
    return Org.objects.create(slug=NS, namespace=NS, cluster=cluster, last_activity_at=clock.now())


def pruned(world: World, obj: dict, name: str) -> PruneDecision:
    """`obj` created idle, 40 minutes of history, one scale-down run: its decision."""
    world.create(obj)
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down"), actor="test")
    return run.decisions.get(owner_name=name, result="succeeded")


def org_switch(org: Org, *, dormant: bool) -> org_services.ApplyOutcome:
    """The org turns dormant (or wakes) and its scale to zero is applied, as the queued task does."""
    Org.objects.filter(id=org.id).update(dormant=dormant, dormant_since=clock.now() if dormant else None)
    outcome = org_services.org_scale_to_zero_apply(org_id=org.id)
    assert outcome.complete, outcome.summary()
    return outcome


def restore(world: World, d: PruneDecision) -> PruneDecision:
    return prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="operator", now=world.now())


def pynode(world: World) -> dict:
    return k8s.CustomObjectsApi(world.api).get_namespaced_custom_object(*KN, NS, "services", "kn")


def pynode_service() -> dict:
    obj = knative_service("kn", NS, util="0")
    obj["metadata"]["labels"] = {"capacity.io/component": "pynode"}
    return obj


def revisions(world: World, service: str) -> list[str]:
    found = k8s.CustomObjectsApi(world.api).list_namespaced_custom_object(
        *KN, NS, "revisions", label_selector=f"serving.knative.dev/service={service}")["items"]
    return sorted(r["metadata"]["name"] for r in found)


def running_pods(world: World) -> list[str]:
    world.control.advance(10)
    return [p.metadata.name for p in k8s.CoreV1Api(world.api).list_namespaced_pod(NS).items
            if not p.metadata.deletion_timestamp and p.status.phase in ("Pending", "Running")]


def test_the_orgs_wake_leaves_the_pruners_zero_and_restore_then_gives_the_owners_floor(world):
    org = org_of(world)
    d = pruned(world, pynode_service(), "kn")
    org_switch(org, dormant=True)

    org_switch(org, dormant=False)

    # The wake gives back what the pynode held when the org fell asleep: the pruner's "0".
    assert pynode(world)["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "0"
    assert OWNER_MIN_SCALE not in (pynode(world)["metadata"].get("annotations") or {})
    assert restore(world, d).restore == "restored"
    assert pynode(world)["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "1"


def test_a_restore_while_the_org_sleeps_keeps_the_pynode_asleep_until_the_org_wakes(world):
    org = org_of(world)
    d = pruned(world, pynode_service(), "kn")
    org_switch(org, dormant=True)
    made = revisions(world, "kn")

    d = restore(world, d)

    # Not woken: no new revision, min-scale still "0"; the owner's floor is the org's to give back.
    ksvc = pynode(world)
    assert ksvc["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "0"
    assert ksvc["metadata"]["annotations"][OWNER_MIN_SCALE] == "1"
    assert revisions(world, "kn") == made
    assert d.restore == "restored" and d.error == ""
    entry = AuditEntry.objects.get(app="pruning", action="workload_restore")
    assert entry.cause.endswith("into the org's record: org team-c is dormant since "
                                f"{Org.objects.get(id=org.id).dormant_since:%Y-%m-%d %H:%M} UTC: it keeps pynode "
                                "team-c/kn at zero until it wakes")
    assert entry.new["annotations"] == {OWNER_MIN_SCALE: "1"}
    events = k8s.CoreV1Api(world.api).list_namespaced_event(NS).items
    assert any(e.reason == "GPUIdleRestored" and "is dormant" in e.message for e in events)
    # The reconcile finds nothing to fight over…
    result = org_services.orgs_reconcile(now=clock.now(), cluster=org.cluster)
    assert [(o.kind, o.drift, o.patched) for o in result.outcomes] == [("holding", [], [])]
    # …and the wake brings the owner's floor back.
    org_switch(org, dormant=False)
    assert pynode(world)["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "1"


def test_an_exempt_pynode_of_a_dormant_org_is_restored_at_once(world):
    org = org_of(world)
    d = pruned(world, pynode_service(), "kn")
    org_switch(org, dormant=True)
    org_services.workload_hold_set(org=org, kind="pynode", name="kn", until=None, reason="demo day", actor=None,
                                   now=clock.now())

    assert restore(world, d).restore == "restored"

    assert pynode(world)["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "1"


@pytest.mark.parametrize(("kserve", "owner_value"), [
    ("0.15", {"annotations": {"serving.kserve.io/stop": None}}), ("0.14", {"minReplicas": 1})])
def test_a_model_whose_org_sleeps_is_not_restored_until_the_org_wakes(tmp_path, prometheus_factory, kserve,
                                                                       owner_value):
    with World.start(tmp_path, kserve_version=kserve) as world:
        world.prometheus_factory = prometheus_factory
        org = org_of(world)
        d = pruned(world, inference_service("llm", NS, util="0"), "llm")
        world.control.advance(120)
        org_switch(org, dormant=True)
        assert running_pods(world) == []

        d = restore(world, d)

        # Nothing written, no GPU pod started, and the reason said; the decision stays restorable.
        assert d.restore == "" and d.restorable and d.restore_state == owner_value
        assert d.error.startswith(f"not restored, nothing was written: org {NS} is dormant")
        assert d.error.endswith("restore it once the org is awake")
        assert running_pods(world) == []
        assert not AuditEntry.objects.filter(action="workload_restore").exists()
        result = org_services.orgs_reconcile(now=clock.now(), cluster=org.cluster)
        assert [(o.drift, o.patched) for o in result.outcomes] == [([], [])]

        # Awake, the org leaves the pruner's zero; the restore then gives the owner's value back.
        org_switch(org, dormant=False)
        assert running_pods(world) == []
        d = restore(world, d)
        assert (d.restore, d.error) == ("restored", "")
        assert running_pods(world) != []
