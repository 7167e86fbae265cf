"""The savings page has no table of its own: it is computed from what the other apps
record. This proxy puts "Savings" in the admin menu, one row per cluster."""
from __future__ import annotations

from clusters.models import Cluster


class SavingsCluster(Cluster):
    class Meta:
        proxy = True
        verbose_name = "savings of a cluster"
        verbose_name_plural = "savings per cluster"
