"""The one audit trail: its writer, its reads and its read-only page."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEntry
from audit.selectors import entries_of_org, entries_of_subject
from audit.services import audit
from clusters.models import Cluster
from config import clock
from config.actors import acting_as
from orgs.models import Org

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    org = Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=clock.now())
    return cluster, org


def test_the_writer_records_actor_cause_target_and_before_after_and_the_shells_label(world):
    cluster, org = world
    ops = User.objects.create_user("ops")
    now = clock.now()
    entry = audit(app="defrag", action="node_cordon", at=now, actor=ops, cause="drain of gpu-3",
                  target="Node/gpu-3", cluster=cluster, subject=("defrag_job", 7),
                  old={"unschedulable": False}, new={"unschedulable": True})
    entry.refresh_from_db()
    assert (entry.actor, entry.actor_label, entry.target, entry.cause) == (ops, "", "Node/gpu-3", "drain of gpu-3")
    assert (entry.subject_type, entry.subject_id, entry.old, entry.new) == (
        "defrag_job", 7, {"unschedulable": False}, {"unschedulable": True})
    with acting_as("cli:oncall@bastion"):
        shell = audit(app="orgs", action="org_mark_active", at=now, org=org, target="Org/acme",
                      cause="x" * 500)
    assert shell.actor is None and shell.actor_label == "cli:oncall@bastion"
    assert len(AuditEntry.objects.get(pk=shell.pk).cause) == 200      # cut to the column, not refused


def test_the_reads_give_an_orgs_entries_and_a_subjects_entries_in_order(world):
    cluster, org = world
    now = clock.now()
    first = audit(app="defrag", action="job_start", at=now, target="Node/a", subject=("defrag_job", 1))
    second = audit(app="defrag", action="node_cordon", at=now + timedelta(seconds=1), target="Node/a",
                   subject=("defrag_job", 1))
    audit(app="defrag", action="node_cordon", at=now, target="Node/b", subject=("defrag_job", 2))
    mine = audit(app="orgs", action="org_allow_scale_to_zero", at=now, org=org, target="Org/acme")
    assert list(entries_of_subject(subject_type="defrag_job", subject_id=1, oldest_first=True)) == [first, second]
    assert list(entries_of_subject(subject_type="defrag_job", subject_id=1)) == [second, first]
    assert list(entries_of_org(org=org)) == [mine]


def test_the_page_lists_filters_and_searches_entries_and_changes_nothing(client, world):
    cluster, org = world
    now = clock.now()
    audit(app="defrag", action="node_cordon", at=now, target="Node/gpu-3", cluster=cluster,
          old={"unschedulable": False}, new={"unschedulable": True})
    audit(app="orgs", action="org_allow_scale_to_zero", at=now, org=org, target="Org/acme")
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get("/admin/audit/auditentry/").content.decode()
    assert "Node/gpu-3" in page and "Org/acme" in page
    searched = client.get("/admin/audit/auditentry/?q=gpu-3").content.decode()
    assert "Node/gpu-3" in searched and "Org/acme" not in searched
    filtered = client.get("/admin/audit/auditentry/?app=orgs").content.decode()
    assert "Org/acme" in filtered and "Node/gpu-3" not in filtered
    entry = AuditEntry.objects.get(action="node_cordon")
    detail = client.get(f"/admin/audit/auditentry/{entry.pk}/change/").content.decode()
    assert "unschedulable" in detail and "<table" in detail
    assert client.get("/admin/audit/auditentry/add/").status_code == 403
    client.post(f"/admin/audit/auditentry/{entry.pk}/delete/", {"post": "yes"})
    assert AuditEntry.objects.filter(pk=entry.pk).exists()
