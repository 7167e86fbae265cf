"""Pure prune planning: idle rules, owner walk, safety and budgets. No database, no HTTP."""
from datetime import datetime, timedelta, timezone

import pytest

from clusters.snapshot import OwnerRef, PodView
from pruning import planning as p
from pruning.query import GpuSeries

NOW = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
OLD = NOW - timedelta(hours=2)


def make_pod(name, ns="team-a", *, gpus=1, owner=("ReplicaSet", "rs"), phase="Running",
             created=OLD, deleting=False, labels=None):
    owners = (OwnerRef("apps/v1", owner[0], owner[1], f"uid-{owner[1]}", True),) if owner else ()
    return PodView(namespace=ns, name=name, uid=f"uid-{name}", node_name="node-1", phase=phase,
                   labels=labels or {}, annotations={}, gpus=gpus, owners=owners, terminating=deleting,
                   created_at=created.strftime("%Y-%m-%dT%H:%M:%SZ"))


def make_obj(kind, name, ns="team-a", *, owner=None, annotations=None, labels=None,
             replicas=1, min_replicas=None):
    return p.ObjectView(kind, ns, name, f"uid-{kind}-{name}", annotations or {}, labels or {},
                        owner, replicas, min_replicas)


def gpu(pod, util, *, ns="team-a", gpu="0", complete=True):
    return GpuSeries(ns, pod, f"{pod}-GPU-{gpu}", "NVIDIA A10G", "node-1", util, complete)


def view(pods, objs, kserve_stop=True):
    return p.ClusterView({(x.namespace, x.name): x for x in pods},
                         {(o.kind, o.namespace, o.name): o for o in objs}, kserve_stop)


DEPLOY = [make_obj("ReplicaSet", "rs", owner=("Deployment", "web")), make_obj("Deployment", "web")]


def plan(series, v, **kw):
    return p.plan_prune(series=series, view=v, settings=p.PruneSettings(**kw), now=NOW)


def only(plan_):
    assert len(plan_.decisions) == 1, plan_.explain()
    return plan_.decisions[0]


def test_idle_pod_of_a_deployment_is_pruned_through_its_deployment():
    d = only(plan([gpu("pod-1", 0.0)], view([make_pod("pod-1")], DEPLOY)))
    assert (d.decision, d.reason, d.owner.kind, d.owner.name, d.method) == \
        ("prune", "idle", "Deployment", "web", "scale")
    assert d.owner.api_version == "apps/v1"


def test_one_busy_gpu_keeps_a_multi_gpu_pod():
    pl = plan([gpu("pod-1", 0.0, gpu="0"), gpu("pod-1", 0.0, gpu="1"), gpu("pod-1", 0.4, gpu="2")],
              view([make_pod("pod-1", gpus=3)], DEPLOY))
    assert pl.decisions == () and pl.busy == 1 and pl.pods_seen == 1


def test_threshold_is_strict_and_configurable():
    v = view([make_pod("pod-1")], DEPLOY)
    assert plan([gpu("pod-1", 0.0099)], v).to_prune
    assert not plan([gpu("pod-1", 0.01)], v).decisions
    assert plan([gpu("pod-1", 0.04)], v, idle_threshold=0.05).to_prune


@pytest.mark.parametrize("pod_kw,series_kw,reason", [
    ({"created": NOW - timedelta(minutes=34)}, {}, "too-young"),   # window 30 + grace 5
    ({"phase": "Pending"}, {}, "pending"),
    ({"deleting": True}, {}, "being-deleted"),
    ({}, {"complete": False}, "gap-in-data"),
    ({"gpus": 2}, {}, "missing-gpu-data"),
    ({"owner": None}, {}, "no-owner"),
    ({"owner": ("Job", "j")}, {}, "unsupported-owner"),
    ({"owner": ("ReplicaSet", "gone")}, {}, "owner-not-found"),
])
def test_pods_that_are_not_idle_or_not_prunable_are_skipped_with_a_reason(pod_kw, series_kw, reason):
    d = only(plan([gpu("pod-1", 0.0, **series_kw)], view([make_pod("pod-1", **pod_kw)], DEPLOY)))
    assert (d.decision, d.reason) == ("skip", reason)


def test_pod_just_past_window_plus_grace_is_old_enough():
    v = view([make_pod("pod-1", created=NOW - timedelta(minutes=35))], DEPLOY)
    assert only(plan([gpu("pod-1", 0.0)], v)).decision == "prune"


def test_series_of_a_pod_the_cluster_no_longer_has():
    assert only(plan([gpu("ghost", 0.0)], view([], DEPLOY))).reason == "pod-not-found"


@pytest.mark.parametrize("pod,objs,kind,name,method,kserve", [
    (make_pod("p", owner=("ReplicaSet", "bare")), [make_obj("ReplicaSet", "bare")],
     "ReplicaSet", "bare", "scale", True),
    (make_pod("p", owner=("StatefulSet", "db")), [make_obj("StatefulSet", "db")],
     "StatefulSet", "db", "scale", True),
    (make_pod("p", owner=("StatefulSet", "nb")),
     [make_obj("StatefulSet", "nb", owner=("Notebook", "nb")), make_obj("Notebook", "nb")],
     "Notebook", "nb", "notebook-stop", True),
    (make_pod("p", labels={"serving.kserve.io/inferenceservice": "llm"}, owner=("ReplicaSet", "x")),
     [make_obj("InferenceService", "llm")], "InferenceService", "llm", "kserve-stop", True),
    (make_pod("p", labels={"serving.kserve.io/inferenceservice": "llm"}),
     [make_obj("InferenceService", "llm")], "InferenceService", "llm", "kserve-min-replicas", False),
    (make_pod("p", owner=("ReplicaSet", "rev-1-deployment-abc")),
     [make_obj("ReplicaSet", "rev-1-deployment-abc", owner=("Deployment", "rev-1-deployment")),
      make_obj("Deployment", "rev-1-deployment", owner=("Revision", "rev-1")),
      make_obj("Revision", "rev-1", labels={"serving.knative.dev/service": "svc"}),
      make_obj("Service", "svc")], "Service", "svc", "knative-min-scale", True),
])
def test_owner_walk_per_kind(pod, objs, kind, name, method, kserve):
    d = only(plan([gpu("p", 0.0)], view([pod], objs, kserve_stop=kserve)))
    assert (d.decision, d.owner.kind, d.owner.name, d.method) == ("prune", kind, name, method)


def test_each_owner_is_acted_on_once_per_run():
    pods = [make_pod(f"pod-{i}") for i in range(3)]
    pl = plan([gpu(f"pod-{i}", 0.0) for i in range(3)], view(pods, DEPLOY))
    assert [d.decision for d in pl.decisions] == ["prune", "skip", "skip"]
    assert {d.reason for d in pl.decisions[1:]} == {"owner-already-in-plan"}


def test_cap_limits_scale_downs_per_run():
    pods, objs = [], []
    for i in range(5):
        pods.append(make_pod(f"p{i}", owner=("ReplicaSet", f"rs{i}")))
        objs.append(make_obj("ReplicaSet", f"rs{i}"))
    pl = plan([gpu(f"p{i}", 0.0) for i in range(5)], view(pods, objs), max_scale_downs=2)
    assert len(pl.to_prune) == 2
    assert [d.reason for d in pl.decisions if d.decision == "skip"] == ["cap-reached"] * 3


def test_safety_opt_out_protected_namespace_org_and_already_zero():
    objs = [make_obj("ReplicaSet", "opt", annotations={"capacity.io/prune": "false"}),
            make_obj("ReplicaSet", "sys", ns="kube-system"),
            make_obj("ReplicaSet", "org", ns="no-prune"),
            make_obj("ReplicaSet", "zero", replicas=0)]
    pods = [make_pod("a", owner=("ReplicaSet", "opt")),
            make_pod("b", ns="kube-system", owner=("ReplicaSet", "sys")),
            make_pod("c", ns="no-prune", owner=("ReplicaSet", "org")),
            make_pod("d", owner=("ReplicaSet", "zero"))]
    series = [gpu("a", 0), gpu("b", 0, ns="kube-system"), gpu("c", 0, ns="no-prune"), gpu("d", 0)]
    pl = plan(series, view(pods, objs), org_blocked_namespaces=frozenset({"no-prune"}))
    assert {d.pod: d.reason for d in pl.decisions} == {
        "a": "opted-out", "b": "protected-namespace", "c": "org-disallows-scale-to-zero",
        "d": "already-at-zero"}
    assert not pl.to_prune


def test_one_idle_replica_of_an_owner_whose_other_pods_are_busy_is_not_pruned():
    # Three pods of one Deployment: one idle, two at 85 %. Scaling the Deployment to zero
    # would stop the busy two.
    pods = [make_pod(f"pod-{i}") for i in range(3)]
    series = [gpu("pod-0", 0.0), gpu("pod-1", 0.85), gpu("pod-2", 0.85)]
    d = only(plan(series, view(pods, DEPLOY)))
    assert (d.pod, d.decision, d.reason, d.owner.name) == ("pod-0", "skip", "another-pod-not-idle", "web")


@pytest.mark.parametrize("other,why", [
    (None, "the other pod is no candidate at all (busy, or no series)"),
    (gpu("pod-1", 0.0, complete=False), "the other pod has a gap"),
])
def test_an_owner_with_a_pod_without_complete_data_is_not_idle(other, why):
    pods = [make_pod("pod-0"), make_pod("pod-1")]
    both = frozenset({("team-a", "pod-0"), ("team-a", "pod-1")})
    v = p.ClusterView({(x.namespace, x.name): x for x in pods}, {(o.kind, o.namespace, o.name): o for o in DEPLOY},
                      owner_pods={("Deployment", "team-a", "web"): both})
    series = [gpu("pod-0", 0.0)] + ([other] if other else [])
    reasons = {d.pod: d.reason for d in plan(series, v).decisions}
    assert reasons["pod-0"] == "another-pod-not-idle", why
    assert not plan(series, v).to_prune


def test_every_pod_of_the_owner_idle_prunes_it_once_and_unknown_owner_pods_never_do():
    pods = [make_pod("pod-0"), make_pod("pod-1")]
    objs = {(o.kind, o.namespace, o.name): o for o in DEPLOY}
    both = frozenset({("team-a", "pod-0"), ("team-a", "pod-1")})
    series = [gpu("pod-0", 0.0), gpu("pod-1", 0.0)]
    v = p.ClusterView({(x.namespace, x.name): x for x in pods}, objs,
                      owner_pods={("Deployment", "team-a", "web"): both})
    assert [(d.decision, d.reason) for d in plan(series, v).decisions] == [("prune", "idle"),
                                                                             ("skip", "owner-already-in-plan")]
    unknown = p.ClusterView({(x.namespace, x.name): x for x in pods}, objs, owner_pods={})
    assert {d.reason for d in plan(series, unknown).decisions} == {"owner-pods-unknown"}


def test_an_owner_kept_by_a_busy_pod_takes_no_place_under_the_cap():
    pods = [make_pod("a-0", owner=("ReplicaSet", "a")), make_pod("a-1", owner=("ReplicaSet", "a")),
            make_pod("b-0", owner=("ReplicaSet", "b"))]
    objs = [make_obj("ReplicaSet", "a"), make_obj("ReplicaSet", "b")]
    pl = plan([gpu("a-0", 0.0), gpu("a-1", 0.9), gpu("b-0", 0.0)], view(pods, objs), max_scale_downs=1)
    assert {d.pod: (d.decision, d.reason) for d in pl.decisions} == {
        "a-0": ("skip", "another-pod-not-idle"), "b-0": ("prune", "idle")}


def test_a_busy_mig_slice_pod_keeps_its_owner_like_a_whole_gpu_pod():
    # Another pod of the Deployment asks for a MIG slice, not a whole GPU: it holds an
    # NVIDIA device all the same, so without idle data of its own the owner is not idle.
    mig = PodView.from_object({
        "metadata": {"name": "pod-1", "namespace": "team-a", "uid": "uid-pod-1",
                     "creationTimestamp": OLD.strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                          "uid": "uid-rs", "controller": True}]},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
        "status": {"phase": "Running"}})
    assert (mig.gpus, mig.asks_nvidia) == (0, True)
    d = only(plan([gpu("pod-0", 0.0)], view([make_pod("pod-0"), mig], DEPLOY)))
    assert (d.decision, d.reason) == ("skip", "another-pod-not-idle")


def test_finished_pods_and_pods_without_gpus_do_not_keep_their_owner():
    pods = [make_pod("pod-0"), make_pod("done", phase="Succeeded"), make_pod("cpu", gpus=0),
            make_pod("leaving", deleting=True)]
    d = only(plan([gpu("pod-0", 0.0)], view(pods, DEPLOY)))
    assert (d.decision, d.reason) == ("prune", "idle")


def test_owner_selectors_match_as_kubernetes_does():
    reqs = p.selector_requirements({"matchLabels": {"app": "web"},
                                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "x"]},
                                                         {"key": "canary", "operator": "DoesNotExist"}]})
    assert p.selector_text(reqs) == "app=web,tier in (gpu,x),!canary"
    assert p.selector_matches(reqs, {"app": "web", "tier": "gpu"})
    assert not p.selector_matches(reqs, {"app": "web", "tier": "gpu", "canary": "1"})
    assert not p.selector_matches(reqs, {"app": "web"})
    assert p.selector_requirements(None) is None


KSVC_CHAIN = [make_obj("ReplicaSet", "rev-1-deployment-abc", owner=("Deployment", "rev-1-deployment")),
              make_obj("Deployment", "rev-1-deployment", owner=("Revision", "rev-1")),
              make_obj("Revision", "rev-1", labels={"serving.knative.dev/service": "svc"})]


@pytest.mark.parametrize("key", ["autoscaling.knative.dev/min-scale", "autoscaling.knative.dev/minScale"])
def test_a_knative_service_already_at_min_scale_zero_is_no_candidate_and_takes_no_place_under_the_cap(key):
    # Either spelling of the key: Knative reads the old camelCase one too.
    at_zero = p.ObjectView("Service", "team-a", "svc", "uid-svc", {}, {}, None, template_annotations={key: "0"})
    pods = [make_pod("kn", owner=("ReplicaSet", "rev-1-deployment-abc")), make_pod("z", owner=("ReplicaSet", "rs"))]
    pl = plan([gpu("kn", 0.0), gpu("z", 0.0)], view(pods, KSVC_CHAIN + [at_zero] + DEPLOY), max_scale_downs=1)
    assert {d.pod: (d.decision, d.reason) for d in pl.decisions} == {
        "kn": ("skip", "min-scale-already-zero"), "z": ("prune", "idle")}
    assert "min-scale 0" in p.EFFECT[p.M_KNATIVE_MIN_SCALE] and "new revision" in p.EFFECT[p.M_KNATIVE_MIN_SCALE]


def test_object_views_keep_the_selector_and_the_template_annotations():
    from pruning.selectors import object_view

    v = object_view({"kind": "Service", "metadata": {"name": "svc", "namespace": "a"},
                     "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "0"}}}}})
    assert v.template_annotations == {"autoscaling.knative.dev/min-scale": "0"} and v.selector is None
    d = object_view({"kind": "Deployment", "metadata": {"name": "web", "namespace": "a"},
                     "spec": {"selector": {"matchLabels": {"app": "web"}}}})
    assert d.selector == (("app", "In", ("web",)),)


def test_an_owner_whose_selector_does_not_find_the_idle_pod_is_never_counted_idle():
    # The selector found other pods, all idle, but not this one: it tells nothing of the owner.
    pods = [make_pod("pod-0")]
    v = p.ClusterView({("team-a", "pod-0"): pods[0]}, {(o.kind, o.namespace, o.name): o for o in DEPLOY},
                      owner_pods={("Deployment", "team-a", "web"): frozenset()})
    assert only(plan([gpu("pod-0", 0.0)], v)).reason == "owner-pods-unknown"


def test_a_pod_seen_with_gpu_series_counts_for_its_owner_whatever_it_asks_for():
    # A MIG slice or a shared GPU is no nvidia.com/gpu request, yet DCGM reports it.
    pods = [make_pod("pod-0"), make_pod("mig", gpus=0)]
    pl = plan([gpu("pod-0", 0.0), gpu("mig", 0.7)], view(pods, DEPLOY))
    assert {d.pod: d.reason for d in pl.decisions} == {"pod-0": "another-pod-not-idle"}
