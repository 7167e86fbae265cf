"""Which worker steps a job: a lease on its row, taken, renewed and released by one
conditional UPDATE each."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from config.leases import lease_renew

from capacity.defrag.models import DefragJob


# A worker owns a job through a lease this long (seconds). The step task renews it every
# HEARTBEAT_SECONDS (capacity/defrag/tasks.py), so a live worker never loses it, and a
# killed worker's job is free again within 30 s, and with the 10 s resume beat
# (config/schedule.py) it is stepped again within 40 s, well inside a minute.
LEASE_SECONDS = 30.0


def defrag_job_lease_acquire(*, job_id: int, owner: str, now: datetime) -> bool:
    """Take the job for `owner` unless another worker's lease is still running. One
    conditional UPDATE: two workers asking at once cannot both get it."""
    free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    return DefragJob.objects.filter(Q(pk=job_id) & free).update(
        lease_owner=owner, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS), heartbeat_at=now) == 1


def defrag_job_lease_renew(*, job_id: int, owner: str, now: datetime) -> bool:
    """Heartbeat: extend the lease; False when it was lost (expired and taken by another)."""
    return lease_renew(DefragJob.objects.filter(pk=job_id), holder=owner,
                       until=now + timedelta(seconds=LEASE_SECONDS), heartbeat_at=now)


def defrag_job_lease_release(*, job_id: int, owner: str) -> None:
    DefragJob.objects.filter(pk=job_id, lease_owner=owner).update(lease_owner="", lease_expires_at=None)
