"""The `warmup` signal: product code in this process announces an org's activity.

    from orgs.signals import warmup
    warmup.send(sender=SomeView, org_slug="acme")

The receiver is throttled (see `orgs.activity`); `org_activity_record(slug)` is the
same without Django's dispatch, for the hottest paths (it raises `Org.DoesNotExist` for an
unknown org, which the signal's receiver logs instead).

Why `warmup` is a `Signal` subclass: Django resolves the receivers on every `send()`
(a lock, a rebuilt list, weakref derefs) — about 5-7× a bare `Signal.send()`, for a
call that, throttled, only compares two numbers. While the throttle receiver is the
only one connected (the normal case), a throttled `send()` answers what Django's
dispatch would have answered, `[(receiver, None)]`, without the resolution. As soon as
any other receiver is connected, every `send()` goes through Django's own dispatch.
"""
from __future__ import annotations

import logging

from django.dispatch import Signal

from orgs import activity
from orgs.activity import org_activity_record
from orgs.models import Org

logger = logging.getLogger(__name__)

RECEIVER_UID = "orgs.warmup.record"

_deadlines = activity._deadlines  # the in-process throttle (cleared in place, never rebound)


class WarmupSignal(Signal):
    _only_throttle = False

    def connect(self, receiver, sender=None, weak=True, dispatch_uid=None):
        super().connect(receiver, sender=sender, weak=weak, dispatch_uid=dispatch_uid)
        self._only_throttle = self._throttle_alone()

    def disconnect(self, receiver=None, sender=None, dispatch_uid=None):
        disconnected = super().disconnect(receiver=receiver, sender=sender, dispatch_uid=dispatch_uid)
        self._only_throttle = self._throttle_alone()
        return disconnected

    def _throttle_alone(self) -> bool:
        with self.lock:
            return [key for (key, _sender), _receiver, _is_async in self.receivers] == [RECEIVER_UID]

    def send(self, sender, **named):
        # IMPORTANT: the fast answer is only right while the throttle receiver is alone.
        if self._only_throttle and _deadlines.get(named.get("org_slug"), 0.0) > activity._monotonic():
            return [(_record_warmup, None)]
        return super().send(sender, **named)


warmup = WarmupSignal()


def _record_warmup(sender, org_slug: str, **kwargs) -> None:
    # The sender is product code serving its own request: an org that is not registered
    # (yet) is logged, once per window in this process, and never fails that request. A
    # database error is raised: the sender's own transaction may be broken by it.
    try:
        org_activity_record(org_slug)
    except Org.DoesNotExist as exc:
        activity.throttle_in_process(org_slug)
        logger.warning("warmup from %s: %s (orgs are registered by manage.py sync_orgs); no activity recorded",
                       _sender_name(sender), exc)


def _sender_name(sender) -> str:
    return getattr(sender, "__qualname__", None) or repr(sender)


# A strong reference: the module keeps the function alive anyway, and Django need not
# dereference a weakref on each dispatch.
warmup.connect(_record_warmup, weak=False, dispatch_uid=RECEIVER_UID)
