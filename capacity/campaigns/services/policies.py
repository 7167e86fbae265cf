"""An operator's pool policy saved or removed, every change audited with the old and new values."""
from __future__ import annotations

from datetime import datetime

from django.db import transaction

from audit.services import audit
from config import clock

from capacity.campaigns.models import CampaignPolicy


def campaign_policy_save(*, policy: CampaignPolicy, actor, now: datetime | None = None) -> CampaignPolicy:
    """Save the policy as the operator set it (validated by the caller's form) and audit the
    change: the values before (none for a new policy) and after. Saving it unchanged writes
    nothing."""
    now = now or clock.now()
    with transaction.atomic():
        before = None
        if policy.pk is not None:
            before = CampaignPolicy.objects.select_for_update().get(pk=policy.pk).values()
            if before == policy.values():
                return policy
        policy.changed_by, policy.changed_at = actor, now
        policy.save()
        changed = {k: v for k, v in policy.values().items() if before is None or before[k] != v}
        audit(app="campaigns", action="policy_create" if before is None else "policy_change", at=now, actor=actor,
              cause=f"campaign policy #{policy.pk}", target=f"pool {policy.selector}", cluster_id=policy.cluster_id,
              subject=("campaign_policy", policy.pk),
              old={k: before[k] for k in changed} if before is not None else None, new=changed)
    return policy


def campaign_policy_delete(*, policy: CampaignPolicy, actor, now: datetime | None = None) -> None:
    """Remove the policy (the pool no longer acts on its own), audited with what it was."""
    now = now or clock.now()
    with transaction.atomic():
        audit(app="campaigns", action="policy_delete", at=now, actor=actor, cause=f"campaign policy #{policy.pk}",
              target=f"pool {policy.selector}", cluster_id=policy.cluster_id, subject=("campaign_policy", policy.pk),
              old=policy.values())
        policy.delete()
