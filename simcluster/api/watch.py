"""WATCH: a chunked stream of newline-separated {"type", "object"} events.

- No resourceVersion (or "0"): synthetic ADDED events for what exists, then changes.
- A resourceVersion: the changes after it; 410 Expired as an ERROR event when the
  history no longer reaches back that far (the client re-lists).
- With a label or field selector an object that starts matching arrives as ADDED and
  one that stops matching as DELETED, as the watch cache does.
- `timeoutSeconds` and dropped-watch faults count wall-clock time: they are about the
  connection, not about the simulated cluster.
"""
from __future__ import annotations

import threading
import time

import orjson
from werkzeug.wrappers import Request, Response

from .. import errors
from ..selectors import parse_field_selector, parse_label_selector
from ..sim import Simulation
from .http import JSON
from .routing import Route

DEFAULT_TIMEOUT_SECONDS = 1800      # kube-apiserver picks 30-60 min at random
BOOKMARK_INTERVAL_SECONDS = 5.0     # wall seconds between bookmarks when they are asked for
POLL_SECONDS = 0.5                  # how often an idle watch looks at the stop flag


def _line(event_type: str, obj: dict) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def _flag(request: Request, name: str) -> bool:
    return request.args.get(name, "").lower() in ("true", "1")


def watch(sim: Simulation, route: Route, request: Request, stopping: threading.Event,
          drop_after: float | None = None, on_drop=None) -> Response:
    rtype, namespace = route.rtype, route.namespace
    label_selector, field_selector = request.args.get("labelSelector"), request.args.get("fieldSelector")
    label_match = parse_label_selector(label_selector)
    field_match, _ = parse_field_selector(field_selector, rtype.plural)
    try:
        timeout = float(request.args.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
    except ValueError:
        raise errors.bad_request(f"timeoutSeconds must be a number, got {request.args['timeoutSeconds']!r}") from None
    dropped = drop_after is not None and drop_after < timeout
    if drop_after is not None:
        timeout = min(timeout, drop_after)
    bookmarks = _flag(request, "allowWatchBookmarks")
    rv_param = request.args.get("resourceVersion") or ""
    send_initial = rv_param in ("", "0") or _flag(request, "sendInitialEvents")

    def matches(obj: dict) -> bool:
        meta = obj["metadata"]
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        if label_match and not label_match(meta.get("labels") or {}):
            return False
        return not field_match or field_match(obj)

    store = sim.store
    with store.lock:
        current, list_rv = store.list(rtype, namespace, label_selector=label_selector, field_selector=field_selector)
        if send_initial:
            start_rv = list_rv
        else:
            try:
                start_rv = int(rv_param)
            except ValueError:
                raise errors.bad_request(f"resourceVersion must be an integer, got {rv_param!r}") from None

    def stream():
        # An empty first chunk makes Werkzeug send the headers now, as kube-apiserver
        # does, so a client knows the watch is open before any event.
        yield b""
        if send_initial:
            for obj in current:
                yield _line("ADDED", obj)
            if _flag(request, "sendInitialEvents"):
                yield _bookmark(rtype, start_rv, initial_events_end=True)
        rv = start_rv
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + BOOKMARK_INTERVAL_SECONDS
        while not stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if dropped and on_drop is not None:
                    on_drop()
                return
            try:
                events = store.events_since(rv)
            except errors.ApiError as exc:   # 410: fell out of the history
                yield _line("ERROR", exc.status())
                return
            for event in events:
                rv = event.rv
                if event.key != rtype.key:
                    continue
                now_matches = matches(event.obj)
                did_match = event.old is not None and matches(event.old)
                if event.type == "DELETED":
                    if now_matches or did_match:
                        yield _line("DELETED", event.obj)
                elif now_matches:
                    yield _line("MODIFIED" if did_match else "ADDED", event.obj)
                elif did_match:
                    # Left the selection: the watch cache reports it as deleted.
                    yield _line("DELETED", event.obj)
            if not events:
                if bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + BOOKMARK_INTERVAL_SECONDS
                    yield _bookmark(rtype, rv)
                store.wait(rv, min(POLL_SECONDS, remaining))

    return Response(stream(), content_type=JSON, direct_passthrough=True)


def _bookmark(rtype, rv: int, initial_events_end: bool = False) -> bytes:
    meta: dict = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _line("BOOKMARK", {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta})

