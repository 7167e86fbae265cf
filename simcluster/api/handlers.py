"""GET, LIST, CREATE, UPDATE, PATCH, DELETE and DELETECOLLECTION on stored objects."""
from __future__ import annotations

import base64

import orjson
from werkzeug.wrappers import Request, Response

from .. import errors, fieldmanager
from ..patching import APPLY_PATCH, apply_patch
from ..resources import NAMESPACES, PODS, RESOURCE_TYPES, ResourceType
from ..sim import Simulation
from ..store import ExpiredView, copy
from . import subresources
from .http import JSON, dry_run, json_response, read_object
from .routing import Route

# Groups kube-apiserver serves itself; everything else is a custom resource in a real
# cluster (no strategic merge patch, DELETE answers with the object).
BUILTIN_GROUPS = {"", "apps", "policy", "events.k8s.io", "rbac.authorization.k8s.io"}


# Registries with ReturnDeletedObject (pkg/registry/core/{pod,service}/storage): an
# immediate DELETE answers with the deleted object, not a Status.
_RETURN_DELETED_OBJECT = {("", "pods"), ("", "services")}


def is_builtin(rtype: ResourceType) -> bool:
    return rtype.group in BUILTIN_GROUPS


# ---- reads -------------------------------------------------------------------------
def get(sim: Simulation, route: Route) -> Response:
    obj = sim.store.require(route.rtype, route.namespace, route.name)
    if route.subresource == "scale":
        return json_response(subresources.scale_of(route.rtype, obj))
    if route.subresource not in (None, "status"):
        raise errors.method_not_allowed(f"GET is not supported on {route.rtype.plural}/{route.subresource}")
    return json_response(obj)


# Continue tokens are shaped as k8s.io/apiserver/pkg/storage's: base64 (URL alphabet, no
# padding) of {"v": "meta.k8s.io/v1", "rv": <the list's resourceVersion>, "start": <key>},
# here the key being the last (namespace, name) returned. rv -1 means "at the latest
# version": the token a 410 offers for an inconsistent remainder.
_TOKEN_VERSION = "meta.k8s.io/v1"

# storage/etcd3/errors.go: a continue token whose revision etcd has compacted.
CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter.")
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of "
    "the results. Continuing with the provided token results in an inconsistent list - objects that were "
    "created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    token = orjson.dumps({"v": _TOKEN_VERSION, "rv": rv, "start": list(key)})
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """(resourceVersion, last key) of a token this server issued; 400 otherwise."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        if data.get("v") != _TOKEN_VERSION:
            raise ValueError("unknown token version")
        rv = data["rv"]
        namespace, name = data["start"]
        if not isinstance(rv, int) or isinstance(rv, bool) or rv < -1 or rv == 0:
            raise ValueError("bad resourceVersion")
        return rv, (str(namespace), str(name))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise errors.bad_request(f"continue key is not valid: {token!r} is not a token this server issued") from None


def _int_param(request: Request, name: str, default: int | None = None) -> int | None:
    raw = request.args.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.bad_request(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise errors.bad_request(f"{name} must be >= 0, got {value}")
    return value


def list_page(sim: Simulation, route: Route, request: Request) -> tuple[list[dict], dict]:
    """The items of a LIST (one page of it with `limit`) and its ListMeta.

    A first page reads at the store's current resourceVersion; its continue token
    carries that version and the last key returned, so each further page resumes there
    and sees the objects as they stood at that version (etcd's range read at a
    revision), whatever was written between the pages. Once the history no longer
    reaches back to that version the token answers 410 Expired, with a token that
    continues at the latest version, as kube-apiserver does after an etcd compaction.
    """
    token = request.args.get("continue")
    at_rv, after = (None, None)
    if token:
        rv, after = _decode_continue(token)
        at_rv = None if rv == -1 else rv
        if at_rv is not None and at_rv > sim.store.resource_version:
            raise errors.bad_request(f"continue key is not valid: resourceVersion {at_rv} has not happened yet")
    limit = _int_param(request, "limit", 0)
    try:
        page = sim.store.list_page(route.rtype, route.namespace,
                                   label_selector=request.args.get("labelSelector"),
                                   field_selector=request.args.get("fieldSelector"),
                                   limit=limit, after=after, at_rv=at_rv)
    except ExpiredView:
        raise errors.ApiError(410, "Expired", INCONSISTENT_CONTINUE,
                              list_meta={"continue": _encode_continue(-1, after)}) from None
    meta: dict = {"resourceVersion": str(page.rv)}
    if page.last_key is not None:
        meta["continue"] = _encode_continue(page.rv, page.last_key)
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
    return page.items, meta


# A LIST body bigger than this goes out in pieces about this size, each joined from the
# items' kept JSON as it is sent: the pieces stay in the processor's cache, where one
# joined copy of a 50,000-pod list (65 MB) would not, and the body is never held whole.
_PIECE_BYTES = 1 << 18


def list_objects(sim: Simulation, route: Route, request: Request) -> Response:
    rtype = route.rtype
    items, meta = list_page(sim, route, request)
    # The same bytes as orjson.dumps of the whole list, with each item's JSON taken from
    # the store's per-version cache.
    head = orjson.dumps({"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta})
    parts = sim.store.encode_items(rtype, items)
    if not parts:
        return Response(head[:-1] + b',"items":[]}', content_type=JSON)
    # The list's opening and closing go with its first and last items, not as writes of their own.
    parts[0] = head[:-1] + b',"items":[' + parts[0]
    parts[-1] = parts[-1] + b"]}"
    length = sum(map(len, parts)) + len(parts) - 1
    if length <= _PIECE_BYTES:
        return Response(b",".join(parts), content_type=JSON)
    return Response(_pieces(parts), content_type=JSON, headers={"Content-Length": str(length)})


def _pieces(parts: list[bytes]):
    start, size = 0, 0
    for at, part in enumerate(parts):
        size += len(part) + 1
        if size >= _PIECE_BYTES or at == len(parts) - 1:
            piece = parts[start:at + 1]
            if start:
                piece.insert(0, b"")   # the comma after the previous piece's last item
            yield b",".join(piece)
            start, size = at + 1, 0


# ---- writes ------------------------------------------------------------------------
def _check_type(rtype: ResourceType, body: dict) -> None:
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if api_version and api_version != rtype.api_version:
        raise errors.bad_request(f"the API version in the data ({api_version}) does not match the expected "
                                 f"API version ({rtype.api_version})")
    if kind and kind != rtype.kind:
        raise errors.bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rtype.kind})")


def _check_namespace(route: Route, body: dict) -> None:
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise errors.bad_request("metadata must be a JSON object")
    if route.rtype.namespaced:
        given = meta.get("namespace")
        if given and given != route.namespace:
            raise errors.bad_request("the namespace of the provided object does not match the namespace "
                                     f"sent on the request ({given!r} != {route.namespace!r})")
        meta["namespace"] = route.namespace


def require_namespace(sim: Simulation, namespace: str | None) -> None:
    if namespace is not None and sim.store.get(NAMESPACES, None, namespace) is None:
        raise errors.not_found("namespaces", namespace)


def _prepare_for_create(rtype: ResourceType, body: dict) -> None:
    """What the registries' PrepareForCreate and defaulting do that readers rely on."""
    meta = body["metadata"]
    if rtype is NAMESPACES:
        if meta.get("name"):
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        body.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        body["status"] = {"phase": "Active"}
    elif rtype is PODS:
        spec = body.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        body["status"] = {"phase": "Pending"}


def manager(request: Request) -> str:
    """Who a write is recorded under in metadata.managedFields."""
    field_manager = request.args.get("fieldManager")
    fieldmanager.check_field_manager(field_manager, required=False)
    return fieldmanager.manager_of(field_manager, request.headers.get("User-Agent"))


def create(sim: Simulation, route: Route, request: Request) -> Response:
    body = read_object(request)
    _check_type(route.rtype, body)
    _check_namespace(route, body)
    _prepare_for_create(route.rtype, body)
    fieldmanager.record_update(route.rtype, None, body, manager=manager(request), now=sim.clock.now())
    with sim.store.lock:
        require_namespace(sim, route.namespace)
        created = sim.store.create(route.rtype, body, dry_run=dry_run(request))
    return json_response(created, 201)


def _check_name(route: Route, body: dict) -> None:
    name = body["metadata"].get("name")
    if name != route.name:
        raise errors.bad_request(f"the name of the object ({name}) does not match the name on the URL ({route.name})")


def update(sim: Simulation, route: Route, request: Request) -> Response:
    body = read_object(request)
    if route.subresource == "scale":
        return json_response(subresources.scale_update(sim, route, body, dry_run=dry_run(request),
                                                       manager=manager(request)))
    _check_type(route.rtype, body)
    _check_namespace(route, body)
    _check_name(route, body)
    return json_response(_store_update(sim, route, body, dry_run(request), check_rv=True, manager=manager(request)))


def _store_update(sim: Simulation, route: Route, obj: dict, dry: bool, *, check_rv: bool, manager: str) -> dict:
    if route.subresource not in (None, "status"):
        raise errors.method_not_allowed(f"updates are not supported on {route.rtype.plural}/{route.subresource}")
    with sim.store.lock:
        old = sim.store.require(route.rtype, route.namespace, route.name)
        if route.subresource == "status":
            # Ownership is worked out on the object as the status write leaves it.
            view = copy(old)
            view["status"] = obj.get("status", {})
            view["metadata"].pop("managedFields", None)
            if "managedFields" in (obj.get("metadata") or {}):
                view["metadata"]["managedFields"] = obj["metadata"]["managedFields"]
            fieldmanager.record_update(route.rtype, old, view, manager=manager, now=sim.clock.now(),
                                       subresource="status")
            obj = dict(obj, metadata=dict(obj.get("metadata") or {},
                                          managedFields=view["metadata"].get("managedFields") or []))
            return sim.store.update(route.rtype, obj, subresource="status", check_rv=check_rv, dry_run=dry)
        fieldmanager.record_update(route.rtype, old, obj, manager=manager, now=sim.clock.now())
        return sim.store.update(route.rtype, obj, preserve_status="status" in route.rtype.subresources,
                                check_rv=check_rv, dry_run=dry)


def patch(sim: Simulation, route: Route, request: Request) -> Response:
    body = request.get_data(cache=True)
    content_type = request.headers.get("Content-Type", "")
    if content_type.split(";")[0].strip() == APPLY_PATCH:
        return server_side_apply(sim, route, request)
    if "force" in request.args:
        raise errors.bad_request("force is only allowed with server-side apply (application/apply-patch+yaml)")
    dry = dry_run(request)
    who = manager(request)
    builtin = is_builtin(route.rtype) or route.subresource == "scale"
    # The lock makes read-patch-write atomic, so a patch never fails on a concurrent write
    # (kube-apiserver retries such patches itself).
    with sim.store.lock:
        current = sim.store.require(route.rtype, route.namespace, route.name)
        if route.subresource == "scale":
            scale = subresources.scale_of(route.rtype, current)
            patched = apply_patch(scale, body, content_type, builtin=builtin)
            if not isinstance(patched, dict):
                raise errors.request_entity_invalid("the patched Scale is not a JSON object")
            return json_response(subresources.scale_update(sim, route, patched, dry_run=dry, manager=who))
        patched = apply_patch(current, body, content_type, builtin=builtin)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise errors.request_entity_invalid("the patched object is not a JSON object with metadata")
        _check_name(route, patched)
        if route.rtype.namespaced and patched["metadata"].get("namespace") != route.namespace:
            raise errors.bad_request("the namespace of the object cannot be changed by a patch")
        return json_response(_store_update(sim, route, patched, dry, check_rv=True, manager=who))


def _bool_param(request: Request, name: str) -> bool:
    raw = request.args.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0", ""):
        raise errors.bad_request(f"{name} must be true or false, got {raw!r}")
    return raw in ("true", "1")


def server_side_apply(sim: Simulation, route: Route, request: Request) -> Response:
    """PATCH with application/apply-patch+yaml: create or merge the caller's fields
    (see simcluster/fieldmanager.py for what ownership covers)."""
    if route.subresource is not None:
        raise errors.bad_request(f"server-side apply to {route.rtype.plural}/{route.subresource} is not modelled "
                                 "by simcluster; apply to the object itself")
    field_manager = request.args.get("fieldManager")
    fieldmanager.check_field_manager(field_manager, required=True)
    force = _bool_param(request, "force")
    dry = dry_run(request)
    applied = fieldmanager.parse_applied(request.get_data(cache=True), route.rtype, route.name)
    _check_namespace(route, applied)
    now = sim.clock.now()
    with sim.store.lock:
        live = sim.store.get(route.rtype, route.namespace, route.name)
        if live is None:
            require_namespace(sim, route.namespace)
            obj = fieldmanager.apply(route.rtype, None, applied, manager=field_manager, force=force, now=now)
            _prepare_for_create(route.rtype, obj)
            return json_response(sim.store.create(route.rtype, obj, dry_run=dry), 201)
        merged = fieldmanager.apply(route.rtype, live, applied, manager=field_manager, force=force, now=now)
        return json_response(sim.store.update(route.rtype, merged, preserve_status="status" in route.rtype.subresources,
                                              check_rv=True, dry_run=dry))


# ---- deletes -----------------------------------------------------------------------
def _delete_options(request: Request) -> dict:
    options: dict = {}
    if request.get_data(cache=True):
        options = read_object(request, "DeleteOptions body")
    args = request.args
    if "propagationPolicy" in args:
        options["propagationPolicy"] = args["propagationPolicy"]
    if "gracePeriodSeconds" in args:
        options["gracePeriodSeconds"] = _int_param(request, "gracePeriodSeconds")
    if "orphanDependents" in args:
        options["orphanDependents"] = args["orphanDependents"] == "true"
    if options.get("orphanDependents") is not None and "propagationPolicy" not in options:
        options["propagationPolicy"] = "Orphan" if options["orphanDependents"] else "Background"
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        raise errors.invalid("DeleteOptions", "", [("gracePeriodSeconds",
                             f"Invalid value: {grace}: must be >= 0")])
    return options


def _delete_one(sim: Simulation, rtype: ResourceType, namespace: str | None, name: str,
                options: dict, dry: bool) -> tuple[dict, bool]:
    """Delete one object; returns its state afterwards and whether it is gone."""
    if rtype is NAMESPACES:
        return _delete_namespace(sim, name, dry), True
    after = sim.store.delete(rtype, namespace, name,
                             propagation=options.get("propagationPolicy"),
                             grace_seconds=options.get("gracePeriodSeconds"),
                             preconditions=options.get("preconditions"), dry_run=dry)
    still = sim.store.get(rtype, namespace, name)
    gone = still is None or still["metadata"].get("uid") != after["metadata"].get("uid")
    return after, gone and not dry


def _delete_namespace(sim: Simulation, name: str, dry: bool) -> dict:
    """The namespace and everything in it go at once: the namespace controller's work
    (a Terminating phase while contents drain) is not modelled."""
    with sim.store.lock:
        namespace = sim.store.require(NAMESPACES, None, name)
        if dry:
            return namespace
        for rtype in RESOURCE_TYPES:
            if rtype.namespaced:
                for obj in sim.store.all(rtype, name):
                    sim.store.remove(rtype, name, obj["metadata"]["name"])
        return sim.store.remove(NAMESPACES, None, name)


def delete(sim: Simulation, route: Route, request: Request) -> Response:
    if route.subresource is not None:
        raise errors.method_not_allowed(f"DELETE is not supported on {route.rtype.plural}/{route.subresource}")
    options = _delete_options(request)
    dry = dry_run(request) or options.get("dryRun") == ["All"]
    rtype = route.rtype
    after, gone = _delete_one(sim, rtype, route.namespace, route.name, options, dry)
    if not gone or not is_builtin(rtype) or (rtype.group, rtype.plural) in _RETURN_DELETED_OBJECT:
        return json_response(after)
    # Other built-in registries answer an immediate delete with a Success Status.
    return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "details": {"name": route.name, "group": rtype.group, "kind": rtype.plural,
                                      "uid": after["metadata"].get("uid")}})


def delete_collection(sim: Simulation, route: Route, request: Request) -> Response:
    options = _delete_options(request)
    dry = dry_run(request) or options.get("dryRun") == ["All"]
    rtype = route.rtype
    items, _ = sim.store.list(rtype, route.namespace, label_selector=request.args.get("labelSelector"),
                              field_selector=request.args.get("fieldSelector"))
    deleted = []
    for obj in items:
        meta = obj["metadata"]
        try:
            after, _ = _delete_one(sim, rtype, meta.get("namespace"), meta["name"], options, dry)
        except errors.ApiError as exc:
            if exc.code != 404:   # deleted meanwhile (a cascade): nothing to do
                raise
            continue
        deleted.append(after)
    return json_response({"kind": rtype.list_kind, "apiVersion": rtype.api_version,
                          "metadata": {"resourceVersion": str(sim.store.resource_version)}, "items": deleted})

