"""When in doubt keep the org warm: a dead broker or a failing API never leaves an active
org scaled to zero once the reconcile has run (simulated cluster, real client)."""
from __future__ import annotations

import logging
import socket

import pytest

from clusters import kube
from config import clock
from orgs import services
from orgs.models import Org
from tests.orgs.test_services import ann, ksvc_min_scale, make_idle, scenario

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster(sim_cluster_factory):
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    return sim


@pytest.fixture
def dormant_acme(cluster, celery_eager):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    assert ksvc_min_scale(cluster.gateway, "pynode") == "0"
    return Org.objects.get(slug="acme")


@pytest.fixture
def broker_down():
    """The Celery app publishes to a Redis port where nothing listens (its pools rebuilt)."""
    from config.celery import app

    def repoint(url: str) -> None:
        app.conf.broker_url = url
        app._pool = None
        app.amqp._producer_pool = None

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    old_url, old_eager = app.conf.broker_url, app.conf.task_always_eager
    app.conf.task_always_eager = False
    repoint(f"redis://127.0.0.1:{dead_port}/0")
    yield
    repoint(old_url)
    app.conf.task_always_eager = old_eager


def test_with_the_broker_down_a_wake_still_lands_and_the_reconcile_restores_the_floor(
        cluster, dormant_acme, broker_down, caplog):
    gw = cluster.gateway
    with caplog.at_level(logging.ERROR, logger="orgs.services"):
        result = services.org_mark_active(org_slug="acme", cause="activity")
    assert result.woke and result.queued is False, "no broker error reaches the caller, but it is told"
    assert "could not be queued" in result.describe() and "within 2 minutes" in result.describe()
    org = Org.objects.get(slug="acme")
    assert not org.dormant and org.wanted == "disabled", "the database says warm at once"
    assert "could not queue scale-to-zero apply" in caplog.text
    assert ksvc_min_scale(gw, "pynode") == "0", "nothing could be queued, so nothing was reverted yet"

    services.orgs_reconcile(now=clock.now())

    assert ksvc_min_scale(gw, "pynode") == "1"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1"
    assert ann(gw, kube.REVISIONS, "big-predictor-00001") == "2", "back to the model's own floor"
    assert Org.objects.get(slug="acme").applied == "disabled"


def test_a_wake_the_api_refuses_is_retried_recorded_and_repaired(cluster, dormant_acme, celery_eager):
    gw = cluster.gateway
    cluster.control.set_faults(seed=1, error_rate=1.0, match={"verbs": ["patch"]})
    patches_before = gw.calls_total(("patch",))

    assert services.org_mark_active(org_slug="acme", cause="activity").woke

    org = Org.objects.get(slug="acme")
    assert not org.dormant and "500" in org.last_error
    switch = org.switches.get(direction="active")
    assert switch.applied_at is None and switch.errors, "the failure is on the wake's record"
    attempts = gw.calls_total(("patch",)) - patches_before
    assert attempts > 3 * 5, "the task retried the apply (each try itself retried by the gateway)"
    assert ksvc_min_scale(gw, "pynode") == "0"

    cluster.control.clear_faults()
    services.orgs_reconcile(now=clock.now())

    org.refresh_from_db()
    assert org.applied == "disabled" and org.last_error == ""
    assert ksvc_min_scale(gw, "pynode") == "1"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1"
