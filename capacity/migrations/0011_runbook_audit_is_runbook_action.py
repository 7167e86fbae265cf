"""The runbook's write-ahead record is an action (acting, done, failed), not the audit: the
model is renamed RunbookAction and its outcome goes to the one audit trail. Permissions
granted on the old name keep working under the new one.

Cost at fleet size: the rename is a catalog change; the code updates at most four
permission rows. Instant, whatever the number of runbook rows.
"""
from django.db import migrations

VERBS = ("add", "change", "delete", "view")


def permissions_rename(apps, schema_editor, old="runbookaudit", new="runbookaction", label="runbook action"):
    Permission = apps.get_model("auth", "Permission")
    for verb in VERBS:
        stale = Permission.objects.filter(content_type__app_label="capacity", codename=f"{verb}_{old}")
        if Permission.objects.filter(content_type__app_label="capacity", codename=f"{verb}_{new}").exists():
            continue        # already created under the new name: the old one is left to its holders
        stale.update(codename=f"{verb}_{new}", name=f"Can {verb} {label}")


def permissions_rename_back(apps, schema_editor):
    permissions_rename(apps, schema_editor, old="runbookaction", new="runbookaudit", label="runbook audit")


class Migration(migrations.Migration):

    dependencies = [
        ("capacity", "0010_defrag_audit_removed"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RenameModel(old_name="RunbookAudit", new_name="RunbookAction"),
        migrations.RunPython(permissions_rename, permissions_rename_back),
    ]
