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
        raise errors.unsupported_media_type(content_type, [*accepted, APPLY_PATCH])
    patch = _decode(body)
    if content_type == JSON_PATCH:
        return _json_patch(current, patch)
    if not isinstance(patch, dict):
        raise errors.bad_request("invalid JSON document: a merge patch must be a JSON object")
    if content_type == MERGE_PATCH:
        return merge_patch(current, patch)
    return strategic_merge(current, patch)


def _decode(body: bytes):
    try:
        return orjson.loads(body or b"")
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"error decoding patch: {exc}") from None


def _json_patch(current: dict, patch) -> dict:
    if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
        raise errors.bad_request("json: cannot unmarshal into Go value of type jsonpatch.Patch: "
                                 "a JSON patch must be an array of operation objects")
    try:
        return jsonpatch.JsonPatch(patch).apply(current, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError) as exc:
        raise errors.request_entity_invalid(f"the server rejected our request due to an error in our request: "
                                            f"{exc}") from None


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
            continue   # $patch handled above; $setElementOrder and $retainKeys are only ordering hints here
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
            result[key] = merged
        elif isinstance(value, list) and (merge_key := _merge_key(key, parent)):
            result[key] = _merge_list(result.get(key), value, key, merge_key)
        else:
            result[key] = _strip(value)
    return result


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
    return result
