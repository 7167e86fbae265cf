"""A campaign from the operator's side: start it from the plan they confirmed, or ask for its
abort (taken up by the next step)."""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.services import cluster_lock
from config import clock
from config.actors import actor_label_current

from capacity.campaigns.models import Campaign, CampaignNode, CampaignState, NodeRole
from capacity.campaigns.planning import CampaignPlan, pool_selector_text
from capacity.campaigns.selectors import campaign_held_nodes, campaign_plan_read
from capacity.campaigns.services.record import CampaignError, _audit, _enqueue


def _changed(confirmed: CampaignPlan, fresh: CampaignPlan) -> str:
    """What moved between the plan the operator confirmed and the cluster now, in one line."""
    why = {o.node: o.why for o in fresh.left_out}
    parts = []
    gone = [n for n in confirmed.node_names if n not in fresh.node_names]
    if gone:
        parts.append("no longer freed: " + "; ".join(f"{n} ({why.get(n, 'not in the pool now')})" for n in gone))
    new = [n for n in fresh.node_names if n not in confirmed.node_names]
    if new:
        parts.append(f"freed now too: {', '.join(new)}")
    if not gone and not new and fresh.node_names != confirmed.node_names:
        parts.append(f"order now {', '.join(fresh.node_names)}")
    if fresh.kept_empty != confirmed.kept_empty:
        parts.append(f"kept empty now: {', '.join(fresh.kept_empty) or 'none'} "
                     f"(confirmed: {', '.join(confirmed.kept_empty) or 'none'})")
    return "; ".join(parts)


def campaign_start(*, cluster, plan: CampaignPlan, actor, max_in_flight: int, drain_when_safe: bool = False,
                   now: datetime | None = None, gateway: kube.KubeGateway | None = None, enqueue: bool = True,
                   source: str = "cli") -> Campaign:
    """Start the campaign the operator confirmed (`plan`) and hand it to a worker.

    The cluster is read again first: the campaign starts only if a fresh plan frees the same
    nodes in the same order and keeps the same nodes empty; otherwise nothing is started and
    the error says what changed (the operator plans again and confirms what is true now). A
    node a live defrag job or another campaign holds is never part of a fresh plan."""
    now = now or clock.now()
    limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise CampaignError(f"the nodes emptied at once (max in flight) must be a whole number, 1 or more, "
                            f"not {max_in_flight!r}")
    if max_in_flight > limit:
        raise CampaignError(f"max in flight {max_in_flight} is more than the defrag jobs the cluster may run at "
                            f"once ({limit}, CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
    if drain_when_safe and actor is not None and not actor.has_perm("capacity.drain_defragjob"):
        raise CampaignError(f"user {actor} may not drain nodes (needs capacity.drain_defragjob): "
                            "start without drain when safe")
    if not plan.nodes:
        raise CampaignError(f"the plan frees no node of pool {pool_selector_text(plan.selector)}: nothing to start")
    fresh = campaign_plan_read(cluster=cluster, selector=plan.selector, goal=plan.goal, scoring=plan.scoring,
                               gateway=gateway, now=now)
    changed = _changed(plan, fresh)
    if changed:
        raise CampaignError(f"the cluster changed since the plan was shown, so nothing was started: {changed}. "
                            "Plan again and confirm the new plan.")
    with transaction.atomic():
        cluster_lock(cluster=cluster)   # two starts at once cannot both take a node
        held = campaign_held_nodes(cluster=cluster)
        taken = [f"{n} ({held[n]})" for n in (*fresh.node_names, *fresh.kept_empty) if n in held]
        if taken:
            raise CampaignError(f"nodes held since the plan was read, so nothing was started: {', '.join(taken)}")
        campaign = Campaign.objects.create(
            cluster=cluster, selector=dict(fresh.selector), goal=fresh.goal, max_in_flight=max_in_flight,
            drain_when_safe=drain_when_safe, plan=fresh.to_dict(), source=source, requested_by=actor,
            created_at=now)
        CampaignNode.objects.bulk_create(
            [CampaignNode(campaign=campaign, node_name=n.node, position=n.position) for n in fresh.nodes]
            + [CampaignNode(campaign=campaign, node_name=name, role=NodeRole.KEPT_EMPTY,
                            position=len(fresh.nodes) + i) for i, name in enumerate(fresh.kept_empty, start=1)])
        _audit(campaign, now=now, action="campaign_start", target=f"pool {pool_selector_text(fresh.selector)}",
               new={"nodes": list(fresh.node_names), "kept_empty": list(fresh.kept_empty), "goal": fresh.goal,
                    "max_in_flight": max_in_flight, "drain_when_safe": drain_when_safe,
                    "pods_moved": fresh.pods_moved, "source": source})
    if enqueue:
        _enqueue(campaign)
    return campaign


def campaign_abort(*, campaign: Campaign, actor, now: datetime | None = None, enqueue: bool = True) -> Campaign:
    """Ask for the end of the whole campaign: the next step aborts every live defrag job of it
    (through the defrag abort), lifts every cordon the campaign laid, and starts nothing more.
    Asked again, or of an aborted campaign, it changes nothing."""
    now = now or clock.now()
    with transaction.atomic():
        row = Campaign.objects.select_for_update().get(pk=campaign.pk)
        if row.state == CampaignState.DONE:
            raise CampaignError(f"campaign #{row.pk} is done: nothing of it is running. Its safe nodes stay cordoned "
                                "until drained or returned to service through their defrag jobs")
        if row.state in (CampaignState.ABORTED, CampaignState.ABORTING) or row.abort_requested_at is not None:
            return row
        label = "" if actor is not None else actor_label_current()
        Campaign.objects.filter(pk=row.pk).update(abort_requested_at=now, abort_requested_by=actor,
                                                  abort_requested_label=label)
        _audit(row, now=now, action="abort_request", target=f"campaign #{row.pk}", actor=actor, label=label,
               old={"state": row.state})
    if enqueue:
        _enqueue(row)
    row.refresh_from_db()
    return row
