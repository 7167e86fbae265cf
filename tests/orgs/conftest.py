from __future__ import annotations

from datetime import timedelta

import pytest

from config import clock
from orgs.activity import throttle_reset


@pytest.fixture(autouse=True)
def _fresh_throttle():
    throttle_reset()
    yield
    throttle_reset()


@pytest.fixture
def make_org(db):
    """`make_org(slug, idle_hours=1, cluster=None, **fields)`: an Org row on a placeholder cluster
    unless a real (simulated) one is given."""
    from clusters.models import Cluster
    from orgs.models import Org

    def make(slug: str, *, idle_hours: float = 1.0, cluster=None, namespace: str | None = None, **fields):
        if cluster is None:
            cluster, _ = Cluster.objects.get_or_create(name="nowhere", defaults={"kubeconfig_path": "/nonexistent"})
        fields.setdefault("last_activity_at", clock.now() - timedelta(hours=idle_hours))
        return Org.objects.create(slug=slug, cluster=cluster, namespace=namespace or slug, **fields)

    return make
