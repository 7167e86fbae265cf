"""The savings page is computed from what the other apps record: `SavingsCluster` puts
"Savings" in the admin menu, one row per cluster. `GpuPrice` is the one table of its own:
what a GPU-hour of each GPU model costs, so the page can show savings in money."""
from __future__ import annotations

from django.db import models

from clusters.models import Cluster


class SavingsCluster(Cluster):
    class Meta:
        proxy = True
        verbose_name = "savings of a cluster"
        verbose_name_plural = "savings per cluster"


class GpuPrice(models.Model):
    """A price per GPU-hour of one GPU model, in the currency `SAVINGS_CURRENCY` names. A GPU
    model without a row has no price: its savings are shown in GPU-hours only, never as 0."""

    gpu_model = models.CharField(
        max_length=63, unique=True,
        help_text="the GPU model as its nodes' label nvidia.com/gpu.product says it, e.g. NVIDIA-H100-80GB-HBM3")
    price_per_gpu_hour = models.DecimalField(
        max_digits=12, decimal_places=4,
        help_text="what one GPU-hour of this model costs, in the currency SAVINGS_CURRENCY names (0 or more)")
    updated_at = models.DateTimeField(help_text="when the price was last set (in the panel or a command)")

    class Meta:
        ordering = ["gpu_model"]
        verbose_name = "GPU price"
        verbose_name_plural = "GPU prices"

    def __str__(self) -> str:
        return f"{self.gpu_model}: {self.price_per_gpu_hour} per GPU-hour"
