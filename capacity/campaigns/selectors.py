"""Reads of campaign proposals for the dashboard and the GPU map."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Max

from capacity.campaigns.models import CampaignProposal

if TYPE_CHECKING:
    from clusters.models import Cluster


def proposals_latest(*, cluster: Cluster) -> list[CampaignProposal]:
    """The proposals of the cluster's latest reading, one per pool, by pool name. A pool
    gone from the cluster since an earlier reading is not among them."""
    latest = CampaignProposal.objects.filter(cluster=cluster).aggregate(at=Max("computed_at"))["at"]
    if latest is None:
        return []
    by_pool: dict[str, CampaignProposal] = {}
    for row in CampaignProposal.objects.filter(cluster=cluster, computed_at=latest).order_by("pool", "-pk"):
        by_pool.setdefault(row.pool, row)
    return list(by_pool.values())
