"""Campaign tasks: passes under a lease, the resume beat, and the scheduled proposals. Named `capacity.tasks.…` as the
defrag tasks are (config/queues.py routes them by these names)."""
from __future__ import annotations

import logging
import os
import socket
import time

from celery import shared_task

from clusters.fanout import cluster_for_task, clusters_fan_out
from config import clock
from config.leases import LeaseHeartbeat, task_lease_owner
from config.retries import RetryTransient

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign
from capacity.campaigns.selectors import campaigns_due
from capacity.campaigns.services import (
    CAMPAIGN_RUN_TASK,
    campaign_lease_acquire,
    campaign_lease_release,
    campaign_lease_renew,
    campaign_proposals_act,
    campaign_proposals_compute,
    campaign_step,
)

log = logging.getLogger(__name__)

# A run stops after this many seconds of wall time and re-queues itself: a killed worker
# loses at most this much, well inside the campaign's 30 s lease.
STEP_BUDGET_SECONDS = 15.0
# How often a running pass renews the campaign's lease (seconds), from a thread of its own
# so that a pass blocked in slow API calls (each request may wait 30 s, the gateway retries)
# keeps the campaign: a third of LEASE_SECONDS, so two renewals may fail before it lapses.
HEARTBEAT_SECONDS = 10.0
# The longest a campaign's next pass is queued ahead (seconds): below the visibility timeout.
MAX_COUNTDOWN_SECONDS = 60.0


def _pause(campaign: Campaign) -> float:
    if campaign.next_check_at is None:
        return 0.0
    return max(0.0, (campaign.next_check_at - clock.now()).total_seconds())


@shared_task(name=CAMPAIGN_RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def campaign_run(self, campaign_id: int) -> str:
    """Pass over the campaign for a short while under its lease, then hand it back to the
    queue. Its defrag jobs are stepped by their own tasks (queued by the passes)."""
    owner = task_lease_owner(self)
    if not campaign_lease_acquire(campaign_id=campaign_id, owner=owner, now=clock.now()):
        return "leased"
    log.info("campaign %s: stepped by %s on %s pid %s", campaign_id, owner, socket.gethostname(), os.getpid())
    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        return "missing"
    started = time.monotonic()
    try:
        with _heartbeat(campaign_id=campaign_id, owner=owner) as heartbeat:
            while True:
                campaign = campaign_step(campaign=campaign, now=clock.now())
                if campaign.state not in LIVE_CAMPAIGN_STATES:
                    return campaign.state
                if heartbeat.lost.is_set() or not campaign_lease_renew(campaign_id=campaign_id, owner=owner,
                                                                       now=clock.now()):
                    return "lease lost"
                pause = _pause(campaign)
                if pause > STEP_BUDGET_SECONDS - (time.monotonic() - started):
                    break
                time.sleep(pause)
    finally:
        campaign_lease_release(campaign_id=campaign_id, owner=owner)
    campaign_run.apply_async((campaign_id,), countdown=min(_pause(campaign), MAX_COUNTDOWN_SECONDS))
    return campaign.state


def _heartbeat(*, campaign_id: int, owner: str) -> LeaseHeartbeat:
    """Renews the campaign's lease every HEARTBEAT_SECONDS while a pass runs; its `lost` is
    set once another worker took the campaign (the task then stops after its pass)."""
    return LeaseHeartbeat(renew=lambda: campaign_lease_renew(campaign_id=campaign_id, owner=owner, now=clock.now()),
                          every_seconds=HEARTBEAT_SECONDS, name=f"campaign-lease-{campaign_id}")


@shared_task(name="capacity.tasks.campaigns_resume", ignore_result=True)
def campaigns_resume() -> int:
    """Every 10 s (config/schedule.py): re-queue each live campaign no worker holds whose
    next pass is due (its lease lapsed, or its queued message was lost)."""
    due = campaigns_due(now=clock.now())
    for campaign_id in due:
        campaign_run.delay(campaign_id)
    return len(due)


# ---- proposals: beat fans out one task per cluster; each reads its cluster once and proposes
# the best campaign of every GPU pool (capacity/campaigns/services/proposals.py), then starts
# one where a pool's policy says so (services/acting.py). A transient
# failure is retried with back-off; either way the pool's last proposal stays, and the pages
# say its age.

@shared_task(name="capacity.campaigns.tasks.campaign_proposals_all")
def campaign_proposals_all() -> int:
    return clusters_fan_out(campaign_proposals_cluster)


@shared_task(name="capacity.campaigns.tasks.campaign_proposals_cluster", base=RetryTransient, retry_backoff=30,
             retry_backoff_max=300, max_retries=3)
def campaign_proposals_cluster(cluster_id: int) -> dict | None:
    cluster = cluster_for_task(cluster_id, job="campaign proposals")
    if cluster is None:
        return None
    now = clock.now()
    rows = campaign_proposals_compute(cluster=cluster, now=now)
    # Then each pool whose operator enabled a policy may start its proposal (at most one).
    campaign_proposals_act(cluster=cluster, proposals=rows, now=now)
    return {row.pool: row.freed for row in rows}
