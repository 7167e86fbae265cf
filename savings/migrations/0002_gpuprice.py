"""A price per GPU-hour per GPU model, for the savings page's money.

Cost at fleet size: none; a new, empty table of one row per GPU model.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('savings', '0001_savings_per_cluster'),
    ]

    operations = [
        migrations.CreateModel(
            name='GpuPrice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('gpu_model', models.CharField(help_text='the GPU model as its nodes\' label nvidia.com/gpu.product says it, e.g. NVIDIA-H100-80GB-HBM3', max_length=63, unique=True)),
                ('price_per_gpu_hour', models.DecimalField(decimal_places=4, help_text='what one GPU-hour of this model costs, in the currency SAVINGS_CURRENCY names (0 or more)', max_digits=12)),
                ('updated_at', models.DateTimeField(help_text='when the price was last set (in the panel or a command)')),
            ],
            options={
                'verbose_name': 'GPU price',
                'verbose_name_plural': 'GPU prices',
                'ordering': ['gpu_model'],
            },
        ),
    ]
