"""PATCH bodies in the three content types kube-apiserver accepts from clients.

- application/json-patch+json: RFC 6902 through the `jsonpatch` library. As in
  staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go, a body that is not a
  JSON array is 400 BadRequest and a patch that does not apply (a failed `test` op, a
  missing path, an unknown op) is 422 Invalid.
- application/merge-patch+json: RFC 7386.
- application/strategic-merge-patch+json: merge semantics plus the list merge keys and
  `$patch` directives of k8s.io/apimachinery/pkg/util/strategicpatch, for the fields
  the built-in types declare. Custom resources refuse it with 415, as upstream does.
"""
from __future__ import annotations

import jsonpatch
import jsonpointer
import orjson

from . import errors

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"   # server-side apply: api/handlers.py and fieldmanager.py
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)
CUSTOM_RESOURCE_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH)

# patchMergeKey of the list fields (k8s.io/api struct tags) the product touches.
_MERGE_KEYS = {
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "conditions": "type",
    "addresses": "type",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
# Lists of scalars with patchStrategy "merge": a patch adds to the set.
_PRIMITIVE_MERGE = {"finalizers"}
_CONTAINER_LISTS = {"containers", "initContainers", "ephemeralContainers"}


def apply_patch(current: dict, body: bytes, content_type: str, *, builtin: bool = True) -> dict:
    """The patched object (a new dict; `current` is left alone)."""
    content_type = (content_type or "").split(";")[0].strip()
    accepted = PATCH_TYPES if builtin else CUSTOM_RESOURCE_PATCH_TYPES
    if content_type not in accepted:
        if content_type in PATCH_TYPES:
            # A patch type the route takes but this kind does not (strategic merge on a
            # custom resource): the patch handler's own refusal.
            raise errors.unsupported_media_type(content_type, [*accepted, APPLY_PATCH])
        # Anything else is refused by the route before any handler (go-restful's Consumes).
        raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type")
    # The strategic-merge path decodes the body itself and reports Go's error bare.
    patch = _decode(body, prefix="" if content_type == STRATEGIC_MERGE_PATCH else "error decoding patch: ")
    if content_type == JSON_PATCH:
        return _json_patch(current, patch)
    if not isinstance(patch, dict):
        raise errors.bad_request(f"error decoding patch: json: cannot unmarshal {_go_json_kind(patch)} into Go value "
                                 "of type map[string]interface {}")
    if content_type == MERGE_PATCH:
        return merge_patch(current, patch)
    return strategic_merge(current, patch)


def _decode(body: bytes, *, prefix: str):
    try:
        return orjson.loads(body or b"")
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"{prefix}{exc}") from None


def _go_json_kind(value) -> str:
    """How Go's encoding/json names a JSON value it cannot unmarshal."""
    return {dict: "object", list: "array", str: "string", bool: "bool", type(None): "null"}.get(type(value), "number")


def _json_patch(current: dict, patch) -> dict:
    if not isinstance(patch, list):
        raise errors.bad_request(f"error decoding patch: json: cannot unmarshal {_go_json_kind(patch)} into Go value "
                                 "of type []handlers.jsonPatchOp")
    if not all(isinstance(op, dict) for op in patch):
        bad = next(op for op in patch if not isinstance(op, dict))
        raise errors.bad_request(f"error decoding patch: json: cannot unmarshal {_go_json_kind(bad)} into Go value "
                                 "of type handlers.jsonPatchOp")
    try:
        return jsonpatch.JsonPatch(patch).apply(current, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError):
        # kube-apiserver names no cause: the client sees only this sentence.
        raise errors.request_entity_invalid("the server rejected our request due to an error in our "
                                            "request") from None


def merge_patch(target, patch):
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(original: dict, patch: dict) -> dict:
    return _merge_map(original, patch, parent="")


def _strip(value):
    """A patch value stored as is: directives removed."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


def _directive(patch: dict) -> str | None:
    kind = patch.get("$patch")
    if kind not in (None, "replace", "delete", "merge"):
        raise errors.bad_request(f"unknown patch type: {kind!r} in $patch (want replace, delete or merge)")
    return kind


def _merge_map(original, patch: dict, parent: str) -> dict:
    if _directive(patch) == "replace":
        return _strip(patch)
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = set(map(orjson.dumps, value or []))
            result[field] = [v for v in result.get(field) or [] if orjson.dumps(v) not in drop]
            continue
        if key.startswith("$"):
            continue   # $patch handled above, $setElementOrder below; $retainKeys is not modelled
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if _directive(value) == "delete":
                result.pop(key, None)
            else:
                result[key] = _merge_map(result.get(key), value, key)
        elif isinstance(value, list) and key in _PRIMITIVE_MERGE:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = _element_order(merged, value, result.get(key) or [], None)
        elif isinstance(value, list) and (merge_key := _merge_key(key, parent)):
            result[key] = _merge_list(result.get(key), value, key, merge_key)
        else:
            result[key] = _strip(value)
    for key, order in patch.items():
        field = key.split("/", 1)[1] if key.startswith("$setElementOrder/") else None
        if field and isinstance(order, list) and isinstance(result.get(field), list):
            live = original.get(field) if isinstance(original, dict) else None
            result[field] = _element_order(result[field], order, live if isinstance(live, list) else [],
                                           None if field in _PRIMITIVE_MERGE else _merge_key(field, parent))
    return result


def _element_order(merged: list, order: list, original: list, merge_key: str | None) -> list:
    """normalizeElementOrder (strategicpatch/patch.go): the items named by `order` (the
    patch's list, or its $setElementOrder) in that order, the server's other items
    interleaved only where the live list put them before a patch item — so new items
    come first, not appended."""
    def key(item):
        return orjson.dumps(item.get(merge_key) if merge_key and isinstance(item, dict) else item)
    in_order = {key(item): i for i, item in enumerate(order)}
    live_at = {key(item): i for i, item in enumerate(original)}
    from_patch = sorted((m for m in merged if key(m) in in_order), key=lambda m: in_order[key(m)])
    server_only = [m for m in merged if key(m) not in in_order]
    out, i, j = [], 0, 0
    while i < len(server_only) or j < len(from_patch):
        if j >= len(from_patch) or (i < len(server_only) and key(server_only[i]) in live_at
                                    and key(from_patch[j]) in live_at
                                    and live_at[key(server_only[i])] < live_at[key(from_patch[j])]):
            out.append(server_only[i])
            i += 1
        else:
            out.append(from_patch[j])
            j += 1
    return out


def _merge_key(field: str, parent: str) -> str | None:
    if field == "ports":
        return "containerPort" if parent in _CONTAINER_LISTS else "port"
    return _MERGE_KEYS.get(field)


def _merge_list(original, patch: list, field: str, merge_key: str) -> list:
    if any(isinstance(item, dict) and _directive(item) == "replace" for item in patch):
        return [_strip(item) for item in patch if not (isinstance(item, dict) and "$patch" in item)]
    result = list(original) if isinstance(original, list) else []
    for item in patch:
        if not isinstance(item, dict):
            raise errors.bad_request(f"{field}: a strategic merge patch of this list needs objects "
                                     f"with the merge key {merge_key!r}, got {item!r}")
        if merge_key not in item:
            raise errors.bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        position = next((i for i, old in enumerate(result)
                         if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None)
        if _directive(item) == "delete":
            result = [old for old in result if not (isinstance(old, dict) and old.get(merge_key) == item[merge_key])]
        elif position is None:
            result.append(_strip(item))
        else:
            result[position] = _merge_map(result[position], item, field)
    kept = [item for item in patch if isinstance(item, dict) and _directive(item) != "delete"]
    return _element_order(result, kept, list(original) if isinstance(original, list) else [], merge_key)
