"""The old per-app audit rows reach the one audit trail when the database is migrated."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

AT = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def migrate(*targets: tuple[str, str]):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(list(targets))
    return executor.loader.project_state(list(targets)).apps


def test_org_audit_records_become_entries_with_who_why_target_and_values():
    old = migrate(("orgs", "0004_exemptions_and_snoozes"), ("audit", "0001_audit_entry"))
    cluster = old.get_model("clusters", "Cluster").objects.create(name="east", kubeconfig_path="/nonexistent")
    org = old.get_model("orgs", "Org").objects.create(slug="acme", cluster=cluster, namespace="acme",
                                                      last_activity_at=AT)
    ops = old.get_model("auth", "User").objects.create(username="ops")
    records = old.get_model("orgs", "AuditRecord").objects
    records.create(at=AT, actor=ops, action="org_disallow_scale_to_zero", cause="launch", org=org,
                   old={"scale_to_zero_allowed": True}, new={"scale_to_zero_allowed": False})
    records.create(at=AT, actor_label="cli:oncall@bastion", action="activity_token_issue", org=None,
                   new={"caller": "gateway", "user": "gw"})
    try:
        new = migrate(("orgs", "0006_audit_record_removed"))
        entries = list(new.get_model("audit", "AuditEntry").objects.order_by("id").values(
            "app", "action", "actor_id", "actor_label", "cause", "target", "cluster_id", "org_id", "old", "new"))
        assert entries == [
            {"app": "orgs", "action": "org_disallow_scale_to_zero", "actor_id": ops.id, "actor_label": "",
             "cause": "launch", "target": "Org/acme", "cluster_id": cluster.id, "org_id": org.id,
             "old": {"scale_to_zero_allowed": True}, "new": {"scale_to_zero_allowed": False}},
            {"app": "orgs", "action": "activity_token_issue", "actor_id": None, "actor_label": "cli:oncall@bastion",
             "cause": "", "target": "ActivityToken/gateway", "cluster_id": None, "org_id": None, "old": {},
             "new": {"caller": "gateway", "user": "gw"}},
        ]
    finally:
        migrate(*[(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()])


def test_defrag_audit_rows_become_entries_of_their_job():
    old = migrate(("capacity", "0008_runbook_write_ahead_intent"), ("audit", "0001_audit_entry"))
    cluster = old.get_model("clusters", "Cluster").objects.create(name="east", kubeconfig_path="/nonexistent")
    ops = old.get_model("auth", "User").objects.create(username="ops")
    job = old.get_model("capacity", "DefragJob").objects.create(cluster=cluster, node_name="gpu-3", state="safe",
                                                                created_at=AT)
    rows = old.get_model("capacity", "DefragAudit").objects
    rows.create(job=job, at=AT, actor=ops, action="node_cordon", target="Node/gpu-3",
                old={"unschedulable": False}, new={"unschedulable": True})
    rows.create(job=job, at=AT, actor_label="cli:oncall@bastion", action="node_return_to_service",
                cause="returned to service by an operator", target="Node/gpu-3")
    try:
        new = migrate(("capacity", "0010_defrag_audit_removed"))
        entries = list(new.get_model("audit", "AuditEntry").objects.order_by("id").values(
            "app", "action", "actor_id", "actor_label", "cause", "target", "cluster_id", "subject_type",
            "subject_id", "old", "new"))
        assert entries == [
            {"app": "defrag", "action": "node_cordon", "actor_id": ops.id, "actor_label": "", "cause": "",
             "target": "Node/gpu-3", "cluster_id": cluster.id, "subject_type": "defrag_job", "subject_id": job.id,
             "old": {"unschedulable": False}, "new": {"unschedulable": True}},
            {"app": "defrag", "action": "node_return_to_service", "actor_id": None,
             "actor_label": "cli:oncall@bastion", "cause": "returned to service by an operator",
             "target": "Node/gpu-3", "cluster_id": cluster.id, "subject_type": "defrag_job", "subject_id": job.id,
             "old": {}, "new": {}},
        ]
    finally:
        migrate(*[(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()])


def test_runbook_audit_rows_and_their_permissions_carry_over_as_runbook_actions():
    old = migrate(("capacity", "0010_defrag_audit_removed"), ("contenttypes", "0002_remove_content_type_name"),
                  ("auth", "0012_alter_user_first_name_max_length"))
    ContentType = old.get_model("contenttypes", "ContentType")
    Permission = old.get_model("auth", "Permission")
    kind, _ = ContentType.objects.get_or_create(app_label="capacity", model="runbookaudit")
    Permission.objects.filter(content_type__app_label="capacity", codename__endswith="_runbookaction").delete()
    view, _ = Permission.objects.get_or_create(content_type=kind, codename="view_runbookaudit",
                                               defaults={"name": "Can view runbook audit"})
    ops = old.get_model("auth", "User").objects.create(username="ops")
    ops.user_permissions.add(view)
    old.get_model("capacity", "RunbookAudit").objects.create(at=AT, actor=ops, action="model_redeploy",
                                                             target="acme/llm", state="done")
    try:
        new = migrate(("capacity", "0011_runbook_audit_is_runbook_action"))
        (row,) = new.get_model("capacity", "RunbookAction").objects.values_list("action", "target", "state")
        assert row == ("model_redeploy", "acme/llm", "done")
        # (`manage.py migrate` renames the content type itself; the codename is this migration's)
        held = new.get_model("auth", "User").objects.get(username="ops").user_permissions.values_list(
            "codename", flat=True)
        assert list(held) == ["view_runbookaction"]
    finally:
        migrate(*[(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()])
