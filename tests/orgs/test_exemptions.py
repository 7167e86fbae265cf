"""Exempt or snooze an org, a model or a pynode from dormancy and pruning: the sweep leaves a
held org awake, the scale-to-zero apply keeps a held workload at its owner's floor, the
pruner's plan skips it with its reason; every change audited; an ended snooze simply stops
applying."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User

from clusters import kube
from config import clock
from orgs import planning, selectors, services
from audit.models import AuditEntry
from orgs.models import Org, WorkloadExemption
from orgs.planning import OrgActivity, plan_sweep
from tests.orgs.builders import make_isvc, make_ksvc, make_pa, make_revision
from tests.orgs.test_services import ann, ksvc_min_scale, make_idle, scenario
from tests.pruning.test_planning import gpu, make_obj, make_pod, view
from pruning import planning as prune_planning

NOW = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)


# --- pure decisions ------------------------------------------------------------------------------
def idle(i: int, **fields) -> OrgActivity:
    return OrgActivity(id=i, slug=f"org-{i}", last_activity_at=NOW - timedelta(hours=30), dormant=False,
                       scale_to_zero_allowed=True, **fields)


def test_the_sweep_plan_leaves_exempt_and_snoozed_orgs_awake_and_an_ended_snooze_applies_no_more():
    orgs = [idle(1), idle(2, exempt=True), idle(3, snoozed_until=NOW + timedelta(minutes=1)),
            idle(4, snoozed_until=NOW - timedelta(seconds=1)), idle(5, snoozed_until=NOW)]
    plan = plan_sweep(orgs=orgs, now=NOW, dormant_after=timedelta(hours=24), budget=100)
    assert plan.to_dormant == ("org-1", "org-4", "org-5")
    assert plan.held == ("org-2", "org-3")
    assert "org-2: idle, but exempt or snoozed: stays awake" in plan.describe()
    assert [o.id for o in plan.chosen] == [1, 4, 5]


def test_hold_words_say_how_long_is_left():
    assert planning.Hold(None, "launch week").describe(NOW) == "exempt until removed: launch week"
    hold = planning.Hold(NOW + timedelta(hours=23, minutes=5), "demo")
    assert hold.describe(NOW) == "snoozed for 23 h 5 min more (until 2026-03-25 11:05 UTC): demo"
    assert planning.Hold(NOW + timedelta(days=6, hours=3), "").describe(NOW).startswith("snoozed for 6 d 3 h more")
    assert planning.Hold(NOW - timedelta(hours=1), "x").describe(NOW) == "snooze ended 2026-03-24 11:00 UTC: x"
    assert (hold.word, planning.Hold(None).word) == ("snoozed-by-operator", "exempted-by-operator")


@pytest.mark.parametrize("kwargs, message", [
    ({"duration": timedelta(0)}, "snooze duration must be positive"),
    ({"duration": timedelta(hours=-1)}, "snooze duration must be positive"),
    ({"duration": timedelta(days=400)}, "at most 366 days"),
    ({"until": NOW - timedelta(minutes=1)}, "must be in the future"),
    ({"until": NOW}, "must be in the future"),
    ({"until": datetime(2026, 3, 25, 12)}, "time zone"),
    ({"until": NOW + timedelta(days=500)}, "within 366 days"),
    ({}, "duration or an end time"),
])
def test_a_snooze_end_that_is_not_a_future_time_within_a_year_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        planning.snooze_until(now=NOW, **kwargs)


def test_a_held_model_and_pynode_keep_their_owners_floor_when_the_org_is_enabled():
    plan = planning.plan_scale_to_zero(
        namespace="acme", setting="enabled",
        pynodes=[make_ksvc("pynode", min_scale="1"), make_ksvc("tool", min_scale="0", owner="2")],
        inference_services=[make_isvc("llm", min_replicas=1), make_isvc("big", min_replicas=2)],
        knative_services=[make_ksvc("llm-predictor", pynode=False, revisions=("llm-1",)),
                          make_ksvc("big-predictor", pynode=False, revisions=("big-1",))],
        revisions=[make_revision("llm-1"), make_revision("big-1")],
        podautoscalers=[make_pa("llm-1", min_scale="1"), make_pa("big-1", min_scale="0")],
        knative_version="1.15.0",
        held={("pynode", "tool"): "exempt until removed: batch jobs", ("inferenceservice", "big"): "snoozed"})
    changes = {(p.target, p.name): (p.current, p.wanted) for p in plan.patches}
    assert changes[("ksvc", "pynode")] == ("1", "0")
    assert changes[("podautoscaler", "llm-1")] == ("1", "0")
    # The product's own "0"s on the held workloads go back to their owners' floors.
    assert changes[("ksvc", "tool")] == ("0", "2")
    assert changes[("podautoscaler", "big-1")] == ("0", "2")
    assert plan.exempt == ("pynode acme/tool: exempt until removed: batch jobs; kept at its owner's floor",
                           "inferenceservice acme/big: snoozed; kept at its owner's floor")


def test_the_pruner_skips_held_namespaces_and_owners_with_the_operators_reason():
    deploy = [make_obj("ReplicaSet", "rs", owner=("Deployment", "web")), make_obj("Deployment", "web"),
              make_obj("ReplicaSet", "rs", ns="team-b", owner=("Deployment", "web")),
              make_obj("Deployment", "web", ns="team-b"),
              make_obj("ReplicaSet", "rs", ns="team-c", owner=("Deployment", "web")),
              make_obj("Deployment", "web", ns="team-c")]
    pods = [make_pod("a"), make_pod("b", ns="team-b"), make_pod("c", ns="team-c")]
    series = [gpu("a", 0), gpu("b", 0, ns="team-b"), gpu("c", 0, ns="team-c")]
    settings = prune_planning.PruneSettings(held_namespaces={"team-a": "snoozed-by-operator"},
                                            held_owners={("Deployment", "team-b", "web"): "exempted-by-operator"})
    plan = prune_planning.plan_prune(series=series, view=view(pods, deploy), settings=settings,
                                     now=datetime(2026, 1, 1, 12, tzinfo=UTC))
    assert {d.pod: (d.decision, d.reason) for d in plan.decisions} == {
        "a": ("skip", "snoozed-by-operator"), "b": ("skip", "exempted-by-operator"), "c": ("prune", "idle")}


# --- against the database and the simulated cluster ---------------------------------------------
@pytest.fixture
def cluster(sim_cluster_factory):
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    return sim


@pytest.fixture
def ops(db):
    return User.objects.create_user("ops", password="pw", is_staff=True)


def dormant(slug: str) -> bool:
    return Org.objects.get(slug=slug).dormant


@pytest.mark.django_db(transaction=True)
def test_the_sweep_leaves_an_exempt_or_snoozed_org_awake_until_the_snooze_ends(cluster, ops):
    for slug in ("acme", "globex"):
        make_idle(slug)
    now = clock.now()
    services.org_hold_set(org=Org.objects.get(slug="acme"), until=None, reason="flagship customer", actor=ops, now=now)
    services.org_hold_set(org=Org.objects.get(slug="globex"), until=now + timedelta(hours=2), reason="demo",
                          actor=ops, now=now)

    dry = services.dormancy_sweep(now=now, dry_run=True)
    assert "acme: idle, but exempt or snoozed: stays awake" in dry.lines
    assert services.dormancy_sweep(now=now, enqueue=False).switched == ()
    assert not dormant("acme") and not dormant("globex")

    later = now + timedelta(hours=2, seconds=1)
    assert services.dormancy_sweep(now=later, enqueue=False).switched == ("globex",)
    assert not dormant("acme")


@pytest.mark.django_db(transaction=True)
def test_the_sweep_marks_exactly_what_its_plan_chose_and_no_org_whose_row_changed_since(cluster, monkeypatch):
    make_idle("acme")
    make_idle("globex")
    read = services._sweep_candidates_read

    def read_then_activity(cutoff):
        rows = read(cutoff)
        # Activity lands between the sweep's read and its UPDATE.
        Org.objects.filter(slug="globex").update(last_activity_at=clock.now())
        return rows

    monkeypatch.setattr(services, "_sweep_candidates_read", read_then_activity)
    result = services.dormancy_sweep(now=clock.now(), enqueue=False)
    assert result.switched == ("acme",)
    assert "globex: changed since the sweep read it (activity, flag or exemption): left awake" in result.lines
    assert dormant("acme") and not dormant("globex")
    assert Org.objects.get(slug="globex").switches.count() == 0


@pytest.mark.django_db
def test_the_sweeps_narrowed_read_loses_no_org_the_rule_would_pick(make_org):
    """The database read narrows to awake, idle orgs; the plan over every org chooses the same."""
    now = clock.now()
    for i, (hours, fields) in enumerate([(30, {}), (30, {"dormant": True}), (2, {}), (30, {"exempt": True}),
                                         (30, {"snoozed_until": now + timedelta(hours=1)}),
                                         (30, {"snoozed_until": now - timedelta(hours=1)}),
                                         (30, {"scale_to_zero_allowed": False}), (24.01, {}), (23.99, {})]):
        make_org(f"o{i}", idle_hours=hours, **fields)
    Org.objects.create(slug="never", cluster=Org.objects.first().cluster, namespace="never", last_activity_at=None)
    everyone = [OrgActivity(*r) for r in Org.objects.values_list(
        "id", "slug", "last_activity_at", "dormant", "scale_to_zero_allowed", "exempt", "snoozed_until")]
    full = plan_sweep(orgs=everyone, now=now, dormant_after=timedelta(hours=24), budget=100)
    assert full.to_dormant == ("o0", "o5", "o7")
    assert services.dormancy_sweep(now=now, dry_run=True, budget=100).switched == full.to_dormant


@pytest.mark.django_db(transaction=True)
def test_exempting_a_dormant_org_wakes_it_and_is_audited(cluster, ops, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    cluster.advance(0)
    assert ksvc_min_scale(gw, "pynode") == "0"

    outcome = services.org_hold_set(org=Org.objects.get(slug="acme"), until=None, reason="launch week",
                                    actor=ops, now=clock.now())
    cluster.advance(0)

    assert outcome.woke and "it was dormant and is marked active" in outcome.describe()
    org = Org.objects.get(slug="acme")
    assert not org.dormant and org.exempt and org.exemption_reason == "launch week"
    assert ksvc_min_scale(gw, "pynode") == "1", "the pynode is back at its owner's floor"
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "2"
    record = AuditEntry.objects.get(action="org_exempt")
    assert (record.actor, record.org) == (ops, org)
    assert record.old == {"exempt": False, "snoozed_until": None, "dormant": True}
    assert record.new == {"exempt": True, "reason": "launch week", "dormant": False}
    assert record.cause == "operator: exempt until removed: launch week"

    services.org_hold_clear(org=org, actor=ops, now=clock.now())
    assert AuditEntry.objects.get(action="org_exemption_end").old == {"exempt": True, "reason": "launch week"}
    assert services.dormancy_sweep(now=clock.now(), enqueue=False).switched == ("acme",)


@pytest.mark.django_db(transaction=True)
def test_a_snoozed_model_of_a_dormant_org_returns_to_its_floor_and_sleeps_again_when_the_snooze_ends(
        cluster, ops, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    cluster.advance(0)
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "0"
    org = Org.objects.get(slug="acme")
    now = clock.now()

    outcome = services.workload_hold_set(org=org, kind="inferenceservice", name="big", until=now + timedelta(hours=1),
                                         reason="customer demo at 3", actor=ops, now=now)
    cluster.advance(0)
    assert outcome.applied is not None and outcome.applied.complete
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "2", "the model's own minReplicas"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "0", "the org's other model still sleeps"
    assert ksvc_min_scale(gw, "pynode") == "0"
    applied = AuditEntry.objects.filter(action="scale_to_zero_applied").latest("id")
    assert applied.cause.startswith("operator exempted inferenceservice acme/big (snoozed for 1 h 0 min more")
    assert applied.new == {"revision acme/big-predictor-00001": "2", "setting": "enabled"}
    assert AuditEntry.objects.get(action="workload_snooze").actor == ops

    # The reconcile keeps the snoozed model warm and calls nothing drift.
    reconciled = [o for o in services.orgs_reconcile(now=clock.now()).outcomes if o.org == "acme"][0]
    assert reconciled.drift == [] and reconciled.patched == []
    assert "inferenceservice acme/big: snoozed for" in " ".join(reconciled.skipped)

    # The snooze ends: nothing runs then; the next apply lets the model sleep, and says why.
    later = now + timedelta(hours=1, minutes=1)
    reconciled = [o for o in services.orgs_reconcile(now=later).outcomes if o.org == "acme"][0]
    cluster.advance(0)
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "0"
    assert "the snooze of inferenceservice acme/big ended at" in reconciled.cause


@pytest.mark.django_db(transaction=True)
def test_ending_a_workload_exemption_on_a_dormant_org_lets_it_sleep_now(cluster, ops, celery_eager):
    gw = cluster.gateway
    org = Org.objects.get(slug="acme")
    services.workload_hold_set(org=org, kind="pynode", name="pynode", until=None, reason="webhooks",
                               actor=ops, now=clock.now())
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    cluster.advance(0)
    assert ksvc_min_scale(gw, "pynode") == "1", "an exempt pynode is never set to 0"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "0"

    services.workload_hold_clear(exemption=WorkloadExemption.objects.get(), actor=ops, now=clock.now())
    cluster.advance(0)
    assert ksvc_min_scale(gw, "pynode") == "0"
    assert AuditEntry.objects.filter(action="workload_exemption_end", actor=ops).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kind, name, reason, until, message", [
    ("inferenceservice", "llm", "", None, "reason: say why"),
    ("inferenceservice", "llm", "x" * 201, None, "reason: at most 200"),
    ("deployment", "llm", "why", None, "kind: one of"),
    ("inferenceservice", "Bad_Name", "why", None, "name: a Kubernetes object name"),
    ("inferenceservice", "llm", "why", datetime(2020, 1, 1, tzinfo=UTC), "must be in the future"),
])
def test_bad_exemptions_are_refused_by_field_and_change_nothing(make_org, ops, kind, name, reason, until, message):
    org = make_org("acme")
    audits = AuditEntry.objects.count()
    with pytest.raises(ValueError, match=message):
        services.workload_hold_set(org=org, kind=kind, name=name, until=until, reason=reason, actor=ops,
                                   now=clock.now())
    with pytest.raises(ValueError):
        services.org_hold_set(org=org, until=until, reason=reason if message.startswith("reason") else "",
                              actor=ops, now=clock.now())
    assert not WorkloadExemption.objects.exists() and AuditEntry.objects.count() == audits
    org.refresh_from_db()
    assert not org.exempt and org.snoozed_until is None


@pytest.mark.django_db
def test_the_pruner_reads_the_holds_in_force(make_org, ops):
    now = clock.now()
    acme, globex, initech = make_org("acme"), make_org("globex"), make_org("initech")
    services.org_hold_set(org=acme, until=now + timedelta(days=7), reason="trial", actor=ops, now=now)
    # The placeholder cluster cannot be read: the operator says the workloads are not deployed yet.
    services.workload_hold_set(org=globex, kind="inferenceservice", name="llm", until=None, reason="sla",
                               actor=ops, now=now, not_deployed_yet=True)
    services.workload_hold_set(org=globex, kind="pynode", name="pynode", until=now + timedelta(hours=1),
                               reason="demo", actor=ops, now=now, not_deployed_yet=True)
    services.workload_hold_set(org=initech, kind="pynode", name="old", until=now + timedelta(minutes=5),
                               reason="short", actor=ops, now=now, not_deployed_yet=True)
    holds = selectors.prune_holds(cluster=None, namespaces={"acme", "globex", "initech"},
                                  now=now + timedelta(minutes=10))
    assert holds.namespaces == {"acme": "snoozed-by-operator"}
    assert holds.owners == {("InferenceService", "globex", "llm"): "exempted-by-operator",
                            ("Service", "globex", "pynode"): "snoozed-by-operator"}
