"""Pure runbook planning: the registry, blocked revisions, resource specs. No database."""
from __future__ import annotations

import pytest

from capacity.runbook import planning as rp
from clusters import labels
from clusters.snapshot import PodView

GPU_SHORT = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}


def isvc(name, ns="org-acme", *, ready=False, fmt="vllm", labels=None):
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {}},
            "spec": {"predictor": {"model": {"modelFormat": {"name": fmt},
                                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def revision(name, service, created, ns="org-acme"):
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created,
                         "labels": {labels.KNATIVE_SERVICE_LABEL: service}}}


def pod(name, rev, *, node=None, gpus=1, phase="Running", conditions=(), ns="org-acme"):
    spec = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns, "labels": {labels.REVISION_LABEL: rev}},
            "spec": spec, "status": {"phase": phase, "conditions": list(conditions)}}


def registry(state: dict):
    """The registry from the state's objects; its pods as the cluster snapshot holds them."""
    return rp.registry_build(**{**state, "pods": [PodView.from_object(p) for p in state["pods"]]})


def seed_002_state():
    """The seed's example: the old revision holds the one GPU, the new one is Pending."""
    return dict(
        isvcs=[isvc("zq86d3o")],
        ksvcs=[],
        revisions=[revision("zq86d3o-predictor-00001", "zq86d3o-predictor", "2026-01-01T00:00:00Z"),
                   revision("zq86d3o-predictor-00002", "zq86d3o-predictor", "2026-01-01T07:46:00Z")],
        pods=[pod("old-pod", "zq86d3o-predictor-00001", node="gpu-1"),
              pod("new-pod", "zq86d3o-predictor-00002", phase="Pending", conditions=[GPU_SHORT])],
        namespaces=[{"metadata": {"name": "org-acme", "labels": {labels.ORG_LABEL: "acme"}}}])


def test_the_seed_002_pending_deployment_is_detected_with_the_old_revision_to_delete():
    (entry,) = registry(seed_002_state())
    assert (entry.kind, entry.org, entry.framework, entry.knative_service) == \
        ("InferenceService", "acme", "vllm", "zq86d3o-predictor")
    assert entry.gpus_held == 1
    (unblock,) = entry.unblocks
    assert (unblock.old_revision, unblock.pending_revision, unblock.gpus_held) == \
        ("zq86d3o-predictor-00001", "zq86d3o-predictor-00002", 1)
    assert "Pending for lack of GPUs" in unblock.reason


@pytest.mark.parametrize("why,change", [
    ("pending for cpu, not GPUs", lambda s: s["pods"][1]["status"]["conditions"][0].update(
        message="0/4 nodes are available: 4 Insufficient cpu.")),
    ("old revision holds no GPU", lambda s: s["pods"].pop(0)),
    ("new pod already scheduled", lambda s: s["pods"][1]["spec"].update(nodeName="gpu-2")),
    ("the Pending one is the older", lambda s: s["revisions"].reverse() or [
        r["metadata"].update(creationTimestamp=t) for r, t in
        zip(s["revisions"], ["2026-01-01T00:00:00Z", "2026-01-01T07:46:00Z"])]),
])
def test_nothing_to_unblock_when_the_seed_conditions_do_not_hold(why, change):
    state = seed_002_state()
    change(state)
    (entry,) = registry(state)
    assert entry.unblocks == (), why


def test_pynodes_are_registered_but_an_isvc_predictor_ksvc_is_not_twice():
    state = seed_002_state()
    state["ksvcs"] = [{"metadata": {"name": "pynode", "namespace": "org-acme",
                                    "labels": {labels.COMPONENT_LABEL: "pynode"}}},
                      {"metadata": {"name": "zq86d3o-predictor", "namespace": "org-acme",
                                    "labels": {labels.ISVC_LABEL: "zq86d3o"}}}]
    kinds = [(e.kind, e.name) for e in registry(state)]
    assert kinds == [("pynode", "pynode"), ("InferenceService", "zq86d3o")]


DEFAULTS = {"default": {"gpu_count": 1, "gpu_product": "", "cpu_request": "4", "cpu_limit": "8",
                        "memory_request": "16Gi", "memory_limit": "32Gi"},
            "sklearn": {"gpu_count": 0, "gpu_product": "", "cpu_request": "1", "cpu_limit": "2",
                        "memory_request": "2Gi", "memory_limit": "4Gi"}}


def test_an_override_wins_over_the_framework_default_field_by_field():
    values = rp.resource_values(framework="vllm", defaults=DEFAULTS,
                                override={"gpu_count": 2, "gpu_product": "NVIDIA-H100", "cpu_request": "",
                                          "memory_limit": None})
    assert values == rp.ResourceValues(2, "NVIDIA-H100", "4", "8", "16Gi", "32Gi")


def test_missing_defaults_are_named():
    with pytest.raises(ValueError, match="no resource defaults for framework 'onnx'.*gpu_count"):
        rp.resource_values(framework="onnx", defaults={}, override={"cpu_request": "1"})


def test_the_patch_sets_resources_and_the_gpu_product_and_drops_a_gpu_no_longer_wanted():
    target = isvc("m")
    patch = rp.resources_patch(target, rp.ResourceValues(2, "NVIDIA-H100", "4", "8", "16Gi", "32Gi"))
    predictor = patch["spec"]["predictor"]
    assert predictor["nodeSelector"] == {labels.GPU_PRODUCT_LABEL: "NVIDIA-H100"}
    assert predictor["model"]["resources"]["limits"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    cpu_only = rp.resources_patch(target, rp.resource_values(framework="sklearn", defaults=DEFAULTS))
    assert cpu_only["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] is None
    assert cpu_only["spec"]["predictor"]["nodeSelector"] == {labels.GPU_PRODUCT_LABEL: None}


# --- settling an action from what the cluster shows ---------------------------------------------
STAMP = "2026-01-02T03:04:05.678901+00:00"


@pytest.mark.parametrize("obj,patch,holds", [
    ({"metadata": {"annotations": {"a": "1", "b": "2"}}}, {"metadata": {"annotations": {"a": "1"}}}, True),
    ({"metadata": {"annotations": {"a": "0"}}}, {"metadata": {"annotations": {"a": "1"}}}, False),
    ({"metadata": {}}, {"metadata": {"annotations": {"a": "1"}}}, False),
    ({"spec": {"sel": {"gpu": "A10G"}}}, {"spec": {"sel": {"gpu": None}}}, False),    # null: must be absent
    ({"spec": {"sel": {}}}, {"spec": {"sel": {"gpu": None}}}, True),
    ({"spec": {"containers": [{"name": "m"}]}}, {"spec": {"containers": [{"name": "m"}]}}, True),
    (None, {"metadata": {}}, False),
])
def test_a_merge_patch_holds_when_the_object_reads_as_the_patch_would_leave_it(obj, patch, holds):
    assert rp.merge_patch_holds(obj, patch) is holds


def _stamped(stamp):
    return {"metadata": {"annotations": {"capacity.io/redeployed-at": stamp}}}


@pytest.mark.parametrize("kind,obj,revisions,landed", [
    ("InferenceService", _stamped(STAMP), [], True),
    ("InferenceService", _stamped("later"), [_stamped(STAMP)], True),         # stamped again since; its revision
    ("InferenceService", _stamped("earlier"), [_stamped("earlier")], False),
    ("InferenceService", None, [], False),
    ("pynode", {"spec": {"template": _stamped(STAMP)}}, [], True),
    ("pynode", _stamped(STAMP), [], False),                                   # a pynode's stamp is on its template
])
def test_a_redeploy_landed_when_its_stamp_is_on_the_model_or_a_revision(kind, obj, revisions, landed):
    assert rp.redeploy_landed(obj=obj, kind=kind, revisions=revisions, stamp=STAMP) is landed


@pytest.mark.parametrize("obj,gone", [
    (None, True),
    ({"metadata": {"uid": "u1"}}, False),
    ({"metadata": {"uid": "u2"}}, True),                                      # the name holds another object
    ({"metadata": {"uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}, True),   # foreground delete
])
def test_a_uid_guarded_delete_took_effect(obj, gone):
    assert rp.deleted(obj, "u1") is gone


# --- a redeploy of a model its dormant org keeps at zero ------------------------------------------
from clusters.knative import initial_scale_from_config  # noqa: E402
from tests.orgs.builders import make_isvc, make_ksvc  # noqa: E402

ALLOWED = initial_scale_from_config(config={"allow-zero-initial-scale": "true"})
NOT_ALLOWED = initial_scale_from_config(config={})
UNREADABLE = initial_scale_from_config(config=None, error="403 Forbidden: configmaps")
RECONCILE = rp.Schedule(name="orgs: scale-to-zero reconcile", every_seconds=600)
ASLEEP = "org acme is dormant: it keeps it at zero until it wakes"


def switched_pynode(*, owner_initial: str | None = None, initial: str | None = None, owner: str | None = "1",
                    min_scale: str = "0") -> dict:
    """A pynode as the org's switch leaves it: min-scale "0" with its owner's recorded (`owner`)."""
    ksvc = make_ksvc("pynode", ns="org-acme", min_scale=min_scale, owner=owner)
    template = ksvc["spec"]["template"]["metadata"]["annotations"]
    if initial is not None:
        template[labels.INITIAL_SCALE] = initial
    if owner_initial is not None:
        template[labels.INITIAL_SCALE] = owner_initial
    return ksvc


def plan(obj, kind="pynode", *, initial=ALLOWED, asleep=ASLEEP, reconcile=RECONCILE):
    return rp.redeploy_plan(kind=kind, obj=obj, stamp=STAMP, asleep=asleep, initial=initial, reconcile=reconcile)


def test_an_awake_models_redeploy_is_the_stamp_alone():
    found = plan(switched_pynode(), asleep="")
    assert found.patch == rp.redeploy_patch("pynode", STAMP) and not found.wakes and found.effect == ""


def test_where_allowed_a_sleeping_pynode_gets_the_switchs_initial_scale_zero_with_its_owners_recorded():
    found = plan(switched_pynode(owner_initial="2"))
    assert found.outcome == rp.STAYS_ASLEEP and not found.wakes
    assert found.patch == {
        "spec": {"template": {"metadata": {"annotations": {labels.REDEPLOY_ANNOTATION: STAMP,
                                                           labels.INITIAL_SCALE: "0"}}}},
        "metadata": {"annotations": {labels.OWNER_INITIAL_SCALE: "2"}}}
    assert found.old == {labels.INITIAL_SCALE: "2", labels.OWNER_INITIAL_SCALE: None}
    assert found.new == {labels.INITIAL_SCALE: "0", labels.OWNER_INITIAL_SCALE: "2"}
    assert "set with the stamp, as the org's switch sets it" in found.effect


def test_a_pynode_the_switch_already_set_to_initial_scale_zero_gets_the_stamp_alone():
    ksvc = switched_pynode(initial="0")
    ksvc["metadata"]["annotations"][labels.OWNER_INITIAL_SCALE] = ""
    found = plan(ksvc)
    assert (found.outcome, found.patch, found.new) == (rp.STAYS_ASLEEP, rp.redeploy_patch("pynode", STAMP), {})
    assert found.effect.startswith("its new revision starts no pod (its template's initial-scale is 0: ")


@pytest.mark.parametrize(("ksvc", "initial", "words"), [
    # Its owner's own "0" (no record): the wake would not take an initial-scale "0" away, so none is set.
    (switched_pynode(owner=None), ALLOWED, "starts 1 pod(s) (the cluster's initial-scale; initial-scale 0 is not "
                                           "set, as the org's wake would not take it away"),
    (switched_pynode(owner_initial="3"), NOT_ALLOWED, "starts 3 pod(s) (its template's initial-scale; initial-scale "
                                                      "0 is not set, as Knative refuses it without"),
    (switched_pynode(), UNREADABLE, "starts 1 pod(s) (the cluster's initial-scale, 1 by default, as config-autoscaler "
                                    "could not be read; initial-scale 0 is not set, as whether Knative allows it could "
                                    "not be read: knative-serving/config-autoscaler could not be read (403"),
])
def test_otherwise_a_sleeping_pynode_starts_its_initial_scale_which_the_autoscaler_ends(ksvc, initial, words):
    found = plan(ksvc, initial=initial)
    assert found.outcome == rp.AUTOSCALER and found.wakes and found.patch == rp.redeploy_patch("pynode", STAMP)
    assert words in found.effect and found.effect.endswith("its min-scale stays 0, so Knative's autoscaler ends it "
                                                           "once it gets no requests")


@pytest.mark.parametrize(("obj", "kind", "reconcile", "words"), [
    (make_isvc("llm", min_replicas=2), "InferenceService", RECONCILE,
     "starts 2 pod(s) (min-scale 2: the owner's minReplicas, which KServe gives every new revision; the org's 0 is "
     "on the old one) and keeps them until the org's scale-to-zero reconcile sets it to min-scale 0 (within 600 s: "
     "the schedule \"orgs: scale-to-zero reconcile\" runs every 600 s)"),
    (make_isvc("llm"), "InferenceService", rp.Schedule(name="orgs: scale-to-zero reconcile", every_seconds=None),
     "starts 1 pod(s) (min-scale 1: the owner's minReplicas, which KServe gives every new revision; the org's 0 is "
     "on the old one) and keeps them until the org's scale-to-zero reconcile sets it to min-scale 0 (the schedule "
     "\"orgs: scale-to-zero reconcile\" is disabled or not an interval: until it runs again, or the org wakes)"),
    (switched_pynode(min_scale="1"), "pynode", RECONCILE,
     "starts 1 pod(s) (min-scale 1: its template's, as the org's switch is not on it yet)"),
])
def test_a_sleeping_model_with_a_min_scale_above_zero_runs_until_the_orgs_reconcile(obj, kind, reconcile, words):
    found = plan(obj, kind, reconcile=reconcile)
    assert found.outcome == rp.RECONCILE and found.wakes and words in found.effect
    assert found.patch == rp.redeploy_patch(kind, STAMP), "an initial-scale 0 would not keep it asleep"


def test_a_sleeping_model_its_owner_lets_scale_to_zero_starts_its_initial_scale_and_no_initial_scale_is_written():
    found = plan(make_isvc("llm", min_replicas=0), "InferenceService")
    assert found.outcome == rp.AUTOSCALER and found.patch == rp.redeploy_patch("InferenceService", STAMP)
