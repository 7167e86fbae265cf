"""/healthz and /readyz: the database, the broker and each cluster's API, named one by one."""
from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_healthz_answers_without_consulting_anything(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_readyz_is_ready_then_not_when_a_cluster_api_goes_down(sim_cluster_factory, client, settings):
    settings.DEBUG = False
    settings.METRICS_TOKEN = ""
    first = sim_cluster_factory(name="alpha")
    sim_cluster_factory(name="beta")

    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {
        "database": {"status": "ok"}, "broker": {"status": "ok"},
        "cluster:alpha": {"status": "ok"}, "cluster:beta": {"status": "ok"}}}

    first.server.stop()

    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "error"
    assert body["checks"]["cluster:alpha"] == {"status": "error", "error": "Unavailable"}  # no host:port leaked
    assert body["checks"]["cluster:beta"] == {"status": "ok"}
    assert body["checks"]["database"] == body["checks"]["broker"] == {"status": "ok"}


def test_readyz_details_for_the_metrics_token_holder(sim_cluster_factory, client, settings):
    settings.DEBUG = False
    settings.METRICS_TOKEN = "ops-token"
    sim = sim_cluster_factory(name="gamma")
    sim.server.stop()

    body = client.get("/readyz", HTTP_AUTHORIZATION="Bearer ops-token").json()

    error = body["checks"]["cluster:gamma"]["error"]
    assert error.startswith("Unavailable: ") and "no answer from" in error


def test_readyz_fails_when_the_broker_is_down(db, client, settings):
    from config.celery import app

    settings.DEBUG = True
    old = app.conf.broker_url
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/readyz")
    finally:
        app.conf.broker_url = old
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["broker"]["status"] == "error"
    assert "Connection" in checks["broker"]["error"] or "refused" in checks["broker"]["error"]
    assert checks["database"] == {"status": "ok"}


@pytest.mark.django_db
def test_the_panel_answers_while_redis_is_down(admin_client, settings):
    """Operators need the panel most when something is down: its theme is kept per
    process (the admin_interface cache), not in Redis."""
    import socket

    from config import settings as product_settings

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    settings.CACHES = {**product_settings.CACHES,
                       "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{dead_port}/0",
                                   "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2}}}
    for page in ("/admin/", "/admin/orgs/org/"):
        response = admin_client.get(page)
        assert response.status_code == 200, page
