"""A campaign and its defrag jobs stepped in this process on a clock the caller moves: what
workers do between them, pass after pass, with the clock fast-forwarded by the poll
interval between two passes instead of waited out. A rehearsal runs a campaign so on the
copy of a cluster, whose simulated clock it owns."""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from clusters import kube

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign
from capacity.campaigns.services.step import campaign_step
from capacity.defrag.models import LIVE_STATES, DefragJob
from capacity.defrag.services import defrag_job_step


def campaign_pass(*, campaign: Campaign, gateway: kube.KubeGateway, now: datetime) -> Campaign:
    """One pass of the campaign, then one step of each of its live defrag jobs, all at `now`."""
    campaign = campaign_step(campaign=campaign, gateway=gateway, now=now, enqueue=False)
    for job in DefragJob.objects.filter(campaign_nodes__campaign=campaign, state__in=LIVE_STATES).order_by("pk"):
        defrag_job_step(job=job, gateway=gateway, now=now)
    return campaign


def campaign_drive(*, campaign: Campaign, gateway: kube.KubeGateway, now: Callable[[], datetime],
                   advance: Callable[[float], object], poll_seconds: float, max_seconds: float,
                   until: Callable[[Campaign], bool] | None = None,
                   after_pass: Callable[[Campaign], None] | None = None) -> Campaign:
    """Pass over the campaign (`campaign_pass`) at `now()`, then `advance(poll_seconds)` the
    clock, until the campaign is no longer live (or `until(campaign)` holds) or `max_seconds`
    of that clock have gone by. Returns the campaign as it stands then: still live when the
    time ran out. `after_pass(campaign)` is called after each pass."""
    started = now()
    while True:
        campaign = campaign_pass(campaign=campaign, gateway=gateway, now=now())
        if after_pass is not None:
            after_pass(campaign)
        if until(campaign) if until is not None else campaign.state not in LIVE_CAMPAIGN_STATES:
            return campaign
        if (now() - started).total_seconds() >= max_seconds:
            return campaign
        advance(poll_seconds)
