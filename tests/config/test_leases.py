"""The one lease helper every app's lease goes through: who holds it, and renewal by one
conditional UPDATE that a lost lease does not match."""
from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import pytest

from config.leases import lease_holder, lease_renew
from pruning.models import PruneRun

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_holder_names_its_role_and_process_and_no_two_holdings_are_alike():
    first, second = lease_holder("worker"), lease_holder("worker")
    assert first.startswith(f"worker:{socket.gethostname()}:{os.getpid()}:")
    assert first != second


@pytest.mark.django_db
def test_only_the_holder_renews_and_its_fields_are_written_with_the_expiry():
    run = PruneRun.objects.create(evaluated_at=NOW, lease_owner="worker:a", lease_expires_at=NOW)
    rows = PruneRun.objects.filter(pk=run.pk, status=PruneRun.Status.RUNNING)
    assert lease_renew(rows, holder="worker:a", until=NOW + timedelta(seconds=30), acted=2)
    run.refresh_from_db()
    assert (run.lease_expires_at, run.acted) == (NOW + timedelta(seconds=30), 2)
    # Taken over by another: the first holder's renewal matches no row and writes nothing.
    PruneRun.objects.filter(pk=run.pk).update(lease_owner="reconcile:b")
    assert not lease_renew(rows, holder="worker:a", until=NOW + timedelta(seconds=60), acted=3)
    run.refresh_from_db()
    assert (run.lease_owner, run.lease_expires_at, run.acted) == ("reconcile:b", NOW + timedelta(seconds=30), 2)


@pytest.mark.django_db
def test_a_renewal_covers_only_the_state_its_rows_name():
    run = PruneRun.objects.create(evaluated_at=NOW, lease_owner="worker:a", lease_expires_at=NOW,
                                  status=PruneRun.Status.SUCCEEDED)
    rows = PruneRun.objects.filter(pk=run.pk, status=PruneRun.Status.RUNNING)
    assert not lease_renew(rows, holder="worker:a", until=NOW + timedelta(seconds=30))

