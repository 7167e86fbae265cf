"""One pass of a campaign: take up an abort, cordon what is not cordoned yet, follow the
running defrag jobs (safe, drained, or dropped with the reason), start the next nodes within
the budgets, and end the campaign when every node is done with (returning the kept-empty
nodes). Every act is recorded as it is done, so a pass cut short is simply done again."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.errors import KubeError
from config import clock
from config.actors import acting_as, actor_label_current

from capacity.campaigns.models import FREED_FINAL_STATES, Campaign, CampaignNode, CampaignState, NodeRole, NodeState
from capacity.campaigns.services.budgets import node_start_verdict, replacements_unschedulable
from capacity.campaigns.services.cordons import node_cordon, node_release
from capacity.campaigns.services.record import StaleCampaign, _commit, _gateway, _loaded
from capacity.defrag.models import JobState
from capacity.defrag.services import DefragError, defrag_job_abort, defrag_job_drain, defrag_job_start

log = logging.getLogger(__name__)

# Backoff after an API failure inside a pass, seconds (the gateway already retried).
ERROR_RETRY_SECONDS = 5.0
# Job states that end a node's part in the campaign as dropped (the job cannot free it).
_JOB_DROPS = (JobState.FAILED, JobState.BLOCKED, JobState.ABORTING, JobState.ABORT_STUCK, JobState.ABORTED)


def campaign_step(*, campaign: Campaign, gateway: kube.KubeGateway | None = None, now: datetime | None = None,
                  enqueue: bool = True) -> Campaign:
    """One pass over the campaign from what the database says now; returns it (saved).

    `enqueue`: hand the defrag jobs it starts, drains or aborts to workers (the CLI steps them
    itself). API failures are recorded on the campaign and retried on a later pass."""
    now = now or clock.now()
    campaign.refresh_from_db()
    _loaded(campaign)
    gateway = _gateway(campaign, gateway)
    # A worker acts for whoever started the campaign: the defrag jobs it starts carry their label.
    with acting_as(actor_label_current() or campaign.requested_by_label):
        try:
            if campaign.state == CampaignState.RUNNING and campaign.abort_requested_at is not None:
                campaign.state = CampaignState.ABORTING
                _commit(campaign, fields=["state"], now=now)
            if campaign.state == CampaignState.ABORTING:
                _abort_pass(campaign, gateway, now, enqueue)
            elif campaign.state == CampaignState.RUNNING:
                _run_pass(campaign, gateway, now, enqueue)
        except StaleCampaign as exc:
            log.info("%s: re-reading", exc)
        except KubeError as exc:
            campaign.refresh_from_db()
            _loaded(campaign)
            campaign.error = f"{exc} (retrying in {ERROR_RETRY_SECONDS:g}s)"
            campaign.next_check_at = now + timedelta(seconds=ERROR_RETRY_SECONDS)
            try:
                _commit(campaign, now=now)
            except StaleCampaign:
                pass
    campaign.refresh_from_db()
    return campaign


def _rows(campaign: Campaign) -> list[CampaignNode]:
    return list(campaign.nodes.select_related("job").order_by("position"))


def _run_pass(campaign: Campaign, gateway: kube.KubeGateway, now: datetime, enqueue: bool) -> None:
    rows = _rows(campaign)
    # IMPORTANT: every node of the campaign is cordoned before any job starts, so no
    # replacement lands on a node the campaign frees and no pod moves twice.
    for row in rows:
        if row.state == NodeState.PLANNED:
            node_cordon(campaign, row, gateway, now)
    freed = [r for r in rows if r.role == NodeRole.FREED]
    for row in freed:
        if row.state == NodeState.RUNNING:
            _follow(campaign, row, gateway, now, enqueue)
    in_flight = sum(1 for r in freed if r.state == NodeState.RUNNING)
    for row in freed:
        if in_flight >= campaign.max_in_flight:
            break
        if row.state == NodeState.CORDONED and _start(campaign, row, gateway, now, enqueue):
            in_flight += 1
    if all(r.state in FREED_FINAL_STATES for r in freed):
        return _done(campaign, rows, gateway, now)
    campaign.error = ""
    campaign.next_check_at = now + timedelta(seconds=settings.CAPACITY_CAMPAIGN_POLL_SECONDS)
    _commit(campaign, now=now)


def _follow(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime, enqueue: bool) -> None:
    """A running node's defrag job, looked at: safe (or drained), dropped, or still on its way."""
    job = row.job
    job.refresh_from_db()
    if row.dropped_reason:                      # a drop begun by a pass that did not finish it
        return _drop(campaign, row, gateway, now, row.dropped_reason, enqueue)
    if job.state == JobState.SAFE and campaign.drain_when_safe:
        if job.drain_requested_at is None and not job.abort_pending:
            defrag_job_drain(job=job, actor=campaign.requested_by, delete_node=False, enqueue=enqueue)
        return None
    if job.state in (JobState.SAFE, JobState.DRAINED) and not job.abort_pending:
        row.state = NodeState.SAFE if job.state == JobState.SAFE else NodeState.DRAINED
        _commit(campaign, nodes=[row], now=now, audits=[dict(
            action=f"node_{row.state}", target=f"Node/{row.node_name}", new={"job": job.pk})])
        return None
    if job.state in _JOB_DROPS or job.abort_pending:
        said = f": {job.error}" if job.error else ""
        return _drop(campaign, row, gateway, now, f"its defrag job #{job.pk} is {job.get_state_display()}{said}",
                     enqueue)
    if job.state == JobState.WAITING:
        why = replacements_unschedulable(job, gateway)
        if why:
            return _drop(campaign, row, gateway, now, why, enqueue)
    return None


def _drop(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime, reason: str,
          enqueue: bool) -> None:
    """Take a node out of the campaign: its job aborted through the defrag abort, the
    campaign's cordon lifted, the reason recorded. The reason is written first: a pass cut
    short finishes the drop with the same reason."""
    if not row.dropped_reason:
        row.dropped_reason = reason
        _commit(campaign, nodes=[row], now=now)
    job = row.job
    if job is not None:
        job.refresh_from_db()
        if job.is_live and job.state != JobState.ABORTING and not job.abort_pending:
            try:
                defrag_job_abort(job=job, actor=campaign.requested_by, now=now, enqueue=enqueue)
            except DefragError as exc:      # drained meanwhile: nothing left to abort
                log.info("campaign %s: job %s not aborted: %s", campaign.pk, job.pk, exc)
    node_release(campaign, row, gateway, now, state=NodeState.DROPPED)


def _start(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime, enqueue: bool) -> bool:
    """Start the node's defrag job if nothing holds it back now; True when it started."""
    verdict = node_start_verdict(campaign, row, gateway, now)
    if verdict.drop:
        _drop(campaign, row, gateway, now, verdict.drop, enqueue)
        return False
    if verdict.wait:
        if row.waiting_reason != verdict.wait:
            row.waiting_reason = verdict.wait
            _commit(campaign, nodes=[row], now=now, audits=[dict(
                action="node_wait", target=f"Node/{row.node_name}", new={"reason": verdict.wait})])
        return False
    try:
        # The job and the row that names it are one record: a worker killed between the two
        # cannot leave a job the campaign does not know (nor start it twice).
        with transaction.atomic():
            job = defrag_job_start(cluster=campaign.cluster, node_name=row.node_name, plan=verdict.plan,
                                   actor=campaign.requested_by, now=now, enqueue=enqueue,
                                   on_behalf_of=f"campaign #{campaign.pk}")
            row.job, row.state, row.waiting_reason = job, NodeState.RUNNING, ""
            _commit(campaign, nodes=[row], now=now, audits=[dict(
                action="node_start", target=f"Node/{row.node_name}", new={"job": job.pk})])
    except DefragError as exc:
        row.refresh_from_db()
        _drop(campaign, row, gateway, now, str(exc), enqueue)
        return False
    return True


def _done(campaign: Campaign, rows: list[CampaignNode], gateway: kube.KubeGateway, now: datetime) -> None:
    """Every freed node is safe, drained or dropped: the kept-empty nodes go back to service."""
    for row in rows:
        if row.role == NodeRole.KEPT_EMPTY and row.state != NodeState.RETURNED:
            node_release(campaign, row, gateway, now, state=NodeState.RETURNED)
    freed = [r for r in rows if r.role == NodeRole.FREED]
    campaign.state, campaign.finished_at, campaign.next_check_at, campaign.error = (
        CampaignState.DONE, now, None, "")
    _commit(campaign, fields=["state", "finished_at"], now=now, audits=[dict(
        action="campaign_done", target=f"campaign #{campaign.pk}",
        new={state: [r.node_name for r in freed if r.state == state]
             for state in (NodeState.SAFE, NodeState.DRAINED, NodeState.DROPPED)})])


def _abort_pass(campaign: Campaign, gateway: kube.KubeGateway, now: datetime, enqueue: bool) -> None:
    """End the campaign: every live job of it aborted, every cordon it laid lifted; a node not
    started is never touched again. Drained nodes stay as their drain left them."""
    actor, label = campaign.abort_requested_by, campaign.abort_requested_label
    for row in _rows(campaign):
        if row.state in (NodeState.DROPPED, NodeState.ABORTED, NodeState.RETURNED, NodeState.DRAINED):
            continue
        job = row.job
        if job is not None:
            job.refresh_from_db()
            if job.is_live and job.state != JobState.ABORTING and not job.abort_pending:
                try:
                    defrag_job_abort(job=job, actor=actor, now=now, enqueue=enqueue)
                except DefragError as exc:
                    log.info("campaign %s: job %s not aborted: %s", campaign.pk, job.pk, exc)
        node_release(campaign, row, gateway, now, actor=actor, label=label,
                     state=NodeState.RETURNED if row.role == NodeRole.KEPT_EMPTY else NodeState.ABORTED)
    campaign.state, campaign.finished_at, campaign.next_check_at, campaign.error = (
        CampaignState.ABORTED, now, None, "")
    _commit(campaign, fields=["state", "finished_at"], now=now, audits=[dict(
        action="campaign_abort", target=f"campaign #{campaign.pk}", actor=actor, label=label)])
