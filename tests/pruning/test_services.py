"""Prune runs end to end: the simulated cluster (through the real `kubernetes` client over
HTTP), its DCGM exporter's history backfilled into a real Prometheus, the database.

History is recorded by scraping the simulated exporter's `/metrics` once per simulated
minute while the simulated clock advances, then written as TSDB blocks with promtool.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes import client as k8s
from prometheus_fixtures import to_exported_scheme

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


def test_restore_leaves_an_owner_changed_since_alone(world: World):
    world.create(deployment("web", "team-a", replicas=2, util="0"))
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down"))
    d = run.decisions.get(result="succeeded")
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
