"""Pure scale-to-zero and sweep decisions: no database, no cluster."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orgs import planning
from orgs.planning import MIN_SCALE, OWNER_MIN_SCALE, OrgActivity, plan_scale_to_zero, plan_sweep
from tests.orgs.builders import make_isvc, make_ksvc, make_pa, make_revision

NOW = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)
SLEPT_AT = datetime(2026, 3, 1, tzinfo=UTC)


def _plan(setting, *, version="1.21.0", pynodes=(), isvcs=(), ksvcs=(), revisions=(), pas=(), applied="", **kw):
    return plan_scale_to_zero(namespace="acme", setting=setting, pynodes=list(pynodes), inference_services=list(isvcs),
                              knative_services=list(ksvcs) + list(pynodes), revisions=list(revisions),
                              podautoscalers=list(pas), knative_version=version, applied=applied, **kw)


@pytest.mark.parametrize(("text", "parsed"), [
    ("1.21.0", (1, 21, 0)), ("v1.20", (1, 20)), ("knative-v1.21.1", (1, 21, 1)), ("", ()), (None, ()),
    ("latest", ()),
])
def test_versions_parse(text, parsed):
    assert planning.parse_version(text) == parsed


@pytest.mark.parametrize(("version", "mechanism"), [
    ("1.21.0", "revision-annotation"),
    ("1.22.3", "revision-annotation"),
    ("1.20.0", "podautoscaler-patch"),
    ("0.26.0", "podautoscaler-patch"),
    ("", "podautoscaler-patch"),
    ("devel", "podautoscaler-patch"),
])
def test_model_mechanism_follows_knative_version(version, mechanism):
    assert planning.knative_lever(version=version).target == mechanism


def test_enabling_a_pynode_records_the_owners_value_in_the_same_patch():
    [patch] = _plan("enabled", pynodes=[make_ksvc("pynode", min_scale="2")]).patches
    assert (patch.target, patch.name, patch.current, patch.wanted) == ("ksvc", "pynode", "2", "0")
    assert patch.merge_patch() == {"spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "0"}}}},
                                   "metadata": {"annotations": {OWNER_MIN_SCALE: "2"}}}


def test_enabling_a_pynode_without_a_value_records_that_the_owner_set_none():
    [patch] = _plan("enabled", pynodes=[make_ksvc("pynode")]).patches
    assert patch.merge_patch()["metadata"] == {"annotations": {OWNER_MIN_SCALE: ""}}


@pytest.mark.parametrize(("owner", "restored"), [("1", "1"), ("3", "3"), ("0", "0"), ("", None)])
def test_disabling_a_pynode_restores_the_recorded_value_and_forgets_it(owner, restored):
    [patch] = _plan("disabled", pynodes=[make_ksvc("pynode", min_scale="0", owner=owner)]).patches
    assert patch.wanted == restored
    body = patch.merge_patch()
    assert body["metadata"] == {"annotations": {OWNER_MIN_SCALE: None}}
    if restored == "0":
        assert "spec" not in body, "the template is not touched: no new Revision"
    else:
        assert body["spec"] == {"template": {"metadata": {"annotations": {MIN_SCALE: restored}}}}


@pytest.mark.parametrize("current", ["0", "1", "2", None])
def test_disabling_never_touches_a_pynode_the_product_never_set(current):
    """The owner's own value, "0" included, is the floor; the switch owns only what it added."""
    assert _plan("disabled", pynodes=[make_ksvc("pynode", min_scale=current)]).in_place


def test_a_zero_written_before_owners_values_were_recorded_is_restored_warm():
    [patch] = _plan("disabled", applied="enabled", pynodes=[make_ksvc("pynode", min_scale="0")]).patches
    assert patch.wanted == "1"
    older = make_ksvc("pynode", min_scale="0", created="2026-01-01T00:00:00Z")
    [patch] = _plan("disabled", applied="enabled", enabled_since=SLEPT_AT, pynodes=[older]).patches
    assert patch.wanted == "1", "a pynode that was there when the org went to sleep may hold an unrecorded product zero"


def test_a_pynode_its_owner_created_at_zero_while_the_org_slept_is_never_woken():
    """Only pynodes that existed when the product last set scale to zero can hold a "0" it
    wrote without a record; one created later holds its owner's "0"."""
    newer = make_ksvc("pynode-b", min_scale="0", created="2026-03-02T09:30:00Z")
    assert _plan("disabled", applied="enabled", enabled_since=SLEPT_AT, pynodes=[newer]).in_place
    [patch] = _plan("enabled", applied="enabled", enabled_since=SLEPT_AT, pynodes=[newer]).patches
    assert (patch.current, patch.wanted, patch.record) == ("0", "0", "0")
    assert patch.describe() == "ksvc acme/pynode-b: min-scale stays 0 (owner's value 0 recorded)"


def test_an_owner_who_changes_the_floor_while_the_org_sleeps_gets_the_new_floor_back():
    changed = make_ksvc("pynode", min_scale="2", owner="1")
    [patch] = _plan("enabled", applied="enabled", pynodes=[changed]).patches
    assert (patch.current, patch.wanted, patch.record) == ("2", "0", "2")
    assert patch.merge_patch()["metadata"] == {"annotations": {OWNER_MIN_SCALE: "2"}}
    [back] = _plan("disabled", applied="enabled", pynodes=[make_ksvc("pynode", min_scale="0", owner="2")]).patches
    assert back.wanted == "2"


def test_a_recorded_floor_that_did_not_change_is_not_written_again():
    [patch] = _plan("enabled", applied="enabled", pynodes=[make_ksvc("pynode", min_scale="1", owner="1")]).patches
    assert patch.record is None and "metadata" not in patch.merge_patch()


def test_nothing_to_patch_when_every_workload_holds_the_setting():
    plan = _plan("enabled", pynodes=[make_ksvc("pynode", min_scale="0", owner="1")],
                 isvcs=[make_isvc("llm")], ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="0")])
    assert plan.in_place
    assert len(plan.holding) == 2


def test_legacy_camelcase_key_counts_as_the_current_value_and_is_the_one_patched():
    ksvc = make_ksvc("pynode", owner="1")
    ksvc["spec"]["template"]["metadata"]["annotations"] = {"autoscaling.knative.dev/minScale": "0"}
    assert _plan("enabled", pynodes=[ksvc]).in_place
    [patch] = _plan("disabled", pynodes=[ksvc]).patches
    assert patch.merge_patch()["spec"] == {"template": {"metadata": {"annotations": {
        "autoscaling.knative.dev/minScale": "1"}}}}


def test_models_on_new_knative_patch_the_routed_revisions_not_the_pa():
    plan = _plan("enabled", version="1.21.0", isvcs=[make_isvc("llm")],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001", "llm-predictor-00002"))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="1"),
                            make_revision("llm-predictor-00002", min_scale="1")],
                 pas=[make_pa("llm-predictor-00001", min_scale="1"), make_pa("llm-predictor-00002", min_scale="1")])
    assert [(p.target, p.name, p.wanted) for p in plan.patches] == [
        ("revision", "llm-predictor-00001", "0"), ("revision", "llm-predictor-00002", "0")]
    assert plan.patches[0].merge_patch() == {"metadata": {"annotations": {MIN_SCALE: "0"}}}


def test_models_on_old_knative_patch_the_podautoscaler():
    plan = _plan("enabled", version="1.20.0", isvcs=[make_isvc("llm")],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="1")],
                 pas=[make_pa("llm-predictor-00001", min_scale="1")])
    assert [(p.target, p.name) for p in plan.patches] == [("podautoscaler", "llm-predictor-00001")]
    assert "podautoscaler-patch (Knative 1.20.0)" in plan.mechanism


@pytest.mark.parametrize("version", ["", "devel", "latest"])
def test_unknown_knative_version_patches_only_the_podautoscaler(version):
    """A Revision patch rolls the model's pods (seen on Knative 1.15): never on a guess."""
    plan = _plan("enabled", version=version, isvcs=[make_isvc("llm")],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="1")],
                 pas=[make_pa("llm-predictor-00001", min_scale="1")])
    assert [p.target for p in plan.patches] == ["podautoscaler"]
    assert "Knative unknown" in plan.mechanism


def test_the_lever_says_why_it_was_chosen():
    unknown = planning.knative_lever(version="devel", source="", looked_at=("namespace label 'devel'",))
    assert unknown.target == "podautoscaler-patch" and not unknown.restarts_pods
    assert "namespace label 'devel'" in unknown.reason and "replaces no pod" in unknown.reason
    new = planning.knative_lever(version="v1.21.0", source="image tag of Deployment knative-serving/controller")
    assert new.target == "revision-annotation" and new.restarts_pods
    assert "image tag" in new.reason and "restarts the model's pods" in new.reason


@pytest.mark.parametrize(("min_replicas", "floor"), [(None, "1"), (0, None), (1, "1"), (3, "3"), (-1, "1"),
                                                     ("x", "1")])
def test_disabling_returns_a_model_to_its_own_floor(min_replicas, floor):
    """minReplicas 0 stays at 0: nothing raises a model above what its owner asked for."""
    plan = _plan("disabled", isvcs=[make_isvc("llm", min_replicas=min_replicas)],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="0")])
    assert [p.wanted for p in plan.patches] == ([floor] if floor else [])


@pytest.mark.parametrize("current", ["2", "1", None])
def test_disabling_leaves_a_value_the_switch_did_not_write(current):
    plan = _plan("disabled", isvcs=[make_isvc("llm", min_replicas=1)],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale=current)])
    assert plan.in_place


def test_with_the_podautoscaler_lever_a_revision_zero_left_by_an_earlier_revision_patch_is_undone():
    plan = _plan("disabled", version="devel", isvcs=[make_isvc("llm", min_replicas=2)],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="0")],
                 pas=[make_pa("llm-predictor-00001", min_scale="0")])
    assert [(p.target, p.wanted) for p in plan.patches] == [("podautoscaler", "2"), ("revision", "2")]
    assert "restarts its pods" in plan.patches[1].reason


def test_kinds_the_cluster_does_not_serve_are_none_and_the_rest_is_planned():
    plan = _plan("enabled", pynodes=[make_ksvc("pynode", min_scale="1")], unserved=("inferenceservices",))
    assert [p.target for p in plan.patches] == ["ksvc"]
    assert plan.notes == ("KServe is not served on this cluster: no models to switch",)
    assert plan.incomplete == ()


def test_a_kind_that_cannot_be_read_leaves_the_plan_incomplete_and_says_why():
    plan = _plan("enabled", pynodes=[make_ksvc("pynode", min_scale="1")], isvcs=[make_isvc("llm")],
                 unreadable={"inferenceservices": "503 ServiceUnavailable: etcd"})
    assert [p.target for p in plan.patches] == ["ksvc"], "the pynodes are still switched"
    assert plan.incomplete == ("models of acme: cannot read InferenceServices: 503 ServiceUnavailable: etcd",)


def test_old_kfserving_predictor_default_name_is_found():
    plan = _plan("enabled", isvcs=[make_isvc("llm")],
                 ksvcs=[make_ksvc("llm-predictor-default", pynode=False, revisions=("llm-predictor-default-00001",))],
                 revisions=[make_revision("llm-predictor-default-00001")])
    assert [p.name for p in plan.patches] == ["llm-predictor-default-00001"]


@pytest.mark.parametrize("mode", ["Standard", "RawDeployment"])
def test_raw_deployment_models_are_skipped_with_a_reason(mode):
    plan = _plan("enabled", isvcs=[make_isvc("llm", mode=mode)],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001")])
    assert plan.in_place
    assert plan.skipped == ("inferenceservice acme/llm: raw deployment mode cannot scale to zero",)


def test_a_model_whose_knative_service_is_not_there_yet_is_skipped():
    plan = _plan("enabled", isvcs=[make_isvc("fresh")])
    assert plan.in_place and "no predictor Knative Service yet" in plan.skipped[0]


def test_bad_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="'sleepy'"):
        _plan("sleepy")


def _org(i, hours_idle, *, dormant=False, allowed=True):
    return OrgActivity(id=i, slug=f"org-{i}", last_activity_at=NOW - timedelta(hours=hours_idle), dormant=dormant,
                       scale_to_zero_allowed=allowed)


def test_sweep_marks_only_idle_allowed_active_orgs():
    orgs = [_org(1, 25), _org(2, 23), _org(3, 30, allowed=False), _org(4, 48, dormant=True), _org(5, 24.01)]
    plan = plan_sweep(orgs=orgs, now=NOW, dormant_after=timedelta(hours=24), budget=100)
    assert plan.to_dormant == ("org-1", "org-5")  # the longest idle first
    assert plan.cutoff == NOW - timedelta(hours=24)


def test_sweep_budget_takes_the_longest_idle_first():
    orgs = [_org(1, 25), _org(2, 50), _org(3, 40)]
    plan = plan_sweep(orgs=orgs, now=NOW, dormant_after=timedelta(hours=24), budget=2)
    assert plan.to_dormant == ("org-2", "org-3")
    assert plan.over_budget == ("org-1",)
    assert "budget" in plan.describe()[-1]


def test_an_org_never_active_is_not_swept():
    org = OrgActivity(id=1, slug="new", last_activity_at=None, dormant=False, scale_to_zero_allowed=True)
    assert plan_sweep(orgs=[org], now=NOW, dormant_after=timedelta(hours=24), budget=10).to_dormant == ()


@pytest.mark.parametrize(("after", "budget", "message"), [
    (timedelta(0), 1, "dormancy period must be positive"), (timedelta(hours=1), -1, "budget must be >= 0")])
def test_sweep_refuses_bad_parameters(after, budget, message):
    with pytest.raises(ValueError, match=message):
        plan_sweep(orgs=[], now=NOW, dormant_after=after, budget=budget)
