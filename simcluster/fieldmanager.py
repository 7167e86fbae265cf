"""Field ownership (`metadata.managedFields`) and server-side apply, after
staging/src/k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager and structured-merge-diff.

What is modelled:
- Every write through the API (create, update, patch, the scale and status subresources)
  gives its manager (`?fieldManager=`, else the User-Agent up to its first "/") an
  `Update` entry owning the fields it changed; other managers lose those fields.
- Server-side apply (`application/apply-patch+yaml`, `fieldManager` required) creates
  the object or merges the applied configuration into it: maps merge key by key, the
  manager's `Apply` entry becomes exactly the applied field set, and fields it applied
  before and leaves out now are removed unless another manager also owns them.
  Changing the value of a field another manager owns is a 409 Conflict listing each
  field, unless `force=true`, which moves those fields to the applier.
- A field is a path of map keys; a list is one field, owned and replaced whole.

Not modelled (see the README): per-item ownership of keyed lists (containers by name,
conditions by type), `x-kubernetes-list-type` and map-type schemas, apply to
subresources, the type-aware defaulting and validation structured-merge-diff does,
and ownership of what the simulated controllers write.
"""
from __future__ import annotations

from datetime import datetime

import orjson
import yaml

from . import errors
from .clock import rfc3339
from .resources import ResourceType

Path = tuple[str, ...]
# Bookkeeping metadata nobody owns (it is identity or the server's).
_UNOWNED_METADATA = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                     "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"}
MAX_MANAGER_LENGTH = 128


def manager_of(field_manager: str | None, user_agent: str | None) -> str:
    """The manager a non-apply write is recorded under (prefixFromUserAgent)."""
    if field_manager:
        return field_manager
    return ((user_agent or "").split("/")[0])[:MAX_MANAGER_LENGTH] or "unknown"


def check_field_manager(field_manager: str | None, *, required: bool) -> None:
    if field_manager is None or field_manager == "":
        if required:
            raise errors.bad_request("PATCH request with apply-patch+yaml content type requires the fieldManager "
                                     "parameter (metadata.managedFields records who applied what)")
        return
    if len(field_manager) > MAX_MANAGER_LENGTH:
        raise errors.invalid("PatchOptions", "", [("fieldManager", f"Too long: may not be more than "
                                                                   f"{MAX_MANAGER_LENGTH} bytes")], "meta.k8s.io")


# ---- field sets ------------------------------------------------------------------------
def _owned_part(obj: dict, subresource: str | None) -> dict:
    """The part of an object whose fields have owners: the status for the status
    subresource, everything but the status and server bookkeeping otherwise."""
    if subresource == "status":
        return {"status": obj.get("status")} if isinstance(obj.get("status"), dict) else {}
    part = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
    meta = part.get("metadata")
    if isinstance(meta, dict):
        part["metadata"] = {k: v for k, v in meta.items() if k not in _UNOWNED_METADATA}
        if not part["metadata"]:
            del part["metadata"]
    return part


def leaves(obj: dict, prefix: Path = ()) -> set[Path]:
    """Every field of `obj`: a non-empty map is not a field itself, its keys are."""
    found: set[Path] = set()
    for key, value in obj.items():
        path = prefix + (key,)
        if isinstance(value, dict) and value:
            found |= leaves(value, path)
        else:
            found.add(path)
    return found


_MISSING = object()


def value_at(obj, path: Path):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _delete_path(obj: dict, path: Path) -> None:
    parent = value_at(obj, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def to_fields_v1(paths: set[Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def from_fields_v1(tree: dict, prefix: Path = ()) -> set[Path]:
    """The paths of a FieldsV1 tree. Keys other than `f:` (list items `k:`/`v:`/`i:`,
    the `.` marker) make their parent one whole field here: lists are atomic."""
    found: set[Path] = set()
    for key, child in (tree or {}).items():
        if not key.startswith("f:"):
            continue
        path = prefix + (key[2:],)
        child = child if isinstance(child, dict) else {}
        sub = from_fields_v1(child, path)
        if sub:
            found |= sub
        if not sub or any(not k.startswith("f:") for k in child):
            found.add(path)
    return found


# ---- managedFields entries -------------------------------------------------------------
class Entry:
    __slots__ = ("manager", "operation", "subresource", "api_version", "time", "paths")

    def __init__(self, manager: str, operation: str, subresource: str | None, api_version: str,
                 time: str | None, paths: set[Path]):
        self.manager, self.operation, self.subresource = manager, operation, subresource
        self.api_version, self.time, self.paths = api_version, time, paths

    @classmethod
    def parse(cls, raw: dict) -> "Entry":
        if not isinstance(raw, dict) or not raw.get("manager") or raw.get("operation") not in ("Apply", "Update"):
            raise errors.bad_request("metadata.managedFields: each entry needs a manager and an operation "
                                     "(Apply or Update)")
        return cls(raw["manager"], raw["operation"], raw.get("subresource") or None, raw.get("apiVersion", ""),
                   raw.get("time"), from_fields_v1(raw.get("fieldsV1") or {}))

    def same_owner(self, manager: str, operation: str, subresource: str | None) -> bool:
        return (self.manager, self.operation, self.subresource) == (manager, operation, subresource)

    def render(self) -> dict:
        entry = {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version}
        if self.time:
            entry["time"] = self.time
        entry["fieldsType"] = "FieldsV1"
        entry["fieldsV1"] = to_fields_v1(self.paths)
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry

    def describe(self) -> str:
        """printManager in fieldmanager's conflict.go."""
        text = orjson.dumps(self.manager).decode()
        if self.subresource:
            text += f' with subresource "{self.subresource}"'
        if self.operation == "Update":
            text += f" using {self.api_version}" + (f" at {self.time}" if self.time else "")
        return text


def entries_of(obj: dict | None) -> list[Entry]:
    raw = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    if not isinstance(raw, list):
        raise errors.bad_request("metadata.managedFields must be a list")
    return [Entry.parse(item) for item in raw]


def _store_entries(obj: dict, entries: list[Entry]) -> None:
    kept = [e.render() for e in entries if e.paths]
    meta = obj.setdefault("metadata", {})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def _take(entries: list[Entry], owner: Entry, taken: set[Path]) -> None:
    """`owner` now owns `taken`: every other entry loses what overlaps it (entries of
    the status subresource own only status fields, so they never overlap the rest)."""
    for entry in entries:
        if entry is not owner:
            entry.paths = {p for p in entry.paths if not any(_overlaps(p, t) for t in taken)}
    owner.paths |= taken


def _entry_for(entries: list[Entry], manager: str, operation: str, subresource: str | None,
               rtype: ResourceType, now: datetime) -> Entry:
    for entry in entries:
        if entry.same_owner(manager, operation, subresource):
            entry.time, entry.api_version = rfc3339(now), rtype.api_version
            return entry
    entry = Entry(manager, operation, subresource, rtype.api_version, rfc3339(now), set())
    entries.append(entry)
    return entry


# ---- non-apply writes -------------------------------------------------------------------
def record_update(rtype: ResourceType, old: dict | None, new: dict, *, manager: str, now: datetime,
                  subresource: str | None = None) -> None:
    """Set `new`'s managedFields for a create, update or patch by `manager`.

    managedFields the client sent are kept as sent (an empty list resets them); left
    out, the stored ones carry over. Then `manager` takes every field it changed and
    fields it removed leave every owner."""
    new_meta = new.setdefault("metadata", {})
    if "managedFields" in new_meta and new_meta["managedFields"] is not None:
        entries = entries_of(new)
    else:
        entries = entries_of(old)
    before = _owned_part(old or {}, subresource)
    after = _owned_part(new, subresource)
    changed = {p for p in leaves(after) if value_at(before, p) != value_at(after, p)}
    removed = {p for p in leaves(before) if value_at(after, p) is _MISSING}
    for entry in entries:
        if removed:
            entry.paths = {p for p in entry.paths if not any(_overlaps(p, r) and len(p) >= len(r) for r in removed)}
    if changed:
        _take(entries, _entry_for(entries, manager, "Update", subresource, rtype, now), changed)
    _store_entries(new, entries)


def record_scale(rtype: ResourceType, old: dict, new: dict, *, manager: str, now: datetime) -> None:
    """A write of the scale subresource owns spec.replicas (under subresource "scale")."""
    entries = entries_of(old)
    if value_at(old, ("spec", "replicas")) != value_at(new, ("spec", "replicas")):
        taken = {("spec", "replicas")}
        for entry in entries:
            entry.paths = {p for p in entry.paths if not any(_overlaps(p, t) for t in taken)}
        _entry_for(entries, manager, "Update", "scale", rtype, now).paths |= taken
    _store_entries(new, entries)


# ---- server-side apply -------------------------------------------------------------------
def parse_applied(body: bytes, rtype: ResourceType, name: str) -> dict:
    """The applied configuration (YAML or JSON), checked as the apply handler checks it."""
    try:
        applied = yaml.safe_load(body or b"")
    except yaml.YAMLError as exc:
        raise errors.bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(applied, dict):
        raise errors.bad_request("the applied configuration must be an object (YAML or JSON)")
    for field in ("apiVersion", "kind"):
        if not applied.get(field):
            raise errors.bad_request(f"{field} must be set in the applied configuration")
    if applied["apiVersion"] != rtype.api_version or applied["kind"] != rtype.kind:
        raise errors.bad_request(f"the applied configuration is a {applied['apiVersion']} {applied['kind']}, "
                                 f"the request is for a {rtype.api_version} {rtype.kind}")
    meta = applied.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        raise errors.bad_request("metadata.name must be set in the applied configuration")
    if meta["name"] != name:
        raise errors.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
    if meta.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil in an applied configuration")
    return applied


def _merge(live, applied):
    if isinstance(live, dict) and isinstance(applied, dict):
        merged = dict(live)
        for key, value in applied.items():
            merged[key] = _merge(live.get(key), value)
        return merged
    return applied


def conflict_error(rtype: ResourceType, conflicts: list[tuple[Entry, Path]]) -> errors.ApiError:
    """NewConflictError in fieldmanager's conflict.go: 409 with one cause per field."""
    def dotted(path: Path) -> str:
        return "".join(f".{key}" for key in path)

    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {entry.describe()}",
               "field": dotted(path)} for entry, path in conflicts]
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {entry.describe()}: {dotted(path)}"
    else:
        lines = []
        for described in sorted({entry.describe() for entry, _ in conflicts}):
            lines.append(f"conflicts with {described}")
            lines += [f"- {dotted(path)}" for entry, path in conflicts if entry.describe() == described]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return errors.ApiError(409, "Conflict", message, details={"causes": causes})


def apply(rtype: ResourceType, live: dict | None, applied: dict, *, manager: str, force: bool,
          now: datetime) -> dict:
    """The object after `manager` applies `applied` to `live` (None: it is created)."""
    applied_fields = leaves(_owned_part(applied, None))
    if live is None:
        created = _merge({}, applied)
        entry = Entry(manager, "Apply", None, rtype.api_version, rfc3339(now), applied_fields)
        _store_entries(created, [entry])
        return created
    entries = entries_of(live)
    merged = _merge(live, {k: v for k, v in applied.items() if k != "status"})
    merged.setdefault("metadata", {})["managedFields"] = live.get("metadata", {}).get("managedFields")

    mine = next((e for e in entries if e.same_owner(manager, "Apply", None)), None)
    conflicts: list[tuple[Entry, Path]] = []
    for entry in entries:
        if entry is mine:   # a scale subresource writer owns spec.replicas like any other
            continue
        for owned in sorted(entry.paths):
            if any(_overlaps(owned, a) for a in applied_fields) and value_at(live, owned) != value_at(merged, owned):
                conflicts.append((entry, owned))
    if conflicts and not force:
        raise conflict_error(rtype, conflicts)

    # Fields this manager applied before and leaves out now go, unless someone else owns them.
    if mine is not None:
        others = [p for e in entries if e is not mine for p in e.paths]
        for dropped in sorted(mine.paths, key=len, reverse=True):
            if any(_overlaps(dropped, a) for a in applied_fields):
                continue
            if any(_overlaps(dropped, o) for o in others):
                continue
            _delete_path(merged, dropped)
    if mine is None:
        mine = Entry(manager, "Apply", None, rtype.api_version, rfc3339(now), set())
        entries.append(mine)
    mine.paths, mine.time, mine.api_version = set(applied_fields), rfc3339(now), rtype.api_version
    for entry, owned in conflicts:   # forced: the applier takes what it changed
        entry.paths.discard(owned)
    _store_entries(merged, entries)
    return merged
