"""A pynode's dormancy switch and Knative's initial scale (pure planning).

Switching a pynode through its template makes a new Revision, which starts
`initial-scale` pods before it may scale to zero. Where config-autoscaler allows a zero
initial scale the switch also sets initial-scale "0" (and gives the owner's value back
on disable); where it does not, Knative's webhook would refuse the "0", so none is set
and the panel says a pod starts. Checked end to end on both backends in
tests/realcluster/test_features_dormancy.py.
"""
from __future__ import annotations

import pytest

from clusters.knative import initial_scale_from_config
from orgs import planning
from orgs.planning import INITIAL_SCALE, MIN_SCALE, OWNER_INITIAL_SCALE, OWNER_MIN_SCALE

from .builders import make_ksvc


def lever(config: dict | None, error: str = "") -> planning.Lever:
    initial = initial_scale_from_config(config=config, error=error)
    return planning.knative_lever(version="1.15.0").with_initial_scale(initial)


def pynode_patch(setting: str, ksvc: dict, the_lever: planning.Lever) -> planning.Patch | None:
    plan = planning.plan_scale_to_zero(namespace="acme", setting=setting, pynodes=[ksvc], inference_services=[],
                                       knative_services=[ksvc], revisions=[], podautoscalers=[], lever=the_lever,
                                       applied="")
    return plan.patches[0] if plan.patches else None


@pytest.mark.parametrize("flag", ["true", "True", "TRUE", "t", "1"])
def test_the_flag_is_read_as_knative_reads_it(flag):
    assert initial_scale_from_config(config={"allow-zero-initial-scale": flag}).zero_allowed


@pytest.mark.parametrize(("config", "error", "words"), [
    (None, "", "no knative-serving/config-autoscaler (Knative's defaults): each switch"),
    ({}, "", "has no allow-zero-initial-scale: each switch"),
    ({"allow-zero-initial-scale": "false", "initial-scale": "2"}, "", "starts 2 pod(s)"),
    ({"allow-zero-initial-scale": "yes"}, "", "sets allow-zero-initial-scale: 'yes'"),
    (None, "403 Forbidden: configmaps", "could not be read (403 Forbidden: configmaps)"),
])
def test_without_a_zero_initial_scale_the_statement_says_what_starts(config, error, words):
    found = initial_scale_from_config(config=config, error=error)
    assert not found.zero_allowed and words in planning.pynode_initial_scale_statement(found)


def test_when_allowed_the_switch_sets_initial_scale_zero_and_gives_the_owners_back():
    allowed = lever({"allow-zero-initial-scale": "true"})
    ksvc = make_ksvc("pynode", min_scale="1")
    ksvc["spec"]["template"]["metadata"]["annotations"][INITIAL_SCALE] = "2"

    enable = pynode_patch("enabled", ksvc, allowed)

    assert enable.merge_patch() == {
        "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "0", INITIAL_SCALE: "0"}}}},
        "metadata": {"annotations": {OWNER_MIN_SCALE: "1", OWNER_INITIAL_SCALE: "2"}}}
    assert enable.describe().endswith("min-scale 1 → 0, initial-scale 0 (owner's value 1 recorded)")
    assert "at initial-scale 0" in allowed.describe() and "starts no pod" in allowed.explain()

    switched = make_ksvc("pynode", min_scale="0", owner="1")
    switched["metadata"]["annotations"][OWNER_INITIAL_SCALE] = "2"
    switched["spec"]["template"]["metadata"]["annotations"][INITIAL_SCALE] = "0"
    assert pynode_patch("enabled", switched, allowed) is None              # holding: no new Revision
    disable = pynode_patch("disabled", switched, allowed)
    assert disable.merge_patch() == {
        "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1", INITIAL_SCALE: "2"}}}},
        "metadata": {"annotations": {OWNER_MIN_SCALE: None, OWNER_INITIAL_SCALE: None}}}


def test_an_owner_without_an_initial_scale_gets_none_back():
    switched = make_ksvc("pynode", min_scale="0", owner="")
    switched["metadata"]["annotations"][OWNER_INITIAL_SCALE] = ""
    switched["spec"]["template"]["metadata"]["annotations"][INITIAL_SCALE] = "0"
    disable = pynode_patch("disabled", switched, lever({"allow-zero-initial-scale": "true"}))
    assert disable.merge_patch()["spec"]["template"]["metadata"]["annotations"] == {MIN_SCALE: None,
                                                                                INITIAL_SCALE: None}


@pytest.mark.parametrize(("config", "error"), [({}, ""), (None, "503 Service Unavailable")])
def test_when_not_allowed_or_unknown_no_initial_scale_is_written(config, error):
    the_lever = lever(config, error)
    enable = pynode_patch("enabled", make_ksvc("pynode", min_scale="1"), the_lever)
    assert enable.merge_patch() == {"spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "0"}}}},
                                    "metadata": {"annotations": {OWNER_MIN_SCALE: "1"}}}
    assert "a pod starts per switch" in the_lever.describe()
