"""Runbook actions announce themselves before the cluster write: a state (acting, done,
failed), the reason of a failure and the lease of the process carrying one out. Every
row recorded before this was written after its action succeeded: it is `done`, settled
when it was recorded.

Cost at fleet size: one UPDATE of every runbook row (one per operator action: thousands):
well under a second (100,000 rows took 1.6 s with the columns added, bench/migration_costs.py,
2 shared cores). The new columns are nullable or carry a constant default
(catalog only); the registry model's key and the index on `at` are built over the same
rows, within those 1.6 s.
"""
import django.db.models.deletion
from django.db import migrations, models


def existing_rows_done(apps, schema_editor):
    RunbookAudit = apps.get_model("capacity", "RunbookAudit")
    RunbookAudit.objects.filter(settled_at__isnull=True).update(settled_at=models.F("at"))


class Migration(migrations.Migration):

    dependencies = [
        ('capacity', '0007_safety_condition_help'),
    ]

    operations = [
        migrations.AddField(
            model_name='runbookaudit',
            name='state',
            field=models.CharField(choices=[('acting', 'acting (announced; the cluster write may be under way)'), ('done', 'done'), ('failed', 'failed (not done)')], default='done', help_text='acting: announced and maybe under way; done: the cluster shows it; failed: it was not done (see error).', max_length=10),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='runbookaudit',
            name='error',
            field=models.TextField(blank=True, help_text='Why it failed, or how its outcome was learned when the worker that sent it could not tell (settled from the cluster).'),
        ),
        migrations.AddField(
            model_name='runbookaudit',
            name='acting_owner',
            field=models.CharField(blank=True, help_text='The process carrying it out while acting (host:pid:nonce); empty once settled.', max_length=200),
        ),
        migrations.AddField(
            model_name='runbookaudit',
            name='acting_expires_at',
            field=models.DateTimeField(blank=True, help_text="While acting: when its owner's lease lapses and the registry sync may settle it from the cluster.", null=True),
        ),
        migrations.AddField(
            model_name='runbookaudit',
            name='settled_at',
            field=models.DateTimeField(blank=True, help_text='When it became done or failed.', null=True),
        ),
        migrations.AddField(
            model_name='runbookaudit',
            name='served_model',
            field=models.ForeignKey(blank=True, help_text="The registry's model it was done to (shown beside it in the list).", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runbook_actions', to='capacity.servedmodel'),
        ),
        migrations.RunPython(existing_rows_done, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='runbookaudit',
            name='at',
            field=models.DateTimeField(db_index=True, help_text='When it was asked for and announced (the injected clock).'),
        ),
        migrations.AlterField(
            model_name='runbookaudit',
            name='new',
            field=models.JSONField(blank=True, default=dict, help_text='While acting: the planned value (redeploy stamp, uid to delete). Once done: the values after, or what was deleted.'),
        ),
    ]
