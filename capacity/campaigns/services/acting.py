"""The schedule acting on its proposals: after the proposals of a cluster are written, each
pool whose operator enabled a policy (capacity/campaigns/policy.py) may have its proposed
campaign started, inside the policy's window and within its node budget.

One automatic campaign per cluster at a time, and none while another campaign is live or
the cluster's defrag jobs are at their limit: the decision is taken under the cluster's row
lock, as `campaign_start` counts. The start goes through `campaign_start`, which re-reads
the cluster and refuses a plan that is no longer true; a refusal is logged and audited and
the proposal is not tried again (the next proposal that differs may be). Every act is
audited (subject campaign_policy) with the proposal it came from and the policy's terms.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from audit.services import audit
from clusters import kube
from clusters.services import cluster_lock
from config.actors import acting_as

from capacity.campaigns.models import AUTO_ACTOR_LABEL, CampaignPolicy, CampaignProposal
from capacity.campaigns.planning import CampaignInputError, pool_selector_text
from capacity.campaigns.policy import ActDecision, act_decide, window_words
from capacity.campaigns.selectors import (
    campaign_auto_last_start,
    campaign_plan_read,
    campaigns_live_ids,
)
from capacity.campaigns.services.record import CampaignError
from capacity.campaigns.services.start import campaign_start
from capacity.defrag.models import RUNNING_STATES, DefragJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolAct:
    """What the schedule did with one pool's proposal under its policy."""

    pool: str
    decision: ActDecision
    campaign_id: int | None = None
    refused: str = ""


def schedule_label(policy: CampaignPolicy) -> str:
    """Who acts: the schedule, under the pool's policy (the audit's and the campaign's label)."""
    return f"{AUTO_ACTOR_LABEL}{policy.pk}"


def campaign_proposals_act(*, cluster, proposals: list[CampaignProposal], now: datetime,
                           gateway: kube.KubeGateway | None = None) -> list[PoolAct]:
    """Apply each enabled pool policy to its pool's new proposal, largest proposal first;
    at most one campaign starts. Pools without a policy, or with it disabled, are left alone."""
    policies = {row.selector: row for row in CampaignPolicy.objects.filter(cluster=cluster, enabled=True)}
    acts: list[PoolAct] = []
    for proposal in sorted(proposals, key=lambda row: (-row.freed, row.pool)):
        policy = policies.get(pool_selector_text(proposal.selector))
        if policy is None:
            continue
        act = _act(cluster=cluster, policy=policy, proposal=proposal, now=now, gateway=gateway)
        acts.append(act)
        log.info("campaign policy #%s, pool %s, proposal #%s: %s%s", policy.pk, proposal.pool, proposal.pk,
                 act.decision.why, f" (refused: {act.refused})" if act.refused else "")
        if act.campaign_id is not None:
            break   # one automatic campaign per cluster at a time
    return acts


def _act(*, cluster, policy: CampaignPolicy, proposal: CampaignProposal, now: datetime,
         gateway: kube.KubeGateway | None) -> PoolAct:
    plan = proposal.campaign
    with transaction.atomic():
        cluster_lock(cluster=cluster)   # IMPORTANT: before counting live campaigns and running jobs
        policy = CampaignPolicy.objects.select_for_update().get(pk=policy.pk)   # as the operator left it
        decision = act_decide(
            terms=policy.terms, proposal_id=proposal.pk, proposal_freed=proposal.freed, pool_nodes=plan.pool_nodes,
            now=now, live_campaigns=campaigns_live_ids(cluster=cluster),
            defrag_jobs_running=DefragJob.objects.filter(cluster=cluster, state__in=RUNNING_STATES).count(),
            defrag_job_limit=settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER,
            last_start_at=campaign_auto_last_start(cluster=cluster, selector=dict(proposal.selector)),
            last_tried_proposal=policy.last_act_proposal,
            gap=timedelta(minutes=settings.CAPACITY_CAMPAIGN_AUTO_GAP_MINUTES))
        if not decision.start:
            return PoolAct(pool=proposal.pool, decision=decision)
        window = policy.terms.window(now)
        record = {"proposal": proposal.pk, "proposal_computed_at": proposal.computed_at.isoformat(),
                  "proposal_freed": proposal.freed, "pool": proposal.pool, "policy": policy.pk,
                  "terms": policy.values(), "budget_nodes": decision.budget, "goal": decision.goal,
                  "window_fired_at": window_words(window.fired_at) if window.fired_at else "always open"}
        target = f"pool {policy.selector}"
        label = schedule_label(policy)
        try:
            with acting_as(label):
                if decision.goal < plan.freed:   # the budget frees fewer: plan that many on a fresh reading
                    plan = campaign_plan_read(cluster=cluster, selector=dict(proposal.selector), goal=decision.goal,
                                              scoring=plan.scoring, gateway=gateway, now=now)
                campaign = campaign_start(cluster=cluster, plan=plan, actor=None, max_in_flight=policy.max_in_flight,
                                          drain_when_safe=policy.drain_when_safe, now=now, gateway=gateway,
                                          source=f"proposal:{proposal.pk}")
        except (CampaignError, CampaignInputError) as exc:
            refused = str(exc)
            log.warning("campaign policy #%s: proposal #%s of pool %s was not started: %s", policy.pk, proposal.pk,
                        proposal.pool, refused)
            audit(app="campaigns", action="campaign_auto_refused", at=now, cause=f"proposal #{proposal.pk}",
                  target=target, cluster_id=cluster.pk, subject=("campaign_policy", policy.pk),
                  new={**record, "refused": refused}, actor_label=label)
            _last_act(policy, now=now, proposal=proposal, text=f"proposal #{proposal.pk} refused: {refused}")
            return PoolAct(pool=proposal.pool, decision=decision, refused=refused)
        audit(app="campaigns", action="campaign_auto_start", at=now, cause=f"proposal #{proposal.pk}",
              target=target, cluster_id=cluster.pk, subject=("campaign_policy", policy.pk),
              new={**record, "campaign": campaign.pk, "nodes": list(plan.node_names)}, actor_label=label)
        _last_act(policy, now=now, proposal=proposal,
                  text=f"campaign #{campaign.pk} started from proposal #{proposal.pk} ({decision.why})")
        return PoolAct(pool=proposal.pool, decision=decision, campaign_id=campaign.pk)


def _last_act(policy: CampaignPolicy, *, now: datetime, proposal: CampaignProposal, text: str) -> None:
    # Not a change of the operator's settings: changed_by and changed_at stay theirs.
    CampaignPolicy.objects.filter(pk=policy.pk).update(last_act_at=now, last_act_proposal=proposal.pk,
                                                       last_act=text[:500])
