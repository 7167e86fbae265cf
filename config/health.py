"""Probes: `/healthz` (the process answers) and `/readyz` (what serving needs answers).

`/readyz` checks the database, the Celery broker and the Kubernetes API of every
registered cluster (one cheap list through the gateway, no retries, a short timeout),
each named in the JSON body with "ok" or "error"; 503 when any fails. Error details
(host names, ports) are shown only with DEBUG on or a valid METRICS_TOKEN bearer token;
an anonymous probe sees the error's type only.

`ProbeMiddleware` answers these paths and `/metrics` before any other middleware: the
kubelet and Prometheus reach a pod by its IP (a Host header that ALLOWED_HOSTS rejects)
over plain HTTP (which SECURE_SSL_REDIRECT would redirect).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from django.conf import settings
from django.http import HttpResponse, JsonResponse


def healthz(request) -> HttpResponse:
    """Alive: no dependency is consulted, so a dead database never restarts the pod."""
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    from config.celery import app

    with app.connection_for_write() as conn:
        # One attempt: a probe must answer within its own timeout, not wait out retries.
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, interval_max=0,
                               timeout=settings.READYZ_TIMEOUT_SECONDS)


def _check_cluster(cluster) -> None:
    from clusters.kube import gateway_for

    gateway_for(cluster).ping(timeout=settings.READYZ_TIMEOUT_SECONDS)


def _describe(exc: BaseException, detailed: bool) -> str:
    return f"{type(exc).__name__}: {exc}" if detailed else type(exc).__name__


def readiness(*, detailed: bool) -> tuple[bool, dict[str, dict]]:
    """(all ok, {check name: {"status": "ok"|"error", "error": …}})."""
    checks: dict[str, dict] = {}

    def run(name: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure is a "not ready" answer
            checks[name] = {"status": "error", "error": _describe(exc, detailed)}
        else:
            checks[name] = {"status": "ok"}

    run("database", _check_database)
    run("broker", _check_broker)
    clusters = []
    if checks["database"]["status"] == "ok":
        from clusters.selectors import clusters_all

        try:
            clusters = list(clusters_all())
        except Exception as exc:  # noqa: BLE001 - e.g. not migrated yet
            checks["clusters"] = {"status": "error", "error": _describe(exc, detailed)}
    if clusters:
        # In parallel: N unreachable clusters must not add up to N timeouts.
        with ThreadPoolExecutor(max_workers=min(8, len(clusters))) as pool:
            futures = {f"cluster:{c.name}": pool.submit(_check_cluster, c) for c in clusters}
            for name, future in futures.items():
                try:
                    future.result(timeout=settings.READYZ_TIMEOUT_SECONDS + 1)
                except FutureTimeout:
                    checks[name] = {"status": "error", "error": "timeout"}
                except Exception as exc:  # noqa: BLE001
                    checks[name] = {"status": "error", "error": _describe(exc, detailed)}
                else:
                    checks[name] = {"status": "ok"}
    return all(c["status"] == "ok" for c in checks.values()), checks


def readyz(request) -> HttpResponse:
    from config.observability import bearer_token_ok

    ok, checks = readiness(detailed=settings.DEBUG or bearer_token_ok(request))
    return JsonResponse({"status": "ok" if ok else "error", "checks": checks}, status=200 if ok else 503)


class ProbeMiddleware:
    """Serve /healthz, /readyz and /metrics first (see the module docstring)."""

    def __init__(self, get_response):
        self.get_response = get_response
        from config.observability import metrics_view

        self.routes = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics_view}

    def __call__(self, request):
        view = self.routes.get(request.path_info)
        if view is None:
            return self.get_response(request)
        response = view(request)
        response["Cache-Control"] = "no-store"
        response["X-Content-Type-Options"] = "nosniff"
        return response
