"""Copy the defrag jobs' audit rows into the one audit trail (audit.AuditEntry, subject
"defrag_job"), keeping who, when, why, the target and the values before and after; the
next migration drops them.

Cost at fleet size: reads every defrag audit row and writes one audit entry each, 2,000
a batch: 100,000 rows took 30 s (bench/migration_costs.py, 2 shared cores). A job leaves
some ten to fifty rows, so a few thousand jobs' rows take about that long, in the
migration's one transaction; stop the workers first (a job stepped meanwhile would
write rows the copy does not see).
"""
from django.db import migrations


def rows_copy(apps, schema_editor):
    DefragAudit = apps.get_model("capacity", "DefragAudit")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    batch = []
    for row in DefragAudit.objects.select_related("job").order_by("at", "id").iterator(chunk_size=2000):
        batch.append(AuditEntry(at=row.at, actor_id=row.actor_id, actor_label=row.actor_label, app="defrag",
                                action=row.action, cause=row.cause, target=row.target,
                                cluster_id=row.job.cluster_id, subject_type="defrag_job", subject_id=row.job_id,
                                old=row.old, new=row.new))
        if len(batch) >= 2000:
            AuditEntry.objects.bulk_create(batch)
            batch = []
    AuditEntry.objects.bulk_create(batch)


def entries_copy_back(apps, schema_editor):
    DefragAudit = apps.get_model("capacity", "DefragAudit")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    entries = AuditEntry.objects.filter(app="defrag", subject_type="defrag_job")
    DefragAudit.objects.bulk_create(
        DefragAudit(job_id=e.subject_id, at=e.at, actor_id=e.actor_id, actor_label=e.actor_label, action=e.action,
                    cause=e.cause, target=e.target, old=e.old, new=e.new)
        for e in entries.order_by("at", "id").iterator(chunk_size=2000))
    entries.delete()


class Migration(migrations.Migration):

    dependencies = [
        ("capacity", "0008_runbook_write_ahead_intent"),
        ("audit", "0001_audit_entry"),
    ]

    operations = [migrations.RunPython(rows_copy, entries_copy_back)]
