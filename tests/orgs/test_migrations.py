"""Orgs registered without an activity time get one when the database is migrated."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.audit.test_migrations import migrate

pytestmark = pytest.mark.django_db(transaction=True)

AT = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def test_an_org_registered_without_a_time_counts_as_active_from_the_migration_not_from_long_ago():
    old = migrate(("orgs", "0006_audit_record_removed"))
    cluster = old.get_model("clusters", "Cluster").objects.create(name="east", kubeconfig_path="/nonexistent")
    orgs = old.get_model("orgs", "Org").objects
    orgs.create(slug="panel-added", cluster=cluster, namespace="panel-added", last_activity_at=None)
    orgs.create(slug="synced", cluster=cluster, namespace="synced", last_activity_at=AT)
    try:
        new = migrate(("orgs", "0007_org_registered_active"))
        times = dict(new.get_model("orgs", "Org").objects.values_list("slug", "last_activity_at"))
        assert times["synced"] == AT, "a recorded time is kept"
        assert abs(datetime.now(timezone.utc) - times["panel-added"]) < timedelta(minutes=1), \
            "the whole dormancy period from now: the first sweep puts none of them to sleep"
    finally:
        migrate(*[(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()])


def test_an_org_partial_when_the_database_is_migrated_counts_as_partial_since_its_last_check():
    old = migrate(("orgs", "0007_org_registered_active"))
    cluster = old.get_model("clusters", "Cluster").objects.create(name="east", kubeconfig_path="/nonexistent")
    orgs = old.get_model("orgs", "Org").objects
    orgs.create(slug="partial", cluster=cluster, namespace="partial", pending=["ksvc partial/x: 403"], reconciled_at=AT)
    orgs.create(slug="applied", cluster=cluster, namespace="applied", pending=[], reconciled_at=AT)
    try:
        new = migrate(("orgs", "0008_org_pending_since"))
        since = dict(new.get_model("orgs", "Org").objects.values_list("slug", "pending_since"))
        assert since == {"partial": AT, "applied": None}
    finally:
        migrate(*[(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()])
