"""The WSGI application: Kubernetes REST paths onto the simulation's store."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from werkzeug.wrappers import Request, Response

from .. import errors
from ..faults import Faults
from ..sim import Simulation
from . import auth, discovery, handlers, openapi, routing, simcontrol, subresources, tables, watch
from .http import error_response, json_response

log = logging.getLogger("simcluster.api")


def _verb(method: str, route: routing.Route, request: Request) -> str:
    """The Kubernetes verb of a request, or 405 when the method makes no sense there."""
    collection = route.is_collection
    if method == "GET":
        if collection:
            return "watch" if request.args.get("watch", "").lower() in ("true", "1") else "list"
        return "get"
    if method == "POST":
        if collection or route.subresource in ("eviction", "binding"):
            return "create"
    elif method == "PUT" and not collection and route.subresource not in ("eviction", "binding"):
        return "update"
    elif method == "PATCH" and not collection and route.subresource not in ("eviction", "binding"):
        return "patch"
    elif method == "DELETE":
        if collection:
            return "deletecollection"
        if route.subresource is None:
            return "delete"
    raise errors.method_not_allowed(f"the server does not allow this method on the requested resource "
                                    f"({method} {route.rtype.plural}"
                                    f"{'/' + route.subresource if route.subresource else ''})")


class ApiServer:
    def __init__(self, sim: Simulation, *, faults: Faults | None = None):
        self.sim = sim
        self.faults = faults or Faults()
        self.auth = auth.Authorizer(sim)   # bearer tokens and RBAC (see auth.py)
        # Set when the server stops, so open watches end instead of holding threads.
        self.stopping = threading.Event()
        # API requests served, by HTTP method (the simulator's control endpoints and health
        # checks aside), as kube-apiserver's apiserver_request_total counts them: what shows
        # that a caller left this cluster alone.
        self.requests: Counter[str] = Counter()
        self._requests_lock = threading.Lock()

    def __call__(self, environ, start_response):
        request = Request(environ)
        try:
            response = self.dispatch(request)
        except errors.ApiError as exc:
            response = error_response(exc)
        except Exception as exc:   # a bug: answer as kube-apiserver would, and say what
            log.exception("internal error on %s %s", request.method, request.full_path)
            response = error_response(errors.internal(f"simcluster internal error: {type(exc).__name__}: {exc}"))
        return response(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/readyz", "/livez"):
            return Response("ok", content_type="text/plain")
        if path.startswith("/simcluster/") or path == "/metrics":
            return simcontrol.handle(self.sim, self.faults, request)
        with self._requests_lock:
            self.requests[request.method] += 1
        # IMPORTANT: authenticate before serving anything else (401 for a bad token).
        user = request.environ[auth.USER_KEY] = self.auth.authenticate(request)
        if path == "/version":
            return json_response(discovery.version())
        if path == "/api":
            self.auth.require_authenticated(user, path)
            return json_response(discovery.api_versions(request.host))
        unserved = self.sim.settings.unserved_groups
        if path.startswith("/apis/") and path.split("/")[2] in unserved:
            # kube-apiserver: no handler claims an uninstalled group, so its NotFoundHandler
            # answers in plain text (not a Status object), whatever the verb.
            return Response("404 page not found\n", status=404, content_type="text/plain; charset=utf-8")
        if path == "/apis":
            self.auth.require_authenticated(user, path)
            listing = discovery.api_group_list()
            listing["groups"] = [g for g in listing["groups"] if g["name"] not in unserved]
            return json_response(listing)
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            # system:discovery lets every authenticated user read the OpenAPI documents.
            self.auth.require_authenticated(user, path)
            return self.serve_openapi(path)
        if path.startswith("/apis/") and path.count("/") == 2:
            self.auth.require_authenticated(user, path)
            group = discovery.api_group(path.split("/")[2])
            if group is None:
                raise errors.resource_not_found()
            return json_response(group)
        route = routing.parse(path)
        if route.rtype is None:
            self.auth.require_authenticated(user, path)
            if request.method != "GET":
                raise errors.method_not_allowed(f"{request.method} is not allowed on {path}")
            return json_response(discovery.api_resource_list(route.group, route.version))
        return self.serve_resource(request, route)

    @staticmethod
    def serve_openapi(path: str) -> Response:
        if path == "/openapi/v3":
            return json_response(openapi.root())
        body = openapi.document(path[len("/openapi/v3/"):])
        if body is None:
            raise errors.resource_not_found()
        return Response(body, content_type="application/json")

    def serve_resource(self, request: Request, route: routing.Route) -> Response:
        verb = _verb(request.method, route, request)
        self.auth.authorize(request.environ[auth.USER_KEY], verb, route)
        decision = self.faults.decide(verb, route.rtype.plural, route.name)
        if decision.latency_seconds:
            time.sleep(decision.latency_seconds)   # the injected latency itself, not a test wait
        if decision.error:
            raise decision.error
        sim = self.sim
        if verb == "get":
            if tables.wants_table(request) and route.subresource is None:
                obj = sim.store.require(route.rtype, route.namespace, route.name)
                return json_response(tables.table(route.rtype, [obj], sim.store.resource_version,
                                                  sim.clock.now(), request))
            return handlers.get(sim, route)
        if verb == "list":
            if tables.wants_table(request):
                # kubectl pages its tables too (--chunk-size, 500 by default).
                items, meta = handlers.list_page(sim, route, request)
                return json_response(tables.table(route.rtype, items, int(meta["resourceVersion"]),
                                                  sim.clock.now(), request, list_meta=meta))
            return handlers.list_objects(sim, route, request)
        if verb == "watch":
            return watch.watch(sim, route, request, self.stopping, decision.drop_watch_after,
                               on_drop=self.faults.watch_dropped)
        if verb == "create":
            if route.subresource == "eviction":
                return subresources.evict(sim, route, request)
            if route.subresource == "binding":
                return subresources.bind(sim, route, request)
            return handlers.create(sim, route, request)
        if verb == "update":
            return handlers.update(sim, route, request)
        if verb == "patch":
            return handlers.patch(sim, route, request)
        if verb == "delete":
            return handlers.delete(sim, route, request)
        return handlers.delete_collection(sim, route, request)
