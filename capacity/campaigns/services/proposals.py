"""Writes of campaign proposals: the schedule reads a cluster once and proposes the best
campaign of each of its GPU pools (capacity/campaigns/pools.py).

Nothing here touches a workload: a proposal is advice an operator may act on with
`consolidate`. So it is written without an audit entry, replaced as the cluster changes,
and its history is dropped after `CAPACITY_CAMPAIGN_PROPOSAL_DAYS` (a pool's latest
proposal stays, however old, until the next reading of its cluster replaces it).
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.selectors import snapshot_take

from capacity.campaigns.models import CampaignProposal
from capacity.campaigns.pools import proposals_plan
from capacity.campaigns.selectors import campaign_held_nodes, campaign_holds

if TYPE_CHECKING:
    from clusters.models import Cluster


def campaign_proposals_compute(*, cluster: Cluster, now: datetime,
                               gateway: kube.KubeGateway | None = None) -> list[CampaignProposal]:
    """Read the cluster once (its GPU nodes and their pods) and write the best campaign of
    each of its GPU pools, with the nodes live defrag jobs and campaigns hold and the
    workloads the orgs exempt or snooze kept out (as `consolidate` plans it). A pool whose
    plan is the one its latest proposal already holds only moves that proposal's time forward. Raises the gateway's errors (nothing
    written then)."""
    snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now, gpu_nodes_only=True)
    holds = campaign_holds(cluster=cluster, pods=snapshot.pods, now=now)
    scoring = settings.CAPACITY_SCHEDULER_SCORING
    proposals = proposals_plan(snapshot, held_nodes=set(campaign_held_nodes(cluster=cluster)), holds=holds,
                               scoring=scoring)
    del snapshot
    rows: list[CampaignProposal] = []
    with transaction.atomic():
        for proposal in proposals:
            plan = proposal.plan
            data = json.loads(json.dumps(plan.to_dict()))   # as the JSON column gives it back
            latest = (CampaignProposal.objects.filter(cluster=cluster, pool=proposal.pool)
                      .order_by("-computed_at", "-pk").first())
            if latest is not None and latest.plan == data and latest.computed_at <= now:
                latest.computed_at = now
                latest.save(update_fields=["computed_at"])
                rows.append(latest)
                continue
            rows.append(CampaignProposal.objects.create(
                cluster=cluster, pool=proposal.pool, selector=dict(plan.selector), scoring=scoring, computed_at=now,
                plan=data, freed=plan.freed, gpus_freed=plan.gpus_freed, pods_moved=plan.pods_moved,
                lower_bound=plan.lower_bound))
        cutoff = now - timedelta(days=settings.CAPACITY_CAMPAIGN_PROPOSAL_DAYS)
        CampaignProposal.objects.filter(cluster=cluster, computed_at__lt=cutoff).exclude(
            pk__in=[r.pk for r in rows]).delete()
    return rows
