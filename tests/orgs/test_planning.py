"""Pure scale-to-zero and sweep decisions: no database, no cluster."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orgs import planning
from orgs.planning import MIN_SCALE, OrgActivity, plan_scale_to_zero, plan_sweep
from tests.orgs.builders import make_isvc, make_ksvc, make_pa, make_revision

NOW = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)


def _plan(setting, *, version="1.21.0", pynodes=(), isvcs=(), ksvcs=(), revisions=(), pas=()):
    return plan_scale_to_zero(namespace="acme", setting=setting, pynodes=list(pynodes), inference_services=list(isvcs),
                              knative_services=list(ksvcs) + list(pynodes), revisions=list(revisions),
                              podautoscalers=list(pas), knative_version=version)


@pytest.mark.parametrize(("text", "parsed"), [
    ("1.21.0", (1, 21, 0)), ("v1.20", (1, 20)), ("knative-v1.21.1", (1, 21, 1)), ("", ()), (None, ()),
    ("latest", ()),
])
def test_versions_parse(text, parsed):
    assert planning.parse_version(text) == parsed


@pytest.mark.parametrize(("version", "mechanisms"), [
    ("1.21.0", ("revision-annotation",)),
    ("1.22.3", ("revision-annotation",)),
    ("1.20.0", ("podautoscaler-patch",)),
    ("0.26.0", ("podautoscaler-patch",)),
    ("", ("revision-annotation", "podautoscaler-patch")),
])
def test_model_mechanism_follows_knative_version(version, mechanisms):
    assert planning.model_mechanisms(version) == mechanisms


@pytest.mark.parametrize(("setting", "current", "wanted"), [
    ("enabled", "1", "0"), ("enabled", None, "0"), ("disabled", "0", "1"), ("disabled", None, "1"),
])
def test_pynode_template_gets_min_scale(setting, current, wanted):
    plan = _plan(setting, pynodes=[make_ksvc("pynode", min_scale=current)])
    [patch] = plan.patches
    assert (patch.target, patch.name, patch.current, patch.wanted) == ("ksvc", "pynode", current, wanted)
    assert patch.merge_patch() == {"spec": {"template": {"metadata": {"annotations": {MIN_SCALE: wanted}}}}}


def test_nothing_to_patch_when_every_workload_holds_the_setting():
    plan = _plan("enabled", pynodes=[make_ksvc("pynode", min_scale="0")],
                 isvcs=[make_isvc("llm")], ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="0")])
    assert plan.in_place
    assert len(plan.holding) == 2


def test_legacy_camelcase_key_counts_as_the_current_value():
    ksvc = make_ksvc("pynode")
    ksvc["spec"]["template"]["metadata"]["annotations"] = {"autoscaling.knative.dev/minScale": "0"}
    assert _plan("enabled", pynodes=[ksvc]).in_place


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


def test_unknown_knative_version_patches_both_levers():
    plan = _plan("enabled", version="", isvcs=[make_isvc("llm")],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="1")],
                 pas=[make_pa("llm-predictor-00001", min_scale="1")])
    assert sorted(p.target for p in plan.patches) == ["podautoscaler", "revision"]


@pytest.mark.parametrize(("min_replicas", "floor"), [(None, "1"), (0, "1"), (1, "1"), (3, "3")])
def test_disabling_returns_a_model_to_its_own_floor(min_replicas, floor):
    plan = _plan("disabled", isvcs=[make_isvc("llm", min_replicas=min_replicas)],
                 ksvcs=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-predictor-00001",))],
                 revisions=[make_revision("llm-predictor-00001", min_scale="0")])
    assert [p.wanted for p in plan.patches] == [floor]


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
