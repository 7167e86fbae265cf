"""Helpers the core workload controllers share (and other controllers may import):
owner references, pod state, conditions, resource quantities, pod templates, Events.
"""
from __future__ import annotations

import random
import uuid
from datetime import datetime
from decimal import Decimal, InvalidOperation

import orjson

from ..clock import parse_time, rfc3339
from ..resources import EVENTS
from ..store import copy
from ..validation import DELETION_COST, deletion_cost_error

GPU = "nvidia.com/gpu"
GPU_INDICES_ANNOTATION = "simcluster.io/gpu-indices"
STARTUP_ANNOTATION = "simcluster.io/startup-seconds"
TERMINAL_PHASES = ("Succeeded", "Failed")

# k8s.io/apimachinery/pkg/util/rand: the alphabet of generated name suffixes and hashes
# (no vowels, no 0/1/3 so no words and no look-alike characters).
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# ---- owner references ------------------------------------------------------------------
def owner_ref(owner: dict, *, controller: bool = True) -> dict:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": controller, "blockOwnerDeletion": True}


def controller_ref(obj: dict) -> dict | None:
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return ref
    return None


def controller_uid(obj: dict) -> str | None:
    ref = controller_ref(obj)
    return ref.get("uid") if ref else None


def by_controller(objects) -> dict[str, list[dict]]:
    """Objects grouped by their controller owner's uid, in one pass."""
    index: dict[str, list[dict]] = {}
    for obj in objects:
        uid = controller_uid(obj)
        if uid:
            index.setdefault(uid, []).append(obj)
    return index


def by_namespace(objects) -> dict[str, list[dict]]:
    index: dict[str, list[dict]] = {}
    for obj in objects:
        index.setdefault(obj["metadata"].get("namespace", ""), []).append(obj)
    return index


def is_deleting(obj: dict) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


# ---- pods ------------------------------------------------------------------------------
def pod_active(pod: dict) -> bool:
    """controller.IsPodActive: not terminated and not being deleted."""
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES and not is_deleting(pod)


def pod_ready(pod: dict) -> bool:
    """podutil.IsPodReady: the Ready condition is True (a pod being deleted turns
    not-Ready through its kubelet, not here)."""
    cond = condition(pod, "Ready")
    return bool(cond and cond.get("status") == "True")


def pod_ready_since(pod: dict) -> datetime | None:
    cond = condition(pod, "Ready")
    if cond and cond.get("status") == "True":
        return parse_time(cond.get("lastTransitionTime"))
    return None


def pod_available(pod: dict, min_ready_seconds: float, now: datetime) -> bool:
    """podutil.IsPodAvailable: Ready for at least minReadySeconds."""
    if not pod_ready(pod):
        return False
    if not min_ready_seconds:
        return True
    since = pod_ready_since(pod)
    return since is not None and (now - since).total_seconds() >= min_ready_seconds


def deletion_cost(pod: dict) -> int:
    """The pod-deletion-cost annotation; missing or invalid counts as 0, as upstream."""
    value = (pod["metadata"].get("annotations") or {}).get(DELETION_COST)
    if value is None or deletion_cost_error(value):
        return 0
    return int(value)


def gpu_indices(pod: dict) -> list[int] | None:
    """The GPU indices the kubelet gave the pod, or None when it has none."""
    text = (pod["metadata"].get("annotations") or {}).get(GPU_INDICES_ANNOTATION)
    if not text:
        return None
    try:
        return [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        return None


# ---- resource quantities ---------------------------------------------------------------
_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_quantity_cache: dict[str, float] = {}


def parse_quantity(value) -> float:
    """A Kubernetes resource.Quantity ("500m", "2Gi", "1e3", 4) as a number of base units.

    Raises ValueError naming the bad value."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    cached = _quantity_cache.get(text)
    if cached is not None:
        return cached
    number, suffix = text, ""
    for candidate in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"):
        # "1e3" is an exponent, not the suffix E; only a trailing letter run is a suffix.
        if text.endswith(candidate) and not (candidate == "E" and text[:-1].rstrip("0123456789.").endswith(("e", "E"))):
            number, suffix = text[: -len(candidate)], candidate
            break
    try:
        if not number or number.lower().startswith(("inf", "nan")) or number.startswith("+-"):
            raise InvalidOperation
        parsed = Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, ValueError):
        raise ValueError(f"quantity {value!r} is not a valid Kubernetes quantity "
                         "(expected e.g. 2, 500m, 1.5Gi, 1e3)") from None
    result = float(parsed)
    _quantity_cache[text] = result
    return result


def _add(total: dict[str, float], resources: dict) -> dict[str, float]:
    for name, quantity in resources.items():
        total[name] = total.get(name, 0.0) + parse_quantity(quantity)
    return total


def _container_requests(container: dict) -> dict[str, float]:
    """Requests, with a limit standing in for a missing request (API defaulting)."""
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return _add({}, merged)


def pod_requests(pod: dict) -> dict[str, float]:
    """What the scheduler counts: the containers' sum, at least the largest init
    container's request, plus the pod overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for container in spec.get("containers") or ():
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, 0.0) + amount
    for container in spec.get("initContainers") or ():
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, 0.0), amount)
    _add(total, spec.get("overhead") or {})
    return total


def pod_gpu_count(pod: dict) -> int:
    return int(pod_requests(pod).get(GPU, 0))


# ---- conditions ------------------------------------------------------------------------
def condition(obj: dict, ctype: str) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == ctype:
            return cond
    return None


def set_condition(conditions: list[dict] | None, ctype: str, status: str, now: datetime, *,
                  reason: str | None = None, message: str | None = None,
                  update_time: bool = False) -> list[dict]:
    """A new conditions list with `ctype` set. lastTransitionTime moves only when the
    status changes, so setting an unchanged condition leaves the list equal."""
    result = [dict(c) for c in conditions or ()]
    stamp = rfc3339(now)
    for cond in result:
        if cond.get("type") == ctype:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = stamp
                if update_time:
                    cond["lastUpdateTime"] = stamp
            elif update_time and (cond.get("reason") != reason or cond.get("message") != message):
                cond["lastUpdateTime"] = stamp
            cond["status"] = status
            _set_or_drop(cond, "reason", reason)
            _set_or_drop(cond, "message", message)
            return result
    cond = {"type": ctype, "status": status, "lastTransitionTime": stamp}
    if update_time:
        cond["lastUpdateTime"] = stamp
    _set_or_drop(cond, "reason", reason)
    _set_or_drop(cond, "message", message)
    result.append(cond)
    return result


def _set_or_drop(cond: dict, key: str, value) -> None:
    if value:
        cond[key] = value
    else:
        cond.pop(key, None)


# ---- writes ----------------------------------------------------------------------------
def write_status(store, rtype, obj: dict, status: dict) -> dict:
    """Store `status` when it differs from the stored one: a controller writes nothing
    when nothing changed (`run_to_rest` relies on it)."""
    if obj.get("status") == status:
        return obj
    new = copy(obj)
    new["status"] = status
    return store.put(rtype, new)


def int_or_percent(value, total: int, *, round_up: bool, default) -> int:
    """intstr.GetScaledValueFromIntOrPercent: 2 → 2, "25%" of 10 → 3 (up) or 2 (down)."""
    if value is None:
        value = default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = int(text[:-1])
        except ValueError:
            raise ValueError(f"invalid value for IntOrString: {value!r} (want an integer or N%)") from None
        scaled = percent * total
        return -(-scaled // 100) if round_up else scaled // 100
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"invalid value for IntOrString: {value!r} (want an integer or N%)") from None


# ---- names and templates ---------------------------------------------------------------
def fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def safe_encode(text: str) -> str:
    """rand.SafeEncodeString: each character mapped into the safe alphabet."""
    return "".join(SAFE_ALPHABET[ord(ch) % len(SAFE_ALPHABET)] for ch in text)


def template_hash(template: dict, collision_count: int = 0) -> str:
    """controller.ComputeHash's shape: fnv32a of the template, printed in decimal and
    safe-encoded (the JSON rendering stands in for Go's deep-hash printer)."""
    data = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    if collision_count:
        data += str(collision_count).encode()
    return safe_encode(str(fnv32a(data)))


def random_suffix(rng: random.Random, length: int = 5) -> str:
    return "".join(rng.choice(SAFE_ALPHABET) for _ in range(length))


def unique_name(store, rtype, namespace: str, prefix: str, rng: random.Random) -> str:
    """`<prefix><5 chars>` as generateName gives, checked against the store."""
    while True:
        name = prefix + random_suffix(rng)
        if store.get(rtype, namespace, name) is None:
            return name


def pod_from_template(template: dict, *, owner: dict, name: str, namespace: str,
                      extra_labels: dict | None = None) -> dict:
    """A Pod built from a pod template with a controller reference to `owner`, with the
    defaults the API server would fill in."""
    template = copy(template or {})
    tmeta = template.get("metadata") or {}
    meta = {"name": name, "namespace": namespace,
            "labels": {**(tmeta.get("labels") or {}), **(extra_labels or {})},
            "ownerReferences": [owner_ref(owner)]}
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    spec = template.get("spec") or {}
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"}}


# ---- events ----------------------------------------------------------------------------
def record_event(sim, involved_rtype, obj: dict, reason: str, message: str, type: str = "Normal",
                 component: str = "simcluster") -> dict:
    """A core/v1 Event about `obj`. Repeating the newest event of the same object,
    reason and message bumps its `count` instead of creating another."""
    store = sim.store
    meta = obj["metadata"]
    namespace = meta.get("namespace") or "default"
    now = rfc3339(sim.clock.now())
    key = (meta.get("uid"), reason, message)
    index = _event_index(sim)
    existing_name = index.get(key)
    if existing_name:
        existing = store.get(EVENTS, namespace, existing_name)
        if existing is not None:
            new = copy(existing)
            new["count"] = int(existing.get("count") or 1) + 1
            new["lastTimestamp"] = now
            return store.put(EVENTS, new)
    name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"apiVersion": involved_rtype.api_version, "kind": involved_rtype.kind,
                           "name": meta["name"], "namespace": meta.get("namespace"),
                           "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message, "type": type, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now, "eventTime": None,
        "source": {"component": component}, "reportingComponent": component,
        "reportingInstance": component,
    }
    if not meta.get("namespace"):
        event["involvedObject"].pop("namespace")
    created = store.create(EVENTS, event)
    index[key] = name
    return created


def _event_index(sim) -> dict:
    """(uid, reason, message) → event name, kept on the simulation between rounds."""
    index = getattr(sim, "_core_event_index", None)
    if index is None:
        index = {}
        sim._core_event_index = index
    return index
