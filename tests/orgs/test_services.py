"""Scale to zero end to end against the simulated cluster, through the real client."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from clusters import kube
from config import clock
from orgs import services
from orgs.activity import org_activity_record
from audit.models import AuditEntry
from orgs.models import DormancySwitch, Org
from orgs.planning import MIN_SCALE

pytestmark = pytest.mark.django_db(transaction=True)


def scenario(knative: str = "1.21.0") -> str:
    return f"""
apiVersion: v1
kind: Namespace
metadata: {{name: knative-serving, labels: {{app.kubernetes.io/version: "{knative}"}}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: acme, labels: {{capacity.io/org: acme}}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: globex, labels: {{capacity.io/org: globex}}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: weird, labels: {{capacity.io/org: Not_A_Slug}}}}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {{name: pynode, namespace: acme, labels: {{capacity.io/component: pynode}}}}
spec:
  template:
    metadata: {{annotations: {{autoscaling.knative.dev/min-scale: "1"}}}}
    spec: {{containers: [{{image: "pynode:1"}}]}}
---
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {{name: llm, namespace: acme}}
spec: {{predictor: {{minReplicas: 1, model: {{modelFormat: {{name: sklearn}}}}}}}}
---
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {{name: big, namespace: acme}}
spec: {{predictor: {{minReplicas: 2, model: {{modelFormat: {{name: sklearn}}}}}}}}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {{name: pynode, namespace: globex, labels: {{capacity.io/component: pynode}}}}
spec:
  template:
    metadata: {{annotations: {{autoscaling.knative.dev/min-scale: "1"}}}}
    spec: {{containers: [{{image: "pynode:1"}}]}}
"""


@pytest.fixture
def cluster(sim_cluster_factory):
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    return sim


@pytest.fixture
def orgs(cluster):
    services.orgs_sync(cluster=cluster.cluster, now=clock.now())
    return {o.slug: o for o in Org.objects.all()}


def ksvc_min_scale(gw, name, ns="acme"):
    return gw.get(kube.KNATIVE_SERVICES, name, namespace=ns)["spec"]["template"]["metadata"]["annotations"][MIN_SCALE]


def ann(gw, resource, name, ns="acme"):
    return (gw.get(resource, name, namespace=ns)["metadata"].get("annotations") or {}).get(MIN_SCALE)


def revisions(gw, service, ns="acme"):
    return sorted(r["metadata"]["name"] for r in gw.list(kube.REVISIONS, namespace=ns,
                                                          label_selector=f"serving.knative.dev/service={service}"))


def make_idle(slug: str, hours: float = 30) -> None:
    Org.objects.filter(slug=slug).update(last_activity_at=clock.now() - timedelta(hours=hours))


def test_sync_orgs_registers_labelled_namespaces_and_names_bad_labels(cluster, capsys):
    with pytest.raises(CommandError, match="1 namespace"):
        call_command("sync_orgs", "--cluster", cluster.cluster.name)
    out, err = capsys.readouterr()
    assert "created 2" in out
    assert "namespace weird: label capacity.io/org='Not_A_Slug' is not a valid slug" in err
    assert sorted(Org.objects.values_list("slug", "namespace")) == [("acme", "acme"), ("globex", "globex")]
    assert not Org.objects.get(slug="acme").dormant, "a new org counts as active from its registration"
    result = services.orgs_sync(cluster=cluster.cluster, now=clock.now())
    assert result.created == [] and sorted(result.unchanged) == ["acme", "globex"]


def labelled_namespace(gw, name: str, org: str) -> None:
    gw.create(kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": name, "labels": {"capacity.io/org": org}}})


def test_two_namespaces_with_one_org_label_leave_the_org_where_it_is_and_sync_the_rest(cluster, orgs, capsys):
    """Both namespaces labelled acme: the org used to flip between them on every run,
    unaudited ('updated 1 ['acme']'), and acme was counted twice."""
    labelled_namespace(cluster.gateway, "acme-copy", "acme")
    labelled_namespace(cluster.gateway, "initech", "initech")
    for run in range(2):
        with pytest.raises(CommandError) as failed:
            call_command("sync_orgs", "--cluster", cluster.cluster.name)
        out, err = capsys.readouterr()
        assert str(failed.value) == ("3 namespace(s) could not be synced (weird, acme, acme-copy), see the errors "
                                     "above; the others are synced")
        assert out.strip() == (f"cluster {cluster.cluster.name}: created {1 - run} {['initech'] if not run else []}, "
                               f"updated 0 [], unchanged {1 + run}")
        assert ("error: org 'acme': namespaces acme, acme-copy all carry capacity.io/org=acme; org 'acme' is left in "
                "namespace acme (keep the label on one namespace only)") in err.splitlines()
        assert Org.objects.get(slug="acme").namespace == "acme"
    assert sorted(Org.objects.values_list("slug", "namespace")) == [("acme", "acme"), ("globex", "globex"),
                                                                    ("initech", "initech")]
    assert not AuditEntry.objects.filter(org__slug="acme").exists()


def test_an_org_moves_only_once_its_old_namespace_is_gone_audited_and_applied_there(cluster, orgs, celery_eager,
                                                                                      capsys):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    assert Org.objects.get(slug="acme").applied == "enabled"
    labelled_namespace(gw, "acme-v2", "acme")
    gw.create(kube.KNATIVE_SERVICES, {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "pynode", "namespace": "acme-v2", "labels": {"capacity.io/component": "pynode"}},
        "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1"}},
                              "spec": {"containers": [{"image": "pynode:1"}]}}}}, namespace="acme-v2")
    gw.patch(kube.NAMESPACES, "acme", {"metadata": {"labels": {"capacity.io/org": None}}})
    cluster.advance(0)

    # The old namespace still exists: its workloads are the org's, so the org stays there.
    with pytest.raises(CommandError, match=r"^2 namespace\(s\) could not be synced \(weird, acme-v2\)"):
        call_command("sync_orgs", "--cluster", cluster.cluster.name)
    assert ("error: namespace acme-v2: labelled capacity.io/org=acme, but org 'acme' lives in namespace acme, which "
            "still exists; the org is left there (delete acme to move it, or remove the label from acme-v2)"
            ) in capsys.readouterr().err.splitlines()
    assert Org.objects.get(slug="acme").namespace == "acme"
    assert not AuditEntry.objects.filter(action="org_namespace_move").exists()

    gw.delete(kube.NAMESPACES, "acme")
    cluster.advance(60)
    with pytest.raises(CommandError, match=r"^1 namespace\(s\) could not be synced \(weird\)"):
        call_command("sync_orgs", "--cluster", cluster.cluster.name)
    assert "updated 1 ['acme'], unchanged 1" in capsys.readouterr().out
    org = Org.objects.get(slug="acme")
    assert (org.namespace, org.applied, org.dormant) == ("acme-v2", "", True)
    move = AuditEntry.objects.get(action="org_namespace_move")
    assert (move.org, move.old, move.new) == (org, {"namespace": "acme", "applied": "enabled"},
                                              {"namespace": "acme-v2", "applied": ""})
    assert move.cause == "sync: namespace acme is gone and acme-v2 carries capacity.io/org=acme"
    assert move.actor is None and move.actor_label.startswith("cli:")

    # Nothing was applied in the new namespace: the retry task applies the org's setting there.
    [outcome] = [o for o in services.orgs_apply_unapplied(now=clock.now() + services.RETRY_GRACE) if o.org == "acme"]
    assert outcome.complete and outcome.kind == "first apply" and outcome.setting == "enabled"
    assert ksvc_min_scale(gw, "pynode", ns="acme-v2") == "0"


def test_sweep_enables_scale_to_zero_on_knative_1_21(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    cluster.advance(0)

    assert ksvc_min_scale(gw, "pynode") == "0"
    assert revisions(gw, "pynode") == ["pynode-00001", "pynode-00002"], "a pynode template change makes a revision"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "0"
    assert ann(gw, kube.PODAUTOSCALERS, "llm-predictor-00001") == "0", "Knative 1.21 copies it onto the PA"
    assert revisions(gw, "llm-predictor") == ["llm-predictor-00001"], "models switch without a redeploy"
    assert ksvc_min_scale(gw, "pynode", ns="globex") == "1", "another org is untouched"

    org = Org.objects.get(slug="acme")
    assert org.dormant and org.applied == "enabled" and org.drift == [] and org.last_error == ""
    assert "revision-annotation (Knative 1.21.0" in org.mechanism
    switch = org.switches.get(direction="dormant")
    assert switch.applied_at is not None and switch.errors == []
    assert len(switch.patched) == 3 and any("ksvc acme/pynode: min-scale 1 → 0" in p for p in switch.patched)


def test_activity_wakes_the_org_and_restores_each_workloads_floor(cluster, orgs, celery_eager, redis_cache):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    cluster.advance(0)
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "0"

    assert org_activity_record("acme") is True
    cluster.advance(0)

    org = Org.objects.get(slug="acme")
    assert not org.dormant and org.applied == "disabled"
    assert ksvc_min_scale(gw, "pynode") == "1"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1"
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "2", "a model returns to its own minReplicas"
    assert ann(gw, kube.PODAUTOSCALERS, "big-predictor-00001") == "2"
    assert list(org.switches.values_list("direction", "cause")) == [("active", "activity"), ("dormant", "sweep")]


def test_kubernetes_writes_only_where_the_state_changes(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    patches_after_switch = gw.calls_total(("patch",))
    assert patches_after_switch == 3  # pynode template + two model revisions

    result = services.orgs_reconcile(now=clock.now(), cluster=cluster.cluster)
    assert gw.calls_total(("patch",)) == patches_after_switch, "nothing changed, nothing written"
    assert result.outcomes and all(not o.patched for o in result.outcomes) and result.clusters_failed == {}


def test_old_knative_patches_the_podautoscaler_and_it_stays(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(scenario(knative="1.20.0"))
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    sim.advance(5)
    gw = sim.gateway
    assert ann(gw, kube.PODAUTOSCALERS, "llm-predictor-00001") == "0", "Knative 1.20 keeps a direct PA patch"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1", "the seed's way leaves the revision alone"
    assert "podautoscaler-patch (Knative 1.20.0)" in Org.objects.get(slug="acme").mechanism
    assert sim.cluster.__class__.objects.get(id=sim.cluster.id).knative_version == "1.20.0"


def test_reconcile_repairs_drift_and_shows_it(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    # Someone reverts a model by hand.
    gw.patch(kube.REVISIONS, "llm-predictor-00001", {"metadata": {"annotations": {MIN_SCALE: "1"}}}, namespace="acme")

    services.orgs_reconcile(now=clock.now())

    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "0"
    org = Org.objects.get(slug="acme")
    assert org.drift == [{"workload": "revision acme/llm-predictor-00001", "found": "1", "wanted": "0"}]
    record = AuditEntry.objects.get(action="scale_to_zero_drift_repaired")
    assert record.old == {"revision acme/llm-predictor-00001": "1"}


def test_a_model_deployed_while_the_org_is_dormant_gets_the_setting(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    gw.create(kube.INFERENCESERVICES, {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "late", "namespace": "acme"},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}}}}})
    cluster.advance(0)
    assert ann(gw, kube.REVISIONS, "late-predictor-00001") == "1"

    call_command("reconcile_scale_to_zero")

    assert ann(gw, kube.REVISIONS, "late-predictor-00001") == "0"


def test_api_failures_are_recorded_and_repaired_by_the_next_reconcile(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    cluster.control.set_faults(seed=0, error_rate=1.0, match={"verbs": ["patch"]})
    services.dormancy_sweep(now=clock.now())

    org = Org.objects.get(slug="acme")
    assert org.dormant and org.applied == "" and "500" in org.last_error
    switch = org.switches.get(direction="dormant")
    assert switch.applied_at is None and len(switch.errors) == 3
    assert ksvc_min_scale(gw, "pynode") == "1"

    cluster.control.clear_faults()
    services.orgs_reconcile(now=clock.now())
    org.refresh_from_db()
    assert org.applied == "enabled" and org.last_error == ""
    assert ksvc_min_scale(gw, "pynode") == "0"


def test_write_conflicts_are_retried_until_they_pass(cluster, orgs, celery_eager):
    gw = cluster.gateway
    make_idle("acme")
    # Seed 2 meets a 409 on some patches, never three in a row on one: each passes on a
    # retry within the service (a conflict that outlasts its retries is a refusal: see
    # tests/orgs/test_tasks.py).
    cluster.control.set_faults(seed=2, conflict_rate=0.5, match={"verbs": ["patch"]})
    services.dormancy_sweep(now=clock.now())
    cluster.control.clear_faults()
    org = Org.objects.get(slug="acme")
    assert org.applied == "enabled", org.last_error
    assert gw.calls_total(("patch",)) > 3, "some patches met a 409 and were tried again"
    assert ksvc_min_scale(gw, "pynode") == "0"


@pytest.mark.django_db  # on_commit callbacks are captured, not run at commit
def test_an_enable_that_runs_after_the_org_woke_keeps_it_warm(cluster, orgs, django_capture_on_commit_callbacks):
    """The sweep's queued enable runs late, after an activity: it must apply 'disabled'."""
    gw = cluster.gateway
    make_idle("acme")
    with django_capture_on_commit_callbacks(execute=False) as queued:
        services.dormancy_sweep(now=clock.now())
    assert len(queued) == 1
    services.org_mark_active(org_slug="acme", cause="activity", at=clock.now())
    switch = DormancySwitch.objects.get(org__slug="acme", direction="dormant")

    services.org_scale_to_zero_apply(org_id=orgs["acme"].id, switch_id=switch.id)

    assert ksvc_min_scale(gw, "pynode") == "1"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1"
    assert Org.objects.get(slug="acme").applied == "disabled"


def test_a_protected_org_is_never_swept(cluster, orgs, celery_eager):
    Org.objects.filter(slug="acme").update(scale_to_zero_allowed=False)
    make_idle("acme")
    assert services.dormancy_sweep(now=clock.now()).switched == ()
    assert ksvc_min_scale(cluster.gateway, "pynode") == "1"


def test_record_activity_command(cluster, orgs, celery_eager, capsys):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    call_command("record_activity", "acme")
    assert ("acme: activity recorded; it was dormant and is awake: scale to zero disabled applied (switch): "
            "3 workload(s) patched") in capsys.readouterr().out
    assert ksvc_min_scale(cluster.gateway, "pynode") == "1"
    with pytest.raises(CommandError, match="no org with slug 'nobody'"):
        call_command("record_activity", "nobody")
