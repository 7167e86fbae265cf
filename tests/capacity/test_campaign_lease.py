"""The campaign task's lease on real PostgreSQL: a pass blocked in slow API calls for longer
than the lease keeps its campaign through the heartbeat thread (no other worker is handed
it), and a worker whose lease lapsed and was taken learns it and stops."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.campaigns import tasks
from capacity.campaigns.models import Campaign
from capacity.campaigns.selectors import campaigns_due
from capacity.campaigns.services import LEASE_SECONDS, campaign_lease_acquire
from clusters.models import Cluster
from config import clock

pytestmark = pytest.mark.django_db(transaction=True)   # the heartbeat thread has its own connection


def _campaign() -> Campaign:
    cluster = Cluster.objects.create(name="leases", kubeconfig_path="/nonexistent")
    return Campaign.objects.create(cluster=cluster, selector={"karpenter.sh/nodepool": "h100"}, max_in_flight=1,
                                   plan={}, created_at=clock.now())


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 5          # wall time: the heartbeat thread runs on its own
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_pass_longer_than_the_lease_keeps_the_campaign_through_its_heartbeat(monkeypatch):
    campaign = _campaign()
    moved = {"seconds": 0.0}
    monkeypatch.setattr(tasks.clock, "now", lambda: timezone.now() + timedelta(seconds=moved["seconds"]))
    monkeypatch.setattr(tasks, "HEARTBEAT_SECONDS", 0.05)
    assert campaign_lease_acquire(campaign_id=campaign.pk, owner="w1", now=tasks.clock.now())
    with tasks._heartbeat(campaign_id=campaign.pk, owner="w1") as heartbeat:
        # One pass blocked in slow API calls for twice the lease (time moved, not waited).
        for _ in range(4):
            moved["seconds"] += LEASE_SECONDS / 2
            before = Campaign.objects.get(pk=campaign.pk).lease_expires_at
            _wait_for(lambda: Campaign.objects.get(pk=campaign.pk).lease_expires_at != before, "no heartbeat")
            assert campaigns_due(now=tasks.clock.now()) == [], "the live worker's campaign is not handed out"
        assert not heartbeat.lost.is_set()
    assert Campaign.objects.get(pk=campaign.pk).lease_owner == "w1"
    assert [t for t in threading.enumerate() if t.name.startswith("campaign-lease-")] == []


def test_without_a_heartbeat_the_lease_lapses_and_the_campaign_is_due_again():
    campaign = _campaign()
    now = clock.now()
    assert campaign_lease_acquire(campaign_id=campaign.pk, owner="killed", now=now)
    assert campaigns_due(now=now + timedelta(seconds=LEASE_SECONDS - 1)) == []
    assert campaigns_due(now=now + timedelta(seconds=LEASE_SECONDS + 0.1)) == [campaign.pk]


def test_a_worker_whose_lease_was_taken_learns_it_at_its_next_heartbeat(monkeypatch):
    campaign = _campaign()
    monkeypatch.setattr(tasks, "HEARTBEAT_SECONDS", 0.05)
    now = clock.now()
    assert campaign_lease_acquire(campaign_id=campaign.pk, owner="w1", now=now)
    # w1 stalled (a paused VM): its lease lapsed and w2 took the campaign.
    assert campaign_lease_acquire(campaign_id=campaign.pk, owner="w2", now=now + timedelta(seconds=LEASE_SECONDS + 1))
    with tasks._heartbeat(campaign_id=campaign.pk, owner="w1") as heartbeat:
        assert heartbeat.lost.wait(5)
    assert Campaign.objects.get(pk=campaign.pk).lease_owner == "w2", "the loser did not take it back"


def test_a_pass_whose_lease_was_taken_meanwhile_stops_and_leaves_the_campaign_to_its_new_holder(monkeypatch):
    """The task itself: the pass (stalled as long as a lease) finds at its end that another
    worker holds the campaign, returns "lease lost" and queues nothing."""
    campaign = _campaign()
    monkeypatch.setattr(tasks, "HEARTBEAT_SECONDS", 0.05)
    queued = []
    monkeypatch.setattr(tasks.campaign_run, "apply_async", lambda *a, **k: queued.append(a))

    def stalled_pass(*, campaign, now):
        later = now + timedelta(seconds=LEASE_SECONDS + 1)
        assert campaign_lease_acquire(campaign_id=campaign.pk, owner="w2", now=later)
        time.sleep(0.2)            # a few heartbeats: the first finds the lease taken
        return Campaign.objects.get(pk=campaign.pk)

    monkeypatch.setattr(tasks, "campaign_step", stalled_pass)
    assert tasks.campaign_run.apply(args=(campaign.pk,)).get() == "lease lost"
    assert queued == []
    assert Campaign.objects.get(pk=campaign.pk).lease_owner == "w2"
