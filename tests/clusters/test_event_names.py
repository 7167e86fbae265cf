"""Events about one object at one instant each land: the simulated cluster's manual clock
gives a prune and its restore the same nanosecond, and the second Event used to get 409."""
from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from clusters import kube

pytestmark = pytest.mark.django_db

SCENARIO = """
apiVersion: v1
kind: Namespace
metadata: {name: team, labels: {capacity.io/org: team}}
"""


def test_two_events_for_one_object_at_the_same_instant_both_land(sim_cluster_factory):
    gw = sim_cluster_factory(SCENARIO).gateway
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "llama-predictor", "namespace": "team", "uid": "u-1"}}
    when = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)
    gw.create_event(deployment, reason="GPUIdleScaledToZero", message="scaled 2 → 0", now=when)
    gw.create_event(deployment, reason="GPUIdleRestored", message="restored 0 → 2", now=when)

    events = gw.list(kube.EVENTS, namespace="team")
    assert sorted(e["reason"] for e in events) == ["GPUIdleRestored", "GPUIdleScaledToZero"]
    names = [e["metadata"]["name"] for e in events]
    assert len(set(names)) == 2
    stamp = f"{int(when.timestamp() * 1e9):x}"
    assert all(re.fullmatch(rf"llama-predictor\.{stamp}\.[0-9a-f]{{6}}", n) for n in names), names


def test_an_event_name_stays_a_valid_name_for_the_longest_object_names():
    name = kube.event_name("m" * 253, datetime(2026, 3, 24, 12, 0, tzinfo=UTC))
    assert len(name) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)
