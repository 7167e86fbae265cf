"""OpenAPI v3 documents (`/openapi/v3` and one per group version), enough for kubectl.

kubectl 1.32 reads them for two things, both by GroupVersionKind:
- validation: a kind listed in its group version's schemas (`x-kubernetes-group-version-kind`)
  is validated by the server (`fieldValidation` on the request), not by kubectl;
- client-side `apply`: a PATCH operation whose request body lists
  `application/strategic-merge-patch+json` makes kubectl compute the patch from these
  schemas. The schemas here are permissive (an object per kind that keeps unknown
  fields, with no list merge keys), so no PATCH lists it: kubectl then builds the
  strategic merge patch of a built-in kind from its own compiled-in types (the same
  merge keys the API server uses) and a JSON merge patch for custom resources, exactly
  as it does against a real cluster (staging/src/k8s.io/kubectl/pkg/cmd/apply/patcher.go).

`/openapi/v2` is not served: kubectl accepts only its protobuf form and needs it only
when `/openapi/v3` is missing.
"""
from __future__ import annotations

import functools
import hashlib

import orjson

from ..resources import RESOURCE_TYPES, ResourceType
from .discovery import GIT_VERSION

# Package names kube-openapi gives the built-in groups' schemas (io.k8s.api.<pkg>.<version>.<Kind>).
_BUILTIN_PACKAGES = {"": "core", "apps": "apps", "policy": "policy", "events.k8s.io": "events",
                     "rbac.authorization.k8s.io": "rbac"}
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
# What the server accepts on PATCH: see the module docstring for why strategic merge is not listed.
_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")


def schema_name(rtype: ResourceType, kind: str | None = None) -> str:
    kind = kind or rtype.kind
    if rtype.group in _BUILTIN_PACKAGES:
        return f"io.k8s.api.{_BUILTIN_PACKAGES[rtype.group]}.{rtype.version}.{kind}"
    # CRDs: the group reversed, as the apiextensions server names them.
    return f"{'.'.join(reversed(rtype.group.split('.')))}.{rtype.version}.{kind}"


def _gvk(rtype: ResourceType, kind: str | None = None) -> dict:
    return {"group": rtype.group, "version": rtype.version, "kind": kind or rtype.kind}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _open_object(description: str) -> dict:
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def _kind_schema(rtype: ResourceType) -> dict:
    return {
        "type": "object",
        "description": f"{rtype.kind} ({rtype.api_version}): fields beyond apiVersion, kind and metadata "
                       "are not described by this server.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"allOf": [_ref(OBJECT_META)], "default": {}},
            "spec": _open_object("the desired state"),
            "status": _open_object("the observed state"),
        },
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-group-version-kind": [_gvk(rtype)],
    }


def _list_schema(rtype: ResourceType) -> dict:
    return {
        "type": "object", "required": ["items"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "items": {"type": "array", "items": {"allOf": [_ref(schema_name(rtype))], "default": {}}},
                       "metadata": {"allOf": [_ref(LIST_META)], "default": {}}},
        "x-kubernetes-group-version-kind": [_gvk(rtype, rtype.list_kind)],
    }


def _parameter(name: str, where: str = "query", required: bool = False) -> dict:
    return {"name": name, "in": where, "required": required, "schema": {"type": "string"}}


def _json_body(schema: str) -> dict:
    return {"application/json": {"schema": _ref(schema)}}


def _operation(rtype: ResourceType, action: str, op_id: str, *, body: str | None = None,
               patch: bool = False, query: tuple[str, ...] = ()) -> dict:
    result = schema_name(rtype, rtype.list_kind if action in ("list", "deletecollection") else None)
    operation: dict = {
        "operationId": op_id,
        "parameters": [_parameter(q) for q in query],
        "responses": {"200": {"description": "OK", "content": _json_body(result)},
                      "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rtype),
    }
    if body:
        operation["requestBody"] = {"content": _json_body(body), "required": True}
    if patch:
        operation["requestBody"] = {"content": {t: {"schema": {"type": "object"}} for t in _PATCH_TYPES},
                                    "required": True}
    return operation


def _paths(rtype: ResourceType) -> dict:
    prefix = f"/apis/{rtype.group}/{rtype.version}" if rtype.group else "/api/v1"
    scope = f"{prefix}/namespaces/{{namespace}}" if rtype.namespaced else prefix
    op = f"{rtype.kind}{rtype.group.replace('.', '')}{rtype.version}"
    write = ("dryRun", "fieldManager", "fieldValidation")
    path_params = [_parameter("namespace", "path", True)] if rtype.namespaced else []
    collection = {
        "get": _operation(rtype, "list", f"list{op}", query=("labelSelector", "fieldSelector", "limit", "continue",
                                                             "resourceVersion", "watch")),
        "post": _operation(rtype, "post", f"create{op}", body=schema_name(rtype), query=write),
        "delete": _operation(rtype, "deletecollection", f"deletecollection{op}", query=("labelSelector",)),
        "parameters": path_params,
    }
    item = {
        "get": _operation(rtype, "get", f"read{op}"),
        "put": _operation(rtype, "put", f"replace{op}", body=schema_name(rtype), query=write),
        "patch": _operation(rtype, "patch", f"patch{op}", patch=True, query=write + ("force",)),
        "delete": _operation(rtype, "delete", f"delete{op}", query=("dryRun", "gracePeriodSeconds",
                                                                    "propagationPolicy")),
        "parameters": path_params + [_parameter("name", "path", True)],
    }
    paths = {f"{scope}/{rtype.plural}": collection, f"{scope}/{rtype.plural}/{{name}}": item}
    if rtype.namespaced:
        paths[f"{prefix}/{rtype.plural}"] = {"get": _operation(rtype, "list", f"list{op}ForAllNamespaces")}
    return paths


def _group_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def _documents() -> dict[str, bytes]:
    """Each served group version's document, keyed by its path under /openapi/v3/."""
    by_gv: dict[tuple[str, str], list[ResourceType]] = {}
    for rtype in RESOURCE_TYPES:
        by_gv.setdefault((rtype.group, rtype.version), []).append(rtype)
    documents = {}
    for (group, version), rtypes in by_gv.items():
        schemas = {OBJECT_META: _open_object("ObjectMeta: name, namespace, labels, annotations and the rest"),
                   LIST_META: _open_object("ListMeta: resourceVersion, continue, remainingItemCount"),
                   STATUS: _open_object("Status: the result of an operation that returns no object")}
        paths: dict = {}
        for rtype in rtypes:
            schemas[schema_name(rtype)] = _kind_schema(rtype)
            schemas[schema_name(rtype, rtype.list_kind)] = _list_schema(rtype)
            paths.update(_paths(rtype))
        document = {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": GIT_VERSION},
                    "paths": paths, "components": {"schemas": schemas}}
        documents[_group_path(group, version)] = orjson.dumps(document)
    return documents


def root() -> dict:
    """GET /openapi/v3: where each group version's document is, with its content hash
    (clients cache documents by it)."""
    return {"paths": {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(path)}"}
                      for path in _documents()}}


@functools.cache
def _hash(path: str) -> str:
    return hashlib.sha512(_documents()[path]).hexdigest().upper()


def document(path: str) -> bytes | None:
    """The document at /openapi/v3/<path>, or None when no group version is served there."""
    return _documents().get(path)
