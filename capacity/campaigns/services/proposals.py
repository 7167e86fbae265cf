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
from orgs.planning import HELD_EXEMPT, HELD_SNOOZED
from orgs.selectors import prune_holds

from capacity.campaigns.models import CampaignProposal
from capacity.campaigns.pools import proposals_plan, workload_holds
from capacity.selectors import defrag_jobs_live_by_node

if TYPE_CHECKING:
    from clusters.models import Cluster

_HOLD_WORDS = {HELD_EXEMPT: "exempt by an operator", HELD_SNOOZED: "snoozed by an operator"}


def campaign_proposals_compute(*, cluster: Cluster, now: datetime,
                               gateway: kube.KubeGateway | None = None) -> list[CampaignProposal]:
    """Read the cluster once (its GPU nodes and their pods) and write the best campaign of
    each of its GPU pools, with the nodes live defrag jobs hold and the workloads the orgs
    exempt or snooze kept out. A pool whose plan is the one its latest proposal already
    holds only moves that proposal's time forward. Raises the gateway's errors (nothing
    written then)."""
    snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now, gpu_nodes_only=True)
    kept = prune_holds(cluster=cluster, namespaces={p.namespace for p in snapshot.pods}, now=now)
    holds = workload_holds(snapshot, namespaces={ns: _HOLD_WORDS.get(w, w) for ns, w in kept.namespaces.items()},
                           owners={key: _HOLD_WORDS.get(w, w) for key, w in kept.owners.items()})
    scoring = settings.CAPACITY_SCHEDULER_SCORING
    proposals = proposals_plan(snapshot, held_nodes=set(defrag_jobs_live_by_node(cluster=cluster)), holds=holds,
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
