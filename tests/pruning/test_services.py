"""Prune runs end to end: the simulated cluster (through the real `kubernetes` client over
HTTP), its DCGM exporter's history backfilled into a real Prometheus, the database.

History is recorded by scraping the simulated exporter's `/metrics` once per simulated
minute while the simulated clock advances, then written as TSDB blocks with promtool.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes import client as k8s
from tests.prometheus_fixtures import to_exported_scheme

from audit.models import AuditEntry
from clusters.prometheus import PrometheusGateway
from pruning.query import FilterError
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, prune_decision_restore, prune_run_execute

from pruning_world import (World, deployment, inference_service, knative_service, notebook, replicaset,
                           statefulset)

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]


def by_owner(run: PruneRun) -> dict[tuple[str, str], list[PruneDecision]]:
    out: dict = {}
    for d in run.decisions.all():
        out.setdefault((d.owner_kind, d.owner_name), []).append(d)
    return out


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        yield w


def test_every_kind_is_scaled_to_zero_restored_and_announced(world: World):
    world.create(deployment("web", "team-a", replicas=2, util="0"))
    world.create(deployment("busy", "team-a", util="60"))
    world.create(replicaset("bare", "team-a", util="0"))
    world.create(statefulset("db", "team-a", util="0"))
    world.create(notebook("nb", "team-b", util="0"))
    world.create(inference_service("llm", "team-b", util="0"))
    world.create(deployment("multi", "team-c", gpus=2, util="0,70"))   # one busy GPU of two
    world.create(deployment("keep", "team-c", util="0", annotations={"capacity.io/prune": "false"}))
    world.record_history(minutes=40)
    prom = world.prometheus()

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                            params=PruneParams(run_mode="scale-down"), actor="test")

    owners = by_owner(run)
    acted = {k: v for k, v in owners.items() if any(d.result == "succeeded" for d in v)}
    assert set(acted) == {("Deployment", "web"), ("ReplicaSet", "bare"), ("StatefulSet", "db"),
                          ("Notebook", "nb"), ("InferenceService", "llm")}
    # Two idle pods of one Deployment: acted on once.
    assert sorted(d.reason for d in owners[("Deployment", "web")]) == ["idle", "owner-already-in-plan"]
    assert [d.reason for d in owners[("Deployment", "keep")]] == ["opted-out"]
    assert ("Deployment", "multi") not in owners and ("Deployment", "busy") not in owners
    # Both were seen, and seen busy: the multi-GPU pod's one busy GPU kept it.
    assert run.busy_pods == 2
    assert run.status == "succeeded" and run.acted == 5 and run.failed == 0
    # Each workload scaled down is audited once: what it had, what the prune set, and why.
    scaled = {e.target: e for e in AuditEntry.objects.filter(app="pruning", action="workload_scale_to_zero")}
    assert set(scaled) == {"Deployment team-a/web", "ReplicaSet team-a/bare", "StatefulSet team-a/db",
                           "Notebook team-b/nb", "InferenceService team-b/llm"}
    web = scaled["Deployment team-a/web"]
    assert (web.old, web.new, web.actor_label) == ({"replicas": 2}, {"replicas": 0}, "test")
    assert web.cause.startswith("idle GPUs (idle") and f"prune run #{run.pk}" in web.cause

    apps, custom = k8s.AppsV1Api(world.api), k8s.CustomObjectsApi(world.api)
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 0
    assert apps.read_namespaced_replica_set("bare", "team-a").spec.replicas == 0
    assert apps.read_namespaced_stateful_set("db", "team-a").spec.replicas == 0
    assert apps.read_namespaced_deployment("busy", "team-a").spec.replicas == 1
    nb = custom.get_namespaced_custom_object("kubeflow.org", "v1", "team-b", "notebooks", "nb")
    assert "kubeflow-resource-stopped" in nb["metadata"]["annotations"]
    isvc = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", "team-b", "inferenceservices", "llm")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/stop"] == "true"
    assert owners[("InferenceService", "llm")][0].method == "kserve-stop"

    events = k8s.CoreV1Api(world.api).list_event_for_all_namespaces().items
    announced = {(e.involved_object.kind, e.involved_object.name, e.involved_object.api_version)
                 for e in events if e.reason == "GPUIdleScaledToZero"}
    assert announced == {("Deployment", "web", "apps/v1"), ("ReplicaSet", "bare", "apps/v1"),
                         ("StatefulSet", "db", "apps/v1"), ("Notebook", "nb", "kubeflow.org/v1"),
                         ("InferenceService", "llm", "serving.kserve.io/v1beta1")}

    # What the user sees: the pruned workloads' GPU pods are gone, the busy ones still run.
    world.control.advance(120)
    running = {p.metadata.name for p in k8s.CoreV1Api(world.api).list_pod_for_all_namespaces().items
               if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
    assert not [p for p in running if p.startswith(("web-", "bare-", "db-", "nb-", "llm-"))], sorted(running)
    assert [p for p in running if p.startswith("busy-")] and [p for p in running if p.startswith("multi-")]

    # Restore puts back exactly what was taken away.
    for (kind, name), ds in acted.items():
        for d in ds:
            if d.result == "succeeded":
                assert prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice",
                                              now=world.now()).restore == "restored"
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 2
    assert apps.read_namespaced_replica_set("bare", "team-a").spec.replicas == 1
    restored = AuditEntry.objects.get(app="pruning", action="workload_restore", target="Deployment team-a/web")
    assert (restored.old, restored.new, restored.actor_label) == ({"replicas": 0}, {"replicas": 2}, "alice")
    assert AuditEntry.objects.filter(app="pruning", action="workload_restore").count() == 5
    assert apps.read_namespaced_stateful_set("db", "team-a").spec.replicas == 1
    nb = custom.get_namespaced_custom_object("kubeflow.org", "v1", "team-b", "notebooks", "nb")
    assert "kubeflow-resource-stopped" not in (nb["metadata"].get("annotations") or {})
    isvc = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", "team-b", "inferenceservices", "llm")
    assert "serving.kserve.io/stop" not in (isvc["metadata"].get("annotations") or {})


def test_dry_run_is_the_default_and_changes_nothing(world: World):
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    calls_before = world.gateway.calls_total(("patch", "create", "replace", "delete"))
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams())
    assert run.mode == "dry-run" and run.planned == 1 and run.acted == 0
    assert [d.result for d in run.decisions.all()] == ["dry-run"]
    assert world.gateway.calls_total(("patch", "create", "replace", "delete")) == calls_before
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment("web", "team-a").spec.replicas == 1


def test_old_kserve_is_stopped_through_min_replicas_and_restored(tmp_path, prometheus_factory):
    with World.start(tmp_path, kserve_version="0.14") as world:
        world.prometheus_factory = prometheus_factory
        world.create(inference_service("llm", "team-b", util="0", min_replicas=2))
        world.record_history(minutes=40)
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                                params=PruneParams(run_mode="scale-down"))
        d = run.decisions.get(result="succeeded")
        assert (d.owner_kind, d.method, d.restore_state) == ("InferenceService", "kserve-min-replicas",
                                                             {"minReplicas": 2})
        custom = k8s.CustomObjectsApi(world.api)
        get = lambda: custom.get_namespaced_custom_object(  # noqa: E731
            "serving.kserve.io", "v1beta1", "team-b", "inferenceservices", "llm")
        assert get()["spec"]["predictor"]["minReplicas"] == 0
        assert "serving.kserve.io/stop" not in (get()["metadata"].get("annotations") or {})
        prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="bob", now=world.now())
        assert get()["spec"]["predictor"]["minReplicas"] == 2


def test_young_pods_gaps_protected_namespaces_orgs_and_the_cap(world: World):
    from clusters.models import Cluster
    from orgs.models import Org

    for i in range(3):
        world.create(replicaset(f"rs{i}", "team-a", util="0"))
    world.create(deployment("gappy", "team-b", util="0"))
    world.create(deployment("sys", "kube-system", util="0"))
    world.create(deployment("org-model", "no-prune", util="0"))
    world.create(deployment("held-model", "held", util="0"))
    world.create(deployment("napping-model", "napping", util="0"))
    world.record_history(minutes=40, at_minute={25: lambda: world.create(deployment("young", "team-b", util="0"))},
                         gaps={("team-b", "gappy-"): (15, 25)})
    cluster = Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig)
    Org.objects.create(slug="no-prune", cluster=cluster, namespace="no-prune", scale_to_zero_allowed=False)
    # Orgs an operator exempted, or snoozed until tomorrow, from dormancy and pruning.
    Org.objects.create(slug="held", cluster=cluster, namespace="held", exempt=True, exemption_reason="launch week")
    Org.objects.create(slug="napping", cluster=cluster, namespace="napping",
                       snoozed_until=world.now() + timedelta(days=1), exemption_reason="demo tomorrow")

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            cluster=cluster, params=PruneParams(run_mode="scale-down", max_scale_downs=2))
    reasons = {(d.owner_name or d.pod.rsplit("-", 2)[0]): d.reason for d in run.decisions.all()}
    assert reasons["young"] == "too-young"
    assert reasons["gappy"] == "gap-in-data"
    assert reasons["sys"] == "protected-namespace"
    assert reasons["org-model"] == "org-disallows-scale-to-zero"
    assert (reasons["held-model"], reasons["napping-model"]) == ("exempted-by-operator", "snoozed-by-operator")
    assert sorted(reasons[f"rs{i}"] for i in range(3)) == ["cap-reached", "idle", "idle"]
    assert run.acted == 2


def test_a_failing_patch_is_recorded_not_announced(world: World):
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    prom = world.prometheus()
    world.control.set_faults(seed=1, error_rate=1.0, match={"verbs": ["patch"]})
    try:
        run = prune_run_execute(kube_gateway=world.fast_gateway(), prometheus=prom, now=world.now(),
                                params=PruneParams(run_mode="scale-down"))
    finally:
        world.control.clear_faults()
    d = run.decisions.get()
    assert (run.status, run.failed, d.result, d.event_sent) == ("partial", 1, "failed", False)
    assert d.error and d.restore_state is None
    events = k8s.CoreV1Api(world.api).list_namespaced_event("team-a").items
    assert not [e for e in events if e.reason == "GPUIdleScaledToZero"]
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment("web", "team-a").spec.replicas == 1


def test_exported_label_scheme_end_to_end(world: World):
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    prom = world.prometheus(transform=to_exported_scheme)
    for scheme, expected in (("exported", 1), ("auto", 1), ("pod", 0)):
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                                params=PruneParams(label_scheme=scheme))
        assert run.planned == expected, scheme


def web_scaled_down(world: World) -> PruneDecision:
    """An idle 2-replica Deployment "web" in team-a, scaled to zero by a prune: its decision."""
    world.create(deployment("web", "team-a", replicas=2, util="0"))
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down"))
    return run.decisions.get(result="succeeded")


def test_restore_leaves_an_owner_changed_since_alone(world: World):
    d = web_scaled_down(world)
    apps = k8s.AppsV1Api(world.api)
    apps.patch_namespaced_deployment_scale("web", "team-a", {"spec": {"replicas": 1}})  # the user came back
    assert prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice",
                                  now=world.now()).restore == "changed"
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 1
    assert not AuditEntry.objects.filter(action="workload_restore").exists()     # nothing was put back


def test_idle_pods_gathered_in_one_namespace_cost_three_lists_whatever_their_number(world: World):
    for i in range(6):
        world.create(deployment(f"d{i}", "team-a", replicas=2, util="0"))
    world.record_history(minutes=40)
    before = world.gateway.calls_total()
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams())
    assert run.idle_candidates == 12
    # All in team-a: its pods, replicasets and deployments, one LIST each (pruning.reads).
    assert run.kube_api_calls == world.gateway.calls_total() - before == 3


def test_knative_service_raw_inference_service_and_multi_gpu_pods(world: World):
    world.create(knative_service("kn", "team-c", util="0"))
    raw = inference_service("raw", "team-c", util="0")
    raw["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = "RawDeployment"
    world.create(raw)
    world.create(deployment("pair", "team-a", gpus=2, util="0,0"))    # every GPU idle
    world.create(deployment("half", "team-a", gpus=2, util="70,0"))   # one GPU busy
    world.record_history(minutes=40)

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down"))
    got = {(d.owner_kind, d.owner_name): d for d in run.decisions.all()}
    assert set(got) == {("Service", "kn"), ("InferenceService", "raw"), ("Deployment", "pair")}
    assert all(d.result == "succeeded" and d.event_sent for d in got.values())
    assert got[("Service", "kn")].method == "knative-min-scale"
    assert got[("InferenceService", "raw")].method == "kserve-stop"
    assert len(got[("Deployment", "pair")].gpus) == 2
    assert (run.pods_seen, run.busy_pods) == (4, 1)

    custom, apps = k8s.CustomObjectsApi(world.api), k8s.AppsV1Api(world.api)
    ksvc = lambda: custom.get_namespaced_custom_object(  # noqa: E731
        "serving.knative.dev", "v1", "team-c", "services", "kn")
    min_scale = lambda: ksvc()["spec"]["template"]["metadata"]["annotations"][  # noqa: E731
        "autoscaling.knative.dev/min-scale"]
    assert min_scale() == "0"
    assert apps.read_namespaced_deployment_scale("pair", "team-a").spec.replicas == 0
    events = k8s.CoreV1Api(world.api).list_event_for_all_namespaces().items
    announced = {(e.involved_object.kind, e.involved_object.name, e.involved_object.api_version)
                 for e in events if e.reason == "GPUIdleScaledToZero"}
    # What the min-scale lever does, said as it is: a new revision that starts the cluster's
    # initial scale (config-autoscaler as installed: no allow-zero-initial-scale), at zero once
    # without traffic (tests/pruning/test_knative_initial_scale.py: where a zero is allowed).
    kn_event = next(e for e in events if e.reason == "GPUIdleScaledToZero" and e.involved_object.name == "kn")
    assert "set to min-scale 0 (its new revision starts 1 pod(s) (the cluster's initial-scale)" in kn_event.message
    assert "has no allow-zero-initial-scale" in kn_event.message
    assert "scaled to zero (knative-min-scale)" not in kn_event.message
    assert announced == {("Service", "kn", "serving.knative.dev/v1"),
                         ("InferenceService", "raw", "serving.kserve.io/v1beta1"),
                         ("Deployment", "pair", "apps/v1")}

    for d in got.values():
        assert prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice",
                                      now=world.now()).restore == "restored"
    assert min_scale() == "1"
    assert apps.read_namespaced_deployment_scale("pair", "team-a").spec.replicas == 1


HOSTILE = ['"}', '"} or vector(1)', 'team-a"} or vector(1) or {x="', '.*"} or vector(1) or {__name__=~".+',
           '\\"} or vector(1)']


def test_hostile_filters_match_nothing_and_invalid_ones_are_refused_before_a_run(world: World):
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    prom = world.prometheus()

    def planned(**filters):
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                                params=PruneParams(**filters))
        assert run.status == "succeeded", run.errors
        return run.pods_seen, run.planned

    assert planned(namespace="team-.*") == (1, 1)
    assert planned(model_name="NVIDIA A10G") == (1, 1)
    for hostile in HOSTILE:
        assert planned(namespace=hostile) == (0, 0), hostile
        assert planned(model_name=hostile) == (0, 0), hostile

    runs = PruneRun.objects.count()
    for bad, words in (("team-(a", "namespace filter"), ("(?=x)", "namespace filter"),
                       ("[", "namespace filter")):
        with pytest.raises(FilterError, match=words):
            prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                              params=PruneParams(namespace=bad))
    with pytest.raises(FilterError, match="GPU model filter"):
        PruneParams(model_name="a)")
    assert PruneRun.objects.count() == runs


def _two_of_three_busy(series):
    """Of the three pods of "mixed", the first stays idle; the other two ran at 85 %."""
    from tests.prometheus_fixtures import Series

    names = sorted({s.labels.get("pod", "") for s in series if s.labels.get("pod", "").startswith("mixed-")})
    busy = set(names[1:])
    assert len(names) == 3
    value = {"DCGM_FI_DEV_GPU_UTIL": 85.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.85}
    return [Series(s.metric, s.labels, [(t, value[s.metric]) for t, _ in s.samples])
            if s.labels.get("pod") in busy and s.metric in value else s for s in series]


@pytest.mark.parametrize("listed", [False, True], ids=["pods-read-one-by-one", "namespace-listed"])
def test_an_owner_with_one_idle_pod_among_busy_ones_is_left_running(world: World, monkeypatch, listed):
    from pruning import reads

    if listed:   # the pods are read by LIST, the owner's other pods picked from it
        monkeypatch.setattr(reads, "PODS_PER_GET", 1)
    world.create(deployment("mixed", "team-a", replicas=3, util="0"))
    world.create(deployment("idle", "team-b", util="0"))
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=_two_of_three_busy),
                            now=world.now(), params=PruneParams(run_mode="scale-down", max_scale_downs=1))
    got = {d.owner_name: (d.decision, d.reason, d.result) for d in run.decisions.all()}
    # The one idle pod of "mixed" is skipped, and takes no place under the cap of one.
    assert got == {"mixed": ("skip", "another-pod-not-idle", ""), "idle": ("prune", "idle", "succeeded")}
    assert (run.status, run.busy_pods, run.acted) == ("succeeded", 2, 1)
    apps = k8s.AppsV1Api(world.api)
    assert apps.read_namespaced_deployment_scale("mixed", "team-a").spec.replicas == 3
    assert apps.read_namespaced_deployment_scale("idle", "team-b").spec.replicas == 0
    assert [e.target for e in AuditEntry.objects.filter(action="workload_scale_to_zero")] == ["Deployment team-b/idle"]


def test_restore_leaves_a_notebook_its_owner_stopped_again_stopped(world: World):
    world.create(notebook("nb", "team-b", util="0"))
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down"))
    d = run.decisions.get(result="succeeded")
    custom = k8s.CustomObjectsApi(world.api)

    def stopped():
        nb = custom.get_namespaced_custom_object("kubeflow.org", "v1", "team-b", "notebooks", "nb")
        return (nb["metadata"].get("annotations") or {}).get("kubeflow-resource-stopped")

    assert stopped() == d.applied_state["annotations"]["kubeflow-resource-stopped"]
    # The owner started the notebook, worked, and stopped it again: its own stop, not the prune's.
    patch = lambda value: custom.patch_namespaced_custom_object(  # noqa: E731
        "kubeflow.org", "v1", "team-b", "notebooks", "nb", {"metadata": {"annotations": {
            "kubeflow-resource-stopped": value}}})
    patch(None)
    patch("2030-01-01T00:00:00Z")
    d = prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())
    assert d.restore == "changed" and "not restored, nothing was written" in d.error
    assert stopped() == "2030-01-01T00:00:00Z"   # still stopped, as its owner left it
    assert not AuditEntry.objects.filter(action="workload_restore").exists()


def test_restore_leaves_a_deployment_deleted_and_created_again_alone(world: World):
    d = web_scaled_down(world)
    assert d.owner_uid and d.applied_state == {"replicas": 0}
    apps = k8s.AppsV1Api(world.api)
    apps.delete_namespaced_deployment("web", "team-a")
    world.control.advance(0)
    world.create(deployment("web", "team-a", replicas=0, util="0"))   # its owner's new one, asked to sleep
    d = prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())
    assert d.restore == "changed" and "deleted and created again" in d.error
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 0
    assert not AuditEntry.objects.filter(action="workload_restore").exists()


def test_restore_does_not_overwrite_a_scale_made_between_its_read_and_its_write(world: World):
    from clusters.kube import KubeGateway

    d = web_scaled_down(world)
    apps = k8s.AppsV1Api(world.api)

    class OwnerScalesUpRightAfterTheRead(KubeGateway):
        raced = False

        def get(self, resource, name, **kwargs):
            obj = super().get(resource, name, **kwargs)
            if resource.name == "deployments.apps" and not self.raced:
                self.raced = True   # the owner scales back up to one while the restore decides
                apps.patch_namespaced_deployment_scale("web", "team-a", {"spec": {"replicas": 1}})
            return obj

    gateway = OwnerScalesUpRightAfterTheRead.from_kubeconfig(world.kubeconfig)
    try:
        d = prune_decision_restore(kube_gateway=gateway, decision=d, actor="alice", now=world.now())
    finally:
        gateway.close()
    assert gateway.raced and d.restore == "changed" and "it now holds replicas 1, not what the prune set (replicas 0)" in d.error
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 1   # the owner's, not 2


def test_a_scale_made_just_before_the_prunes_write_is_read_again_and_kept_for_restore(world: World):
    from clusters.kube import KubeGateway

    world.create(deployment("web", "team-a", replicas=2, util="0"))
    world.record_history(minutes=40)
    apps = k8s.AppsV1Api(world.api)

    class OwnerScalesRightBeforeTheWrite(KubeGateway):
        raced = False

        def patch(self, resource, name, patch, **kwargs):
            if resource.name == "deployments.apps" and not self.raced:
                self.raced = True
                apps.patch_namespaced_deployment_scale("web", "team-a", {"spec": {"replicas": 3}})
            return super().patch(resource, name, patch, **kwargs)

    gateway = OwnerScalesRightBeforeTheWrite.from_kubeconfig(world.kubeconfig)
    try:
        run = prune_run_execute(kube_gateway=gateway, prometheus=world.prometheus(), now=world.now(),
                                params=PruneParams(run_mode="scale-down"))
    finally:
        gateway.close()
    d = run.decisions.get(result="succeeded")
    # The first write was refused (409) and the owner read again: what it took away is the 3
    # the owner had set, and restore gives back that 3, not the 2 of the first read.
    assert gateway.raced and d.restore_state == {"replicas": 3}
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 0
    prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())
    assert apps.read_namespaced_deployment_scale("web", "team-a").spec.replicas == 3


def test_the_audit_says_the_utilization_as_a_percentage(world: World):
    from tests.prometheus_fixtures import Series

    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    value = {"DCGM_FI_DEV_GPU_UTIL": 0.6, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.006}   # 0.6 %, under 1 %

    def light(series):
        return [Series(s.metric, s.labels, [(t, value[s.metric]) for t, _ in s.samples]) if s.metric in value else s
                for s in series]

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=light),
                            now=world.now(), params=PruneParams(run_mode="scale-down"))
    d = run.decisions.get(result="succeeded")
    assert d.max_utilization == pytest.approx(0.006)
    entry = AuditEntry.objects.get(action="workload_scale_to_zero")
    assert "at most 0.6% used" in entry.cause, entry.cause


def test_a_knative_service_its_owner_set_to_min_scale_zero_is_left_to_knative(world: World):
    world.create(knative_service("kn", "team-c", util="0"))
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    custom = k8s.CustomObjectsApi(world.api)
    # Its owner already lowered min-scale to 0; the pod seen idle still runs.
    custom.patch_namespaced_custom_object("serving.knative.dev", "v1", "team-c", "services", "kn", {
        "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "0"}}}}})
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down", max_scale_downs=1))
    got = {d.owner_name: (d.decision, d.reason, d.result) for d in run.decisions.all()}
    assert got == {"kn": ("skip", "min-scale-already-zero", ""), "web": ("prune", "idle", "succeeded")}
    assert not any(e.reason == "GPUIdleScaledToZero" and e.involved_object.name == "kn"
                   for e in k8s.CoreV1Api(world.api).list_event_for_all_namespaces().items)


def test_a_candidate_that_stopped_reporting_is_counted_apart_from_the_pods_reporting_now(world: World):
    """The census counts the GPU pods reporting at the evaluation time; a candidate whose
    samples stopped within the window (its pod scaled away) is not among them. It adds to
    the pods seen, and the busy pods are the census's pods that are no candidate."""
    world.create(deployment("busy", "team-a", util="70"))
    world.create(deployment("idle", "team-a", util="0"))
    world.create(deployment("gone", "team-a", util="0"))
    world.record_history(minutes=40, gaps={("team-a", "gone"): (25, 41)})   # silent for its last 15 minutes

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams())
    assert run.idle_candidates == 2
    assert (run.pods_seen, run.busy_pods) == (3, 1)
