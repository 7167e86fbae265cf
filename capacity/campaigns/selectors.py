"""Campaign reads: the nodes live defrag jobs and campaigns hold, the workloads the product
exempts or snoozes (as the planner takes them), the campaigns a worker should step, and a
campaign's progress as the CLI prints it."""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import Max, Q

from clusters import kube
from clusters.selectors import snapshot_take
from clusters.snapshot import PodView
from orgs.selectors import prune_holds

from capacity.campaigns.models import (
    AUTO_ACTOR_LABEL,
    LIVE_CAMPAIGN_STATES,
    Campaign,
    CampaignNode,
    CampaignPolicy,
    CampaignProposal,
    NodeRole,
)
from capacity.campaigns.planning import CampaignPlan, campaign_plan, pool_selector_text, selects
from capacity.campaigns.pools import gpu_pools, workload_holds
from capacity.defrag.models import LIVE_STATES, DefragJob


def campaign_held_nodes(*, cluster, exclude: int | None = None) -> dict[str, str]:
    """node → who holds it: a live defrag job, or another live campaign (`exclude`: this one)."""
    held = {node: f"defrag job #{pk}" for node, pk in DefragJob.objects.filter(
        cluster=cluster, state__in=LIVE_STATES).values_list("node_name", "pk")}
    rows = CampaignNode.objects.filter(campaign__cluster=cluster, campaign__state__in=LIVE_CAMPAIGN_STATES)
    if exclude is not None:
        rows = rows.exclude(campaign_id=exclude)
    for node, pk in rows.values_list("node_name", "campaign_id"):
        held.setdefault(node, f"campaign #{pk}")
    return held


def campaign_holds(*, cluster, pods: Iterable[PodView], now: datetime) -> dict[tuple[str, str], str]:
    """(namespace, workload) → why it stays, for the workloads of `pods`: each model or pynode
    exempted or snoozed now, and every one of an org exempted or snoozed now. What the
    proposals, a campaign's plan and its nodes' checks all go by."""
    pods = list(pods)
    kept = prune_holds(cluster=cluster, namespaces={p.namespace for p in pods}, now=now)
    return workload_holds(pods, namespaces=kept.namespaces, owners=kept.owners)


def campaigns_due(*, now: datetime) -> list[int]:
    """Live campaigns a worker should step and none does: no live lease, next step due, on a
    cluster in service."""
    unleased = Q(lease_owner="") | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    due = Q(next_check_at__isnull=True) | Q(next_check_at__lte=now)
    return list(Campaign.objects.filter(unleased & due, state__in=LIVE_CAMPAIGN_STATES,
                                        cluster__retired_at__isnull=True).order_by("pk").values_list("pk", flat=True))


def campaign_nodes(*, campaign: Campaign, role: str = NodeRole.FREED) -> list[CampaignNode]:
    return list(campaign.nodes.filter(role=role).select_related("job").order_by("position"))


def campaign_progress(*, campaign: Campaign) -> dict:
    """The campaign as the CLI's --json prints it and the panel follows it."""
    return {
        "campaign": campaign.pk, "state": campaign.state, "error": campaign.error,
        "progress": [{"node": n.node_name, "position": n.position, "state": n.state_now,
                      "job": n.job_id, "job_state": n.job.state if n.job else None,
                      "cordoned_by_campaign": n.cordoned_by_campaign, "waiting": n.waiting_reason,
                      "dropped_reason": n.dropped_reason} for n in campaign_nodes(campaign=campaign)],
        "kept_empty_progress": [{"node": n.node_name, "state": n.state, "cordoned_by_campaign": n.cordoned_by_campaign}
                                for n in campaign_nodes(campaign=campaign, role=NodeRole.KEPT_EMPTY)],
    }


def campaign_plan_read(*, cluster, selector, goal: int | None, now: datetime, scoring: str | None = None,
                       gateway: kube.KubeGateway | None = None, exclude: int | None = None) -> CampaignPlan:
    """The campaign plan over the cluster as it is now: a fresh reading, the nodes live defrag
    jobs and other campaigns hold, and the workloads on hold. Raises CampaignInputError for a
    pool or goal that cannot be planned."""
    gateway = gateway or kube.gateway_for(cluster)
    snapshot = snapshot_take(gateway, now=now)
    held = campaign_held_nodes(cluster=cluster, exclude=exclude)
    holds = campaign_holds(cluster=cluster, pods=snapshot.pods, now=now)
    return campaign_plan(snapshot, selector=selector, goal=goal,
                         scoring=scoring or settings.CAPACITY_SCHEDULER_SCORING, held_nodes=set(held), holds=holds)


def proposals_latest(*, cluster: Cluster) -> list[CampaignProposal]:
    """The proposals of the cluster's latest reading, one per pool, by pool name. A pool
    gone from the cluster since an earlier reading is not among them."""
    latest = CampaignProposal.objects.filter(cluster=cluster).aggregate(at=Max("computed_at"))["at"]
    if latest is None:
        return []
    by_pool: dict[str, CampaignProposal] = {}
    for row in (CampaignProposal.objects.filter(cluster=cluster, computed_at=latest).select_related("rehearsal")
                .order_by("pool", "-pk")):
        by_pool.setdefault(row.pool, row)
    return list(by_pool.values())


# ---- policies: when a pool's proposed campaign starts on its own (capacity/campaigns/policy.py)

def campaign_policies(*, cluster) -> dict[str, CampaignPolicy]:
    """The cluster's pool policies by selector text (KEY=VALUE,…), as a proposal's selector reads."""
    return {row.selector: row for row in CampaignPolicy.objects.filter(cluster=cluster)}


def campaign_auto_last_start(*, cluster, selector: dict[str, str]) -> datetime | None:
    """When the pool's latest campaign started on its own (by the schedule, from a proposal), or None."""
    return (Campaign.objects.filter(cluster=cluster, source__startswith="proposal:", selector=selector,
                                    requested_by__isnull=True, requested_by_label__startswith=AUTO_ACTOR_LABEL)
            .order_by("-created_at").values_list("created_at", flat=True).first())


def campaigns_live_ids(*, cluster) -> list[int]:
    return list(Campaign.objects.filter(cluster=cluster, state__in=LIVE_CAMPAIGN_STATES).order_by("pk")
                .values_list("pk", flat=True))


def pool_nodes_read(*, cluster, selector: dict[str, str], now: datetime,
                    gateway: kube.KubeGateway | None = None) -> tuple[list[str], dict[str, str]]:
    """The cluster's GPU nodes the selector selects, and the pools the proposals name
    (pool name → selector text). Raises the gateway's errors."""
    snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now, gpu_nodes_only=True)
    nodes = sorted(n.name for n in snapshot.nodes if selects(selector, n))
    return nodes, {pool: pool_selector_text(sel) for pool, sel in gpu_pools(snapshot).items()}
