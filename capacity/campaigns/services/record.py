"""What every campaign step shares: its record (one compare-and-set UPDATE with its node rows
and audit entries), the lease on the campaign, and the errors a request raises."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit
from clusters import kube
from config.actors import actor_label_current
from config.celery import task_send
from config.leases import lease_renew

from capacity.campaigns.models import Campaign, CampaignNode

log = logging.getLogger(__name__)

# The step task's registered name (capacity/campaigns/tasks.py registers it under it).
CAMPAIGN_RUN_TASK = "capacity.tasks.campaign_run"
# A worker owns a campaign through a lease this long (seconds); the step task renews it
# every HEARTBEAT_SECONDS while a pass runs (capacity/campaigns/tasks.py) and after every
# pass, and the 10 s resume beat hands a killed worker's campaign on once it lapses.
LEASE_SECONDS = 30.0


class CampaignError(Exception):
    """A campaign request that cannot be carried out as asked; the message says why."""


class StaleCampaign(Exception):
    """The campaign changed in the database since this step loaded it (an abort asked, or
    another runner's record): nothing of this step was recorded; re-read and decide again."""


def _gateway(campaign_or_cluster, gateway: kube.KubeGateway | None) -> kube.KubeGateway:
    if gateway is not None:
        return gateway
    cluster = campaign_or_cluster.cluster if isinstance(campaign_or_cluster, Campaign) else campaign_or_cluster
    return kube.gateway_for(cluster)


def _audit(campaign: Campaign, *, now: datetime, action: str, target: str, old=None, new=None, actor=None,
           label: str | None = None) -> None:
    """One act of the campaign in the audit trail (subject campaign), caused by "campaign #N"
    and done for whoever started it (or `actor`/`label`: who asked for an abort)."""
    if actor is None and label is None:
        actor = campaign.requested_by
        label = None if actor is not None else (actor_label_current() or campaign.requested_by_label)
    audit(app="campaigns", action=action, at=now, actor=actor, cause=f"campaign #{campaign.pk}", target=target,
          cluster_id=campaign.cluster_id, subject=("campaign", campaign.pk), old=old, new=new,
          actor_label=label or None)


def _loaded(campaign: Campaign) -> Campaign:
    """Remember what the step decides from: the state, version and abort request it saw."""
    campaign.__dict__["_cas"] = (campaign.state, campaign.version, campaign.abort_requested_at)
    return campaign


def _commit(campaign: Campaign, *, fields: Iterable[str] = (), nodes: Iterable[CampaignNode] = (),
            audits: Iterable[dict] = (), now: datetime) -> None:
    """Record in one transaction what a step did. IMPORTANT: called only after the side
    effect succeeded (or, for an intent, before it is tried).

    One conditional UPDATE, applied only if the campaign still has the state, version and
    abort request this step loaded; otherwise nothing is written and `StaleCampaign` is
    raised: an abort asked meanwhile is seen by the next decision, never written over."""
    state, version, abort_asked = campaign.__dict__.get("_cas") or (
        campaign.state, campaign.version, campaign.abort_requested_at)
    values = {name: getattr(campaign, name) for name in set(fields) | {"error", "next_check_at"}}
    with transaction.atomic():
        updated = Campaign.objects.filter(pk=campaign.pk, state=state, version=version,
                                          abort_requested_at=abort_asked).update(
            version=version + 1, updated_at=timezone.now(), **values)
        if not updated:
            raise StaleCampaign(f"campaign {campaign.pk} changed since it was loaded ({state}, v{version})")
        for row in nodes:
            row.save()
        for entry in audits:
            _audit(campaign, **{"now": now, **entry})
    campaign.version = version + 1
    _loaded(campaign)


def _enqueue(campaign: Campaign) -> None:
    """Hand the campaign to a worker once this transaction commits. The row is the intent:
    if the broker cannot take the message, the resume beat hands it on."""
    def send() -> None:
        try:
            task_send(CAMPAIGN_RUN_TASK, args=(campaign.pk,))
        except Exception as exc:  # noqa: BLE001 - any broker failure; the row holds the intent
            log.warning("campaign %s: could not queue its step (%s); the resume beat picks it up", campaign.pk, exc)

    transaction.on_commit(send)


def campaign_lease_acquire(*, campaign_id: int, owner: str, now: datetime) -> bool:
    """Take the campaign for `owner` unless another runner's lease is still running."""
    free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    return Campaign.objects.filter(Q(pk=campaign_id) & free).update(
        lease_owner=owner, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS)) == 1


def campaign_lease_renew(*, campaign_id: int, owner: str, now: datetime) -> bool:
    return lease_renew(Campaign.objects.filter(pk=campaign_id), holder=owner,
                       until=now + timedelta(seconds=LEASE_SECONDS))


def campaign_lease_release(*, campaign_id: int, owner: str) -> None:
    Campaign.objects.filter(pk=campaign_id, lease_owner=owner).update(lease_owner="", lease_expires_at=None)
