from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("pruning", "0002_write_ahead_leases_skip_counts"),
    ]

    operations = [
        migrations.AlterField(
            model_name="prunerun",
            name="query",
            field=models.TextField(
                blank=True,
                help_text="The PromQL queries the run sent (the candidates, then the follow-up about them).",
            ),
        ),
    ]
