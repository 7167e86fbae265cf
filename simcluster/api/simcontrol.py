"""The simulator's own endpoints, outside the Kubernetes paths (never faulted).

POST /simcluster/v1/advance {"seconds": N}   advance the clock, run controllers to rest
GET  /simcluster/v1/clock                    the simulated time
PUT  /simcluster/v1/load/<ns>/<revision>     {"concurrency": N} on a Knative revision
GET|PUT|DELETE /simcluster/v1/faults         injected faults
GET  /metrics                                the DCGM exporter (Prometheus text)
"""
from __future__ import annotations

from werkzeug.wrappers import Request, Response

from .. import errors
from ..clock import rfc3339
from ..faults import FaultError, Faults
from ..resources import REVISIONS
from ..sim import Simulation
from .http import json_response, read_object

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def clock_body(sim: Simulation) -> dict:
    return {"now": rfc3339(sim.clock.now()), "manual": sim.clock.manual,
            "resourceVersion": str(sim.store.resource_version)}


def _number(body: dict, name: str, *, minimum: float = 0.0) -> float:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise errors.bad_request(f'"{name}" must be a number >= {minimum:g}, got {value!r}')
    return float(value)


def handle(sim: Simulation, faults: Faults, request: Request) -> Response:
    parts = [p for p in request.path.split("/") if p]
    method = request.method
    if parts == ["metrics"]:
        if method != "GET":
            raise errors.method_not_allowed("only GET is allowed on /metrics")
        return _metrics(sim)
    if parts[:2] != ["simcluster", "v1"] or len(parts) < 3:
        raise errors.resource_not_found()
    what = parts[2]
    if what == "clock" and len(parts) == 3 and method == "GET":
        return json_response(clock_body(sim))
    if what == "advance" and len(parts) == 3 and method == "POST":
        seconds = _number(read_object(request), "seconds")
        sim.advance(seconds)
        return json_response(clock_body(sim))
    if what == "load" and len(parts) == 5 and method == "PUT":
        namespace, revision = parts[3], parts[4]
        concurrency = _number(read_object(request), "concurrency")
        sim.store.require(REVISIONS, namespace, revision)
        sim.load[(namespace, revision)] = concurrency
        return json_response({"namespace": namespace, "revision": revision, "concurrency": concurrency})
    if what == "faults" and len(parts) == 3:
        if method == "GET":
            return json_response(faults.describe())
        if method == "PUT":
            try:
                faults.configure(read_object(request))
            except (FaultError, TypeError) as exc:
                raise errors.bad_request(f"invalid faults: {exc}") from None
            return json_response(faults.describe())
        if method == "DELETE":
            faults.clear()
            return json_response(faults.describe())
    if what in ("clock", "advance", "load", "faults"):
        raise errors.method_not_allowed(f"{method} is not allowed on {request.path}")
    raise errors.resource_not_found()


def _metrics(sim: Simulation) -> Response:
    try:
        from ..metrics import render_metrics
    except ImportError:
        raise errors.ApiError(501, "NotImplemented", "the DCGM metrics renderer (simcluster.metrics) "
                                                      "is not available") from None
    with sim.store.lock:
        text = render_metrics(sim)
    return Response(text, content_type=PROMETHEUS_TEXT)
