"""Activity recording: throttled across processes with real Redis, and safe when Redis is down."""
from __future__ import annotations

import logging
import socket
import threading
from datetime import timedelta

import pytest
import redis
from django.db import connections

from config import clock
from orgs.activity import CACHE_PREFIX, org_activity_record, throttle_reset
from orgs.models import DormancySwitch, Org
from orgs.services import dormancy_sweep, org_mark_active
from orgs.signals import warmup
from tests.orgs.locks import backends_waiting_for_a_lock

pytestmark = pytest.mark.django_db


def stamp(org: Org, hours_ago: float) -> None:
    Org.objects.filter(id=org.id).update(last_activity_at=clock.now() - timedelta(hours=hours_ago))


def test_first_activity_in_a_window_writes_then_calls_are_throttled(make_org, redis_cache):
    org = make_org("acme", idle_hours=5)
    assert org_activity_record("acme") is True
    first = Org.objects.get(id=org.id).last_activity_at
    assert clock.now() - first < timedelta(seconds=5)

    stamp(org, 3)
    assert org_activity_record("acme") is False
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=2), "no second write"


def test_the_window_is_shared_across_processes_through_redis(make_org, redis_cache, redis_url, settings):
    org = make_org("acme", idle_hours=5)
    assert org_activity_record("acme") is True
    throttle_reset()  # another process: its own in-process state is empty
    stamp(org, 3)
    assert org_activity_record("acme") is False
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=2)
    ttl = redis.Redis.from_url(redis_url).ttl(f"{redis_cache}:1:{CACHE_PREFIX}acme")
    assert 0 < ttl <= settings.ORGS_ACTIVITY_THROTTLE_SECONDS


def test_with_redis_down_activity_still_reaches_the_database(make_org, settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{dead_port}/0",
                                   "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2}}}
    org = make_org("acme", idle_hours=5)
    assert org_activity_record("acme") is True
    assert clock.now() - Org.objects.get(id=org.id).last_activity_at < timedelta(seconds=5)
    # The in-process fast path still keeps this process to one write per window.
    stamp(org, 3)
    assert org_activity_record("acme") is False


def test_the_warmup_signal_records_activity(make_org, redis_cache):
    org = make_org("acme", idle_hours=5)
    warmup.send(sender=None, org_slug="acme")
    assert clock.now() - Org.objects.get(id=org.id).last_activity_at < timedelta(seconds=5)


def test_an_unknown_org_is_named(redis_cache):
    with pytest.raises(Org.DoesNotExist, match="no org with slug 'ghost'"):
        org_activity_record("ghost")


def test_the_warmup_signal_for_an_org_not_registered_yet_logs_it_and_never_fails_the_sender(
        make_org, redis_cache, caplog):
    class Checkout:   # the product code sending the signal
        pass

    with caplog.at_level(logging.WARNING, logger="orgs.signals"):
        for _ in range(3):
            warmup.send(sender=Checkout, org_slug="newco")
    [logged] = [r.getMessage() for r in caplog.records if r.name == "orgs.signals"]
    assert logged == (f"warmup from {Checkout.__qualname__}: no org with slug 'newco' (orgs are registered by manage.py "
                      "sync_orgs); no activity recorded"), "said once per window in this process"
    assert not Org.objects.filter(slug="newco").exists()
    make_org("newco", idle_hours=5)
    throttle_reset()   # the next window
    warmup.send(sender=Checkout, org_slug="newco")
    assert clock.now() - Org.objects.get(slug="newco").last_activity_at < timedelta(seconds=5)


@pytest.mark.parametrize("dormant", [False, True])
def test_a_write_stamped_earlier_never_moves_the_activity_back(make_org, redis_cache, dormant):
    """A process whose clock lags, or an event reported late, writes an older time: the org
    stays as recently active as it was, and the next sweep leaves an active org awake."""
    org = make_org("acme", idle_hours=0.01 if not dormant else 30, dormant=dormant)
    before = Org.objects.get(id=org.id).last_activity_at
    assert org_activity_record("acme", at=before - timedelta(hours=30)) is True
    after = Org.objects.get(id=org.id)
    assert after.last_activity_at == before and not after.dormant
    if not dormant:
        assert dormancy_sweep(now=clock.now(), enqueue=False).switched == ()
        assert not Org.objects.get(id=org.id).dormant


def test_a_failed_database_write_does_not_swallow_the_window(make_org, redis_cache):
    with pytest.raises(Org.DoesNotExist):
        org_activity_record("later")
    make_org("later", idle_hours=5)
    assert org_activity_record("later") is True, "the failed attempt released the throttle"


def test_activity_on_a_dormant_org_wakes_it_at_once(make_org, redis_cache, django_capture_on_commit_callbacks):
    org = make_org("sleepy", idle_hours=30, dormant=True, dormant_since=clock.now() - timedelta(hours=5))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert org_activity_record("sleepy") is True
    org.refresh_from_db()
    assert not org.dormant and org.dormant_since is None
    switch = DormancySwitch.objects.get(org=org)
    assert (switch.direction, switch.cause, switch.actor) == ("active", "activity", None)
    assert len(queued) == 1, "the disabling of scale to zero is queued on commit"


def test_waking_queues_the_disable_at_high_priority_and_the_sweep_at_normal(
        make_org, redis_cache, monkeypatch, django_capture_on_commit_callbacks):
    from orgs import tasks
    from orgs.services import dormancy_sweep, org_mark_active

    sent = []
    monkeypatch.setattr(tasks.org_scale_to_zero_apply, "apply_async",
                        lambda args, kwargs, priority, **options: sent.append((args[0], priority)))
    sleepy = make_org("sleepy", idle_hours=30, dormant=True)
    idle = make_org("idle", idle_hours=30)
    with django_capture_on_commit_callbacks(execute=True):
        org_activity_record("sleepy")
    with django_capture_on_commit_callbacks(execute=True):
        dormancy_sweep(now=clock.now())
    assert sent == [(sleepy.id, tasks.HIGH_PRIORITY), (idle.id, tasks.NORMAL_PRIORITY)]
    assert tasks.HIGH_PRIORITY < tasks.NORMAL_PRIORITY, "Redis serves the lower number first"


def test_warmup_answers_like_djangos_dispatch_and_reaches_every_receiver(make_org, redis_cache):
    """The throttled fast path of `warmup` must not change what `send()` does or returns."""
    from orgs.signals import _record_warmup

    org = make_org("acme", idle_hours=5)
    assert warmup.send(sender=None, org_slug="acme") == [(_record_warmup, None)]
    stamp(org, 3)
    assert warmup.send(sender=None, org_slug="acme") == [(_record_warmup, None)], "throttled: same answer"
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=2), "and no second write"

    heard = []

    def listener(sender, org_slug, **kwargs):
        heard.append(org_slug)
        return "heard"

    warmup.connect(listener)
    try:
        assert warmup.send(sender=None, org_slug="acme") == [(_record_warmup, None), (listener, "heard")]
    finally:
        warmup.disconnect(listener)
    assert heard == ["acme"], "another receiver hears a throttled activity too"
    assert warmup.send(sender=None, org_slug="acme") == [(_record_warmup, None)]



@pytest.mark.django_db(transaction=True)
def test_two_wakes_at_once_wake_the_org_once(make_org):
    """Two processes past the throttle (Redis down, say) wake the same dormant org at once:
    one switch, one queued disable, and the org ends awake."""
    org = make_org("sleepy", idle_hours=30, dormant=True)
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    with holder.cursor() as cursor:
        cursor.execute("SELECT id FROM orgs_org WHERE id = %s FOR UPDATE", [org.id])
    results = []

    def wake():
        try:
            results.append(org_mark_active(org_slug="sleepy", cause="activity", enqueue=False))
        finally:
            connections.close_all()

    wakers = [threading.Thread(target=wake) for _ in range(2)]
    for waker in wakers:
        waker.start()
    try:
        assert backends_waiting_for_a_lock(2), "both wakes must be in flight together"
    finally:
        holder.rollback()
        holder.close()
    for waker in wakers:
        waker.join(timeout=30)
    assert sorted(r.woke for r in results) == [False, True]
    org.refresh_from_db()
    assert not org.dormant and org.switches.filter(direction="active").count() == 1
