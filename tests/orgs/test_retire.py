"""An org that is gone is retired, never deleted with its dormancy switches and audit entries
(which the savings page counts): a superuser's delete is refused in one line, "Retire selected
orgs…" keeps it (audited), the sweep and the org list's acts skip it, the history still shows
it. An org nothing names, and an activity token, may be deleted: both audited."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse

from audit.models import AuditEntry
from clusters.models import Cluster
from config import clock
from orgs import services
from orgs.models import ActivityToken, DormancySwitch, Org
from orgs.retirement import org_retire
from orgs.tokens import activity_token_issue

AT = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def operator(client, django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def acme(db):
    """An idle org with history: two dormancy switches and an audit entry."""
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    org = Org.objects.create(slug="acme", cluster=cluster, namespace="acme",
                             last_activity_at=clock.now() - timedelta(days=3))
    for direction in ("dormant", "active"):
        DormancySwitch.objects.create(org=org, at=AT, direction=direction, cause="sweep")
    AuditEntry.objects.create(at=AT, app="orgs", action="scale_to_zero_applied", org=org, cluster=cluster)
    return org


def _said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def _changelist(operator, query: str = ""):
    return operator.get(reverse("admin:orgs_org_changelist") + query)


def test_deleting_an_org_with_history_is_refused_in_one_line_and_changes_nothing(operator, acme):
    page = operator.get(reverse("admin:orgs_org_change", args=[acme.pk])).content.decode()
    assert 'class="deletelink"' not in page and 'id="retire-link"' in page
    response = operator.post(reverse("admin:orgs_org_delete", args=[acme.pk]), {"post": "yes"}, follow=True)
    assert _said(response) == ["org acme kept: 1 audit entry and 2 dormancy switches name it, and deleting it "
                               "would lose them; retire it instead"]
    response = operator.post(reverse("admin:orgs_org_changelist"),
                             {"action": "delete_selected", "_selected_action": [acme.pk], "post": "yes"}, follow=True)
    assert _said(response)[-1] == "nothing was deleted"
    assert Org.objects.filter(pk=acme.pk).exists() and DormancySwitch.objects.filter(org=acme).count() == 2


def test_retire_from_the_org_list_keeps_the_org_audited_and_out_of_the_sweep(operator, acme):
    assert services.dormancy_sweep(now=clock.now(), dry_run=True).switched == ("acme",)   # idle: the sweep's
    data = {"action": "retire_selected", "_selected_action": [acme.pk]}
    confirm = operator.post(reverse("admin:orgs_org_changelist"), data)
    assert "<li>acme: 1 audit entry, 2 dormancy switches</li>" in confirm.content.decode()
    assert Org.objects.filter(pk=acme.pk).exists()      # the page changes nothing
    response = operator.post(reverse("admin:orgs_org_changelist"), {**data, "confirm": "yes"}, follow=True)
    assert _said(response) == ["acme: retired (kept with its history; no sweep, prune or reconcile acts on it any "
                               "more)"]

    row = Org.all_objects.get(pk=acme.pk)
    assert row.retired_at is not None and row.retired_by == operator.user
    entry = AuditEntry.objects.get(action="org_retired")
    assert (entry.target, entry.actor, entry.org_id) == ("Org/acme", operator.user, acme.pk)
    assert services.dormancy_sweep(now=clock.now(), dry_run=True).switched == ()
    assert list(_changelist(operator).context["cl"].result_list) == []
    assert list(_changelist(operator, "?retired=yes").context["cl"].result_list) == [row]
    page = operator.get(reverse("admin:orgs_org_change", args=[acme.pk])).content.decode()
    assert "by operator" in page and 'name="_save"' not in page
    assert DormancySwitch.objects.filter(org_id=acme.pk).count() == 2


def test_the_org_lists_acts_refuse_a_retired_org_and_change_nothing(operator, acme):
    operator.post(reverse("admin:orgs_org_changelist"),
                  {"action": "retire_selected", "_selected_action": [acme.pk], "confirm": "yes"})
    response = operator.post(reverse("admin:orgs_org_changelist") + "?retired=yes",
                             {"action": "exempt_or_snooze", "_selected_action": [acme.pk], "confirm": "yes",
                              "hold": "exempt", "reason": "launch"}, follow=True)
    assert _said(response)[-1] == "acme (retired): retired, no act reaches it any more; nothing was changed"
    row = Org.all_objects.get(pk=acme.pk)
    assert not row.exempt and not AuditEntry.objects.filter(action__contains="exempt").exists()


def test_an_org_nothing_names_is_deleted_and_audited(operator, db):
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    typo = Org.objects.create(slug="acmee", cluster=cluster, namespace="acmee")
    assert 'class="deletelink"' in operator.get(reverse("admin:orgs_org_change", args=[typo.pk])).content.decode()
    operator.post(reverse("admin:orgs_org_delete", args=[typo.pk]), {"post": "yes"})
    assert not Org.all_objects.filter(pk=typo.pk).exists()
    entry = AuditEntry.objects.get(action="org_deleted")
    assert (entry.target, entry.actor, entry.cluster_id, entry.old["namespace"]) == (
        "Org/acmee", operator.user, cluster.pk, "acmee")


def test_a_token_is_revoked_and_deleted_through_the_admin_each_audited(operator, django_user_model):
    gateway = django_user_model.objects.create_user("gateway")
    gateway.user_permissions.add(Permission.objects.get(codename="record_activity"))
    gateway = django_user_model.objects.get(pk=gateway.pk)
    activity_token_issue(caller="model-gateway", user=gateway, actor=operator.user, now=AT)
    token = ActivityToken.objects.get(caller="model-gateway")

    operator.post(reverse("admin:orgs_activitytoken_change", args=[token.pk]), {"active": ""})
    token.refresh_from_db()
    assert token.active is False
    revoked = AuditEntry.objects.get(action="activity_token_revoke")
    assert (revoked.target, revoked.actor, revoked.new) == ("ActivityToken/model-gateway", operator.user,
                                                            {"active": False})

    operator.post(reverse("admin:orgs_activitytoken_delete", args=[token.pk]), {"post": "yes"})
    assert not ActivityToken.objects.filter(pk=token.pk).exists()
    deleted = AuditEntry.objects.get(action="activity_token_delete")
    assert (deleted.actor, deleted.old["caller"], deleted.old["user"]) == (operator.user, "model-gateway", "gateway")


def test_an_apply_queued_before_the_org_was_retired_does_nothing(acme):
    from orgs.tasks import org_scale_to_zero_apply

    assert org_retire(org=acme, actor=None, now=clock.now()).retired
    entries = AuditEntry.objects.count()
    assert org_scale_to_zero_apply.run(acme.pk) == {"org": acme.pk, "skipped": "no longer in service"}
    assert AuditEntry.objects.count() == entries and Org.all_objects.get(pk=acme.pk).reconciled_at is None
