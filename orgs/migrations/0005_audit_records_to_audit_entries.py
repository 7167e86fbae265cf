"""Copy the org audit records into the one audit trail (audit.AuditEntry), oldest first,
keeping who, when, why and the values before and after; the next migration drops them.

Cost at fleet size: reads every org audit record and writes one audit entry each, 2,000 a
batch: 100,000 records took 39 s (bench/migration_costs.py, 2 shared cores), about 7
minutes per million. With 100,000 orgs each switching once a day (a record each)
that is about 40 s per day of history kept, 4 hours for a year, in the migration's one
transaction: stop the workers and beat first (an org switched meanwhile would write a
record the copy does not see).
"""
from django.db import migrations


def records_copy(apps, schema_editor):
    AuditRecord = apps.get_model("orgs", "AuditRecord")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    batch = []
    for record in AuditRecord.objects.select_related("org").order_by("at", "id").iterator(chunk_size=2000):
        org = record.org
        target = f"Org/{org.slug}" if org is not None else (
            f"ActivityToken/{record.new.get('caller')}" if record.action == "activity_token_issue"
            and isinstance(record.new, dict) else "")
        batch.append(AuditEntry(at=record.at, actor_id=record.actor_id, actor_label=record.actor_label, app="orgs",
                                action=record.action, cause=record.cause, target=target,
                                cluster_id=org.cluster_id if org is not None else None,
                                org_id=record.org_id, old=record.old, new=record.new))
        if len(batch) >= 2000:
            AuditEntry.objects.bulk_create(batch)
            batch = []
    AuditEntry.objects.bulk_create(batch)


def entries_copy_back(apps, schema_editor):
    AuditRecord = apps.get_model("orgs", "AuditRecord")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    AuditRecord.objects.bulk_create(
        AuditRecord(at=e.at, actor_id=e.actor_id, actor_label=e.actor_label, action=e.action, cause=e.cause,
                    org_id=e.org_id, old=e.old, new=e.new)
        for e in AuditEntry.objects.filter(app="orgs").order_by("at", "id").iterator(chunk_size=2000))
    AuditEntry.objects.filter(app="orgs").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("orgs", "0004_exemptions_and_snoozes"),
        ("audit", "0001_audit_entry"),
    ]

    operations = [migrations.RunPython(records_copy, entries_copy_back)]
