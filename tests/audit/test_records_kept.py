"""Records of what the product did are never lost through the panel: a superuser (the demo's
operator is one) finds no Delete button, no "Delete selected" action, no editable form and no
add page on a prune run or decision, a binpack run, a defrag job, a runbook action or an audit
entry; asking anyway (the delete page's address, the action posted by hand, the change form
posted) changes nothing and every row is still there. A cluster or org that records name
cannot be deleted by a cascade either."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db.models import ProtectedError
from django.urls import reverse

from audit.models import AuditEntry
from capacity.binpack.models import BinpackNodeFreed, BinpackRun
from capacity.defrag.models import DefragJob, DefragLogLine, DefragOrphan, DefragRevision, JobState
from capacity.runbook.models import RunbookAction
from clusters.models import Cluster
from orgs.models import DormancySwitch, Org
from pruning.models import PruneDecision, PruneRun

AT = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def history(db):
    """A cluster and an org with one record of each kind of act on them."""
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    org = Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=AT)
    run = PruneRun.objects.create(cluster=cluster, mode="scale-down", status="succeeded", evaluated_at=AT,
                                  acted=1, skip_counts={"busy": 2})
    decision = PruneDecision.objects.create(
        run=run, namespace="acme", pod="llm-0", owner_kind="Deployment", owner_name="llm", decision="prune",
        reason="idle", result="succeeded", restore_state={"replicas": 2})
    binpack = BinpackRun.objects.create(cluster=cluster, started_at=AT, trigger="admin", planned=3, written=3)
    freed = BinpackNodeFreed.objects.create(cluster=cluster, run=binpack, node="gpu-2", marked_at=AT, gpus=8,
                                            freed_at=AT, last_seen_free_at=AT, workloads=["acme/ReplicaSet/llm"])
    job = DefragJob.objects.create(cluster=cluster, node_name="gpu-1", state=JobState.DRAINED, created_at=AT)
    revision = DefragRevision.objects.create(job=job, namespace="acme", revision="llm-1", replicaset="llm-1-rs",
                                             initial_kpa_scale=1, initial_replicas=1, overprovision=1)
    orphan = DefragOrphan.objects.create(job=job, revision=revision, namespace="acme", pod_name="llm-1-a", uid="u1")
    line = DefragLogLine.objects.create(job=job, seq=1, text="cordoned gpu-1")
    action = RunbookAction.objects.create(at=AT, cluster=cluster, action="model_redeploy", target="acme/llm",
                                          state="done")
    switch = DormancySwitch.objects.create(org=org, at=AT, direction="dormant", cause="sweep")
    entry = AuditEntry.objects.create(at=AT, app="pruning", action="scale_down", target="Deployment acme/llm",
                                      cluster=cluster, org=org)
    return {"cluster": cluster, "org": org, "prunerun": run, "prunedecision": decision, "binpackrun": binpack,
            "binpacknodefreed": freed,
            "defragjob": job, "revision": revision, "orphan": orphan, "line": line, "runbookaction": action,
            "switch": switch, "auditentry": entry}


@pytest.fixture
def operator(client, django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    return client


RECORDS = [("pruning", "prunerun"), ("pruning", "prunedecision"), ("capacity", "binpackrun"),
           ("capacity", "binpacknodefreed"), ("capacity", "defragjob"), ("capacity", "runbookaction"), ("audit", "auditentry")]


def _all_rows(history) -> dict:
    return {name: type(row)._base_manager.filter(pk=row.pk).exists() for name, row in history.items()}


@pytest.mark.parametrize("app, model", RECORDS)
def test_a_superuser_finds_a_record_read_only_its_page_showing_it(operator, history, app, model):
    row = history[model]
    changelist = operator.get(reverse(f"admin:{app}_{model}_changelist"))
    assert changelist.status_code == 200
    actions = [name for name, _ in changelist.context["action_form"].fields["action"].choices] \
        if changelist.context.get("action_form") else []
    assert "delete_selected" not in actions

    page = operator.get(reverse(f"admin:{app}_{model}_change", args=[row.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'class="deletelink"' not in html      # no Delete button
    assert 'name="_save"' not in html                # no Save button: nothing on it is editable
    assert not page.context["adminform"].form.fields  # every field shown read only
    assert operator.get(reverse(f"admin:{app}_{model}_add")).status_code == 403


@pytest.mark.parametrize("app, model", RECORDS)
def test_asking_the_admin_to_delete_or_edit_a_record_anyway_changes_nothing(operator, history, app, model):
    row = history[model]
    before = {f.name: getattr(row, f.attname) for f in type(row)._meta.concrete_fields}

    assert operator.get(reverse(f"admin:{app}_{model}_delete", args=[row.pk])).status_code == 403
    assert operator.post(reverse(f"admin:{app}_{model}_delete", args=[row.pk]), {"post": "yes"}).status_code == 403
    operator.post(reverse(f"admin:{app}_{model}_changelist"),
                  {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    edit = {f.name: "" for f in type(row)._meta.concrete_fields}
    assert operator.post(reverse(f"admin:{app}_{model}_change", args=[row.pk]), edit).status_code == 403

    assert all(_all_rows(history).values())
    row.refresh_from_db()
    assert {f.name: getattr(row, f.attname) for f in type(row)._meta.concrete_fields} == before


def test_the_prune_run_page_has_no_skip_counts_form_and_still_shows_the_counts(operator, history):
    page = operator.get(reverse("admin:pruning_prunerun_change", args=[history["prunerun"].pk])).content.decode()
    assert "<textarea" not in page and 'name="skip_counts"' not in page
    assert '<span id="skip-counts">2 pods: busy 2</span>' in page


def test_the_org_page_shows_its_dormancy_switches_with_nothing_to_delete_or_edit(operator, history):
    page = operator.get(reverse("admin:orgs_org_change", args=[history["org"].pk]))
    switches = next(f for f in page.context["inline_admin_formsets"] if f.opts.model is DormancySwitch)
    assert len(switches.formset.forms) == 1
    assert not switches.has_delete_permission and not switches.has_change_permission
    assert "switches-0-DELETE" not in page.content.decode()


def test_the_restore_of_a_decision_is_still_offered_to_whoever_may_restore(operator, history):
    changelist = operator.get(reverse("admin:pruning_prunedecision_changelist"))
    assert "restore_selected" in [name for name, _ in changelist.context["action_form"].fields["action"].choices]


@pytest.mark.parametrize("record", ["prunerun", "defragjob", "binpackrun"])
def test_no_cascade_takes_a_run_or_a_job_away_with_its_children(history, record):
    with pytest.raises(ProtectedError):
        history[record].delete()
    assert all(_all_rows(history).values())


def test_no_cascade_takes_history_away_with_a_cluster_or_an_org(history):
    with pytest.raises(ProtectedError) as cluster_refused:
        Cluster.all_objects.get(pk=history["cluster"].pk).delete()
    kept = {type(obj) for obj in cluster_refused.value.protected_objects}
    assert {Org, PruneRun, BinpackRun, BinpackNodeFreed, DefragJob, RunbookAction, AuditEntry} <= kept
    with pytest.raises(ProtectedError) as org_refused:
        Org.all_objects.get(pk=history["org"].pk).delete()
    assert {DormancySwitch, AuditEntry} <= {type(obj) for obj in org_refused.value.protected_objects}
    assert all(_all_rows(history).values())


def test_a_user_who_acted_is_kept_and_one_no_record_names_is_deleted_audited(operator, history, django_user_model):
    ops = django_user_model.objects.create_user("ops")
    AuditEntry.objects.create(at=AT, app="orgs", action="org_exempt", actor=ops, org=history["org"])
    response = operator.post(reverse("admin:auth_user_delete", args=[ops.pk]), {"post": "yes"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "user ops kept: 1 audit entry name it, and deleting it would lose them; deactivate it instead (untick Active)"]
    response = operator.post(reverse("admin:auth_user_changelist"),
                             {"action": "delete_selected", "_selected_action": [ops.pk], "post": "yes"}, follow=True)
    assert [str(m) for m in response.context["messages"]][-1] == "nothing was deleted"
    assert AuditEntry.objects.get(action="org_exempt").actor == ops

    spare = django_user_model.objects.create_user("spare")
    operator.post(reverse("admin:auth_user_delete", args=[spare.pk]), {"post": "yes"})
    assert not django_user_model.objects.filter(pk=spare.pk).exists()
    entry = AuditEntry.objects.get(action="user_deleted")
    assert (entry.target, entry.actor.get_username()) == ("User/spare", "operator")
