"""The `warmup` signal (seed 004): product code in this process announces activity.

    from orgs.signals import warmup
    warmup.send(sender=SomeView, org_slug="acme")

The receiver is throttled (see `orgs.activity`); `org_activity_record(slug)` is the
same without Django's dispatch, for the hottest paths.
"""
from __future__ import annotations

from django.dispatch import Signal, receiver

from orgs.activity import org_activity_record

warmup = Signal()


@receiver(warmup, dispatch_uid="orgs.warmup.record")
def _record_warmup(sender, org_slug: str, **kwargs) -> None:
    org_activity_record(org_slug)
