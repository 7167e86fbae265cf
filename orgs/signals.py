"""The `warmup` signal: product code in this process announces an org's activity.

    from orgs.signals import warmup
    warmup.send(sender=SomeView, org_slug="acme")

The receiver is throttled (see `orgs.activity`); `org_activity_record(slug)` is the
same without Django's dispatch, for the hottest paths.

Why `warmup` is a `Signal` subclass: Django resolves the receivers on every `send()`
(a lock, a rebuilt list, weakref derefs) — about 5-7× a bare `Signal.send()`, for a
call that, throttled, only compares two numbers. While the throttle receiver is the
only one connected (the normal case), a throttled `send()` answers what Django's
dispatch would have answered, `[(receiver, None)]`, without the resolution. As soon as
any other receiver is connected, every `send()` goes through Django's own dispatch.
"""
from __future__ import annotations

from django.dispatch import Signal

from orgs import activity
from orgs.activity import org_activity_record

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
    org_activity_record(org_slug)


# A strong reference: the module keeps the function alive anyway, and Django need not
# dereference a weakref on each dispatch.
warmup.connect(_record_warmup, weak=False, dispatch_uid=RECEIVER_UID)
