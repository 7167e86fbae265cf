"""Helpers of the serving-stack controllers (Knative, KServe, Kubeflow, Kthena): conditions
as those controllers write them, the /status subresource, installed versions.

Owner references and conditions are read with the core controllers' helpers in
`_util.py`; no name is defined in both modules.
"""
from __future__ import annotations

import re

from ..clock import rfc3339
from ..resources import NAMESPACES
from ..store import copy
from ._util import condition

KNATIVE_NAMESPACE = "knative-serving"
KSERVE_NAMESPACE = "kserve"
VERSION_LABEL = "app.kubernetes.io/version"


def merge_conditions(old: list[dict] | None, new: list[dict], now) -> list[dict]:
    """`new` conditions (type, status, reason, message) with lastTransitionTime kept
    from `old` when the status did not change, so an unchanged status writes nothing."""
    previous = {c["type"]: c for c in old or ()}
    merged = []
    stamp = None
    for cond in new:
        cond = {k: v for k, v in cond.items() if v not in (None, "")}
        before = previous.get(cond["type"])
        if before and before.get("status") == cond["status"] and before.get("lastTransitionTime"):
            cond["lastTransitionTime"] = before["lastTransitionTime"]
        else:
            stamp = stamp or rfc3339(now)
            cond["lastTransitionTime"] = stamp
        merged.append(cond)
    return merged


def is_true(obj: dict, ctype: str) -> bool:
    cond = condition(obj, ctype)
    return bool(cond and cond.get("status") == "True")


def write_status_subresource(store, rtype, obj: dict, status: dict) -> None:
    """Store `status` through the /status subresource (the object's spec untouched, no
    resourceVersion precondition) when it differs from the stored one; controllers write
    nothing when nothing changed (`run_to_rest` relies on it). `_util.write_status`
    replaces the whole object instead."""
    if obj.get("status") == status:
        return
    new = copy(obj)
    new["status"] = status
    store.update(rtype, new, subresource="status", check_rv=False)


def parse_version(text: str | None) -> tuple[int, ...]:
    """"v0.15.0", "1.21" -> (0, 15, 0), (1, 21); unparseable -> ()."""
    parts = re.findall(r"\d+", text or "")
    return tuple(int(p) for p in parts[:3])


def installed_version(sim, namespace: str, default: str) -> tuple[int, ...]:
    """The version an install declares on its namespace label (as real installs do),
    else the scenario's setting."""
    ns = sim.store.get(NAMESPACES, None, namespace)
    label = ((ns or {}).get("metadata", {}).get("labels") or {}).get(VERSION_LABEL)
    return parse_version(label) or parse_version(default)


def knative_version(sim) -> tuple[int, ...]:
    return installed_version(sim, KNATIVE_NAMESPACE, sim.settings.knative_version)


def kserve_version(sim) -> tuple[int, ...]:
    return installed_version(sim, KSERVE_NAMESPACE, sim.settings.kserve_version)


def pod_serving(pod: dict) -> bool:
    """Running, not being deleted, and Ready: a pod that takes requests (what Knative's
    activator and the revision's ready count see). `_util.pod_ready` is the Ready
    condition alone (podutil.IsPodReady)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or ())


def contains(actual, desired) -> bool:
    """Whether `actual` holds everything `desired` says (extra keys allowed), so fields
    an API server or another controller defaults never make a controller rewrite."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(contains(actual.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(actual, list) and len(actual) == len(desired) and \
            all(contains(a, d) for a, d in zip(actual, desired))
    return actual == desired
