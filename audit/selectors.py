"""Reads of the audit trail for the apps and their pages."""
from __future__ import annotations

from django.db.models import QuerySet

from audit.models import AuditEntry


def entries_of_org(*, org) -> QuerySet[AuditEntry]:
    """Every entry about the org, newest first."""
    return AuditEntry.objects.filter(org=org).select_related("actor").order_by("-at", "-id")


def entries_of_subject(*, subject_type: str, subject_id: int, oldest_first: bool = False) -> QuerySet[AuditEntry]:
    """Every entry of one record of an app (a defrag job, a runbook action…)."""
    order = ("at", "id") if oldest_first else ("-at", "-id")
    return AuditEntry.objects.filter(subject_type=subject_type, subject_id=subject_id) \
        .select_related("actor").order_by(*order)


def entries_filter(**lookups) -> QuerySet[AuditEntry]:
    """Entries matching field lookups (app, action, cluster, org__cluster, at__lte…), oldest first."""
    return AuditEntry.objects.filter(**lookups).order_by("at", "id")
