"""The dormancy sweep and wake end to end on both backends: simcluster, and the real
control plane (upstream controllers, Knative Serving 1.15, KServe 0.14.1's controller).

An org's namespace holds a pynode (a Knative Service labelled
`capacity.io/component=pynode`) and a model (an InferenceService whose predictor KServe
turns into a Knative Service). The product is driven through its services with a Cluster
row, as the sweep task and the wake path drive them: the sweep marks the idle org
dormant, the apply switches its workloads; an activity wakes it and the apply gives each
workload back its owner's floor. What is checked is what an operator reads with the API:
the annotations, which pods exist, and that no running pod was replaced.

On Knative 1.15 (both backends) the model's lever is its PodAutoscaler: the switch
replaces no model pod. The pynode is switched through its template, which makes a new
Revision; where config-autoscaler allows a zero initial scale, the switch also sets
initial-scale "0" and that Revision starts no pod. The real tier has no per-pod metrics
(nothing plays the queue-proxy), so its autoscaler never scales anything to zero here;
what is compared is the switch itself, not the later scale-down.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes.client.rest import ApiException

from clusters.models import Cluster
from orgs import services
from audit.models import AuditEntry
from orgs.models import DormancySwitch, Org

from .pool import AUTOSCALING, SERVING, GpuPool, ready

MIN_SCALE = "autoscaling.knative.dev/min-scale"
INITIAL_SCALE = "autoscaling.knative.dev/initial-scale"
OWNER_MIN_SCALE = "capacity.io/owner-min-scale"
KSERVE = ("serving.kserve.io", "v1beta1")
MODEL = "llm"
MODEL_REVISION = f"{MODEL}-predictor-00001"
SECONDS = 40   # simulated on simcluster, wall time on the real tier


@pytest.fixture
def org_pool(tier_cluster):
    cluster, backend = tier_cluster
    pool = GpuPool(backend, "dormancy")
    pool.core.patch_namespace(pool.ns, {"metadata": {"labels": {"capacity.io/org": pool.ns}}})
    pool.node_add("n1")
    yield cluster, backend, pool
    pool.close()


def autoscaler_config_set(pool: GpuPool, allow_zero: bool) -> None:
    """Set config-autoscaler's allow-zero-initial-scale, and on the real tier wait until
    Knative's webhook judges by it (it watches the ConfigMap)."""
    value = "true" if allow_zero else "false"
    pool.core.patch_namespaced_config_map("config-autoscaler", "knative-serving",
                                          {"data": {"allow-zero-initial-scale": value}})
    if pool.backend.advance is not None:
        return
    probe = {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "probe"},
             "spec": {"template": {"metadata": {"annotations": {INITIAL_SCALE: "0"}},
                                   "spec": {"containers": [{"image": "dev.local/probe:1"}]}}}}

    def webhook_agrees() -> bool:
        try:
            pool.custom.create_namespaced_custom_object(*SERVING, pool.ns, "services", probe, dry_run="All")
            return allow_zero
        except ApiException as exc:
            if exc.status == 400 and "not allowed by cluster" in exc.body:
                return not allow_zero
            raise
    pool.backend.settle(webhook_agrees, what=f"Knative's webhook reading allow-zero-initial-scale={value}",
                        seconds=30)


def pynode_create(pool: GpuPool) -> None:
    labels = {"capacity.io/component": "pynode"}
    pool.custom.create_namespaced_custom_object(*SERVING, pool.ns, "services", {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "pynode", "labels": labels},
        "spec": {"template": {
            "metadata": {"labels": labels, "annotations": {MIN_SCALE: "1"}},
            "spec": {**pool.pinning(), "containers": [{"name": "user-container", "image": "dev.local/pynode:1",
                                                       "resources": {"requests": {"cpu": "100m"}}}]}}}})


def model_create(pool: GpuPool) -> None:
    pool.custom.create_namespaced_custom_object(*KSERVE, pool.ns, "inferenceservices", {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": MODEL},
        "spec": {"predictor": {
            "minReplicas": 1, "maxReplicas": 2, **pool.pinning(),
            "containers": [{"name": "kserve-container", "image": "dev.local/model:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}})


def ksvc(pool: GpuPool, name: str) -> dict:
    return pool.custom.get_namespaced_custom_object(*SERVING, pool.ns, "services", name)


def template_annotations(pool: GpuPool, name: str) -> dict:
    return ksvc(pool, name)["spec"]["template"]["metadata"].get("annotations") or {}


def pa_min_scale(pool: GpuPool, revision: str) -> str | None:
    pa = pool.custom.get_namespaced_custom_object(*AUTOSCALING, pool.ns, "podautoscalers", revision)
    return (pa["metadata"].get("annotations") or {}).get(MIN_SCALE)


def pod_uids(pool: GpuPool, **selector) -> set[str]:
    return {p.metadata.uid for p in pool.pods(**selector)}


def pynode_pods(pool: GpuPool) -> dict[str, str]:
    """uid -> revision of every live pod of the pynode."""
    return {p.metadata.uid: p.metadata.labels["serving.knative.dev/revision"]
            for p in pool.core.list_namespaced_pod(pool.ns, label_selector="serving.knative.dev/service=pynode").items
            if p.metadata.deletion_timestamp is None}


def latest_ready(pool: GpuPool, name: str, revision: str) -> bool:
    status = ksvc(pool, name).get("status") or {}
    return status.get("latestReadyRevisionName") == revision and status.get("latestCreatedRevisionName") == revision


def workloads_up(pool: GpuPool) -> None:
    pynode_create(pool)
    model_create(pool)
    pool.backend.settle(lambda: latest_ready(pool, "pynode", "pynode-00001")
                        and any(ready(p) for p in pool.pods(revision="pynode-00001")),
                        what="pynode-00001 Ready with a Ready pod", seconds=SECONDS)
    pool.backend.settle(lambda: pool.model_ready(MODEL_REVISION, 1) and latest_ready(pool, f"{MODEL}-predictor",
                                                                                     MODEL_REVISION),
                        what=f"{MODEL_REVISION} Ready with one pod", seconds=SECONDS)


def org_idle(cluster: Cluster, pool: GpuPool) -> Org:
    now = pool.backend.now()
    return Org.objects.create(slug=pool.ns, cluster=cluster, namespace=pool.ns,
                              last_activity_at=now - timedelta(hours=25))


def sweep_and_apply(pool: GpuPool, org: Org) -> services.ApplyOutcome:
    result = services.dormancy_sweep(now=pool.backend.now(), enqueue=False)
    assert org.slug in result.switched
    [(_, switch_id)] = [pair for pair in result.switches if pair[0] == org.id]
    return services.org_scale_to_zero_apply(org_id=org.id, now=pool.backend.now(), switch_id=switch_id)


def test_the_sweep_switches_an_idle_orgs_pynode_and_model_without_a_new_pod_and_activity_wakes_them(org_pool):
    cluster, backend, pool = org_pool
    autoscaler_config_set(pool, allow_zero=True)
    workloads_up(pool)
    model_pods = pod_uids(pool, revision=MODEL_REVISION)
    pynode_before = pynode_pods(pool)
    assert len(model_pods) == 1 and list(pynode_before.values()) == ["pynode-00001"]
    org = org_idle(cluster, pool)

    outcome = sweep_and_apply(pool, org)

    assert outcome.complete, outcome.summary()
    org.refresh_from_db()
    assert org.dormant and org.applied == "enabled"
    assert "at initial-scale 0" in org.mechanism
    reason = Cluster.objects.get(id=cluster.id).knative_lever_reason
    assert 'allows a zero initial scale (allow-zero-initial-scale: \'true\')' in reason
    assert "starts no pod" in reason
    # The pynode: min-scale 0 and initial-scale 0 in its template, its owner's 1 noted.
    notes = ksvc(pool, "pynode")["metadata"]["annotations"]
    assert template_annotations(pool, "pynode")[MIN_SCALE] == "0"
    assert template_annotations(pool, "pynode")[INITIAL_SCALE] == "0"
    assert notes[OWNER_MIN_SCALE] == "1"
    # Its new Revision becomes Ready with no pod: nothing was spun up by the switch.
    backend.settle(lambda: latest_ready(pool, "pynode", "pynode-00002"), what="pynode-00002 Ready", seconds=SECONDS)
    backend.wait(5)
    created = {uid: rev for uid, rev in pynode_pods(pool).items() if uid not in pynode_before}
    assert created == {}, f"the switch started pynode pods: {created}"
    # The model: its PodAutoscaler carries min-scale 0; its Revision and its pod are untouched.
    assert pa_min_scale(pool, MODEL_REVISION) == "0"
    revision = pool.custom.get_namespaced_custom_object(*SERVING, pool.ns, "revisions", MODEL_REVISION)
    assert revision["metadata"]["annotations"][MIN_SCALE] == "1"
    assert pod_uids(pool, revision=MODEL_REVISION) == model_pods, "a model pod was replaced"
    audit = AuditEntry.objects.get(org=org, action="scale_to_zero_applied")
    assert audit.cause.startswith(f"switch #{DormancySwitch.objects.get(org=org).id}: ")
    assert audit.new[f"ksvc {pool.ns}/pynode"] == "0"
    assert audit.new[f"podautoscaler {pool.ns}/{MODEL_REVISION}"] == "0"

    woke = services.org_mark_active(org_slug=org.slug, cause="activity", at=backend.now(), enqueue=False)
    assert woke.woke
    switch = DormancySwitch.objects.filter(org=org).order_by("-id").first()
    outcome = services.org_scale_to_zero_apply(org_id=org.id, now=backend.now(), switch_id=switch.id)

    assert outcome.complete, outcome.summary()
    org.refresh_from_db()
    assert not org.dormant and org.applied == "disabled"
    annotations = template_annotations(pool, "pynode")
    assert annotations[MIN_SCALE] == "1" and INITIAL_SCALE not in annotations    # the owner's template again
    assert OWNER_MIN_SCALE not in (ksvc(pool, "pynode")["metadata"].get("annotations") or {})
    assert pa_min_scale(pool, MODEL_REVISION) == "1"
    assert pod_uids(pool, revision=MODEL_REVISION) == model_pods, "a model pod was replaced on wake"
    # The woken pynode's new Revision runs a pod again (its owner's initial scale).
    backend.settle(lambda: latest_ready(pool, "pynode", "pynode-00003")
                   and any(ready(p) for p in pool.pods(revision="pynode-00003")),
                   what="pynode-00003 Ready with a Ready pod", seconds=SECONDS)


def test_without_zero_initial_scale_the_panel_says_a_pod_starts_and_one_does(org_pool):
    cluster, backend, pool = org_pool
    autoscaler_config_set(pool, allow_zero=False)
    workloads_up(pool)
    pynode_before = pynode_pods(pool)
    org = org_idle(cluster, pool)

    outcome = sweep_and_apply(pool, org)

    assert outcome.complete, outcome.summary()
    assert "a pod starts per switch" in Org.objects.get(id=org.id).mechanism
    reason = Cluster.objects.get(id=cluster.id).knative_lever_reason
    assert "allow-zero-initial-scale: 'false'" in reason
    assert "starts 1 pod(s) (the cluster's initial-scale) before it scales to zero" in reason
    annotations = template_annotations(pool, "pynode")
    assert annotations[MIN_SCALE] == "0" and INITIAL_SCALE not in annotations   # Knative would refuse a "0"
    # What the panel says happens: the switch's new Revision starts one pod.
    backend.settle(lambda: [rev for uid, rev in pynode_pods(pool).items() if uid not in pynode_before]
                   == ["pynode-00002"], what="one pod of pynode-00002", seconds=SECONDS)
