"""Scale-to-zero and restore, per owner kind, through the Kubernetes gateway.

Each action re-reads the owner right before changing it (never act on a stale view),
returns what it took away (`restore_state`) and what it set (`applied_state`), and
raises the gateway's errors on failure. Restore puts `restore_state` back only while
the owner still holds `applied_state`: a user who scaled back up meanwhile wins.
"""
from __future__ import annotations

from datetime import datetime

from clusters import kube
from clusters.labels import MIN_SCALE

from .planning import (
    KSERVE_STOP_ANNOTATION, M_KNATIVE_MIN_SCALE, M_KSERVE_STOP, M_MIN_REPLICAS, M_NOTEBOOK, M_SCALE,
    NOTEBOOK_STOP_ANNOTATION, OPT_OUT_ANNOTATION,
)

MIN_SCALE_ANNOTATION = MIN_SCALE
RESOURCES = {
    "Deployment": kube.DEPLOYMENTS, "ReplicaSet": kube.REPLICASETS, "StatefulSet": kube.STATEFULSETS,
    "Notebook": kube.NOTEBOOKS, "InferenceService": kube.INFERENCESERVICES, "Service": kube.KNATIVE_SERVICES,
}


class NothingToDo(Exception):
    """The owner, read again, is already at zero or has opted out since the plan."""


def _annotations(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _template_annotations(obj: dict) -> dict:
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {})


def current_state(method: str, obj: dict) -> dict:
    """The part of the owner each method changes, as stored in restore/applied state."""
    if method == M_SCALE:
        replicas = (obj.get("spec") or {}).get("replicas")
        return {"replicas": 1 if replicas is None else replicas}
    if method == M_NOTEBOOK:
        return {"annotations": {NOTEBOOK_STOP_ANNOTATION: _annotations(obj).get(NOTEBOOK_STOP_ANNOTATION)}}
    if method == M_KSERVE_STOP:
        return {"annotations": {KSERVE_STOP_ANNOTATION: _annotations(obj).get(KSERVE_STOP_ANNOTATION)}}
    if method == M_MIN_REPLICAS:
        return {"minReplicas": ((obj.get("spec") or {}).get("predictor") or {}).get("minReplicas")}
    if method == M_KNATIVE_MIN_SCALE:
        return {"templateAnnotations": {MIN_SCALE_ANNOTATION: _template_annotations(obj).get(MIN_SCALE_ANNOTATION)}}
    raise ValueError(f"unknown prune method {method!r}")


def _target_state(method: str, now: datetime) -> dict:
    if method == M_SCALE:
        return {"replicas": 0}
    if method == M_NOTEBOOK:
        # The Notebook controller reads it as an RFC 3339 time (KUBERNETES.md).
        return {"annotations": {NOTEBOOK_STOP_ANNOTATION: now.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    if method == M_KSERVE_STOP:
        return {"annotations": {KSERVE_STOP_ANNOTATION: "true"}}
    if method == M_MIN_REPLICAS:
        return {"minReplicas": 0}
    return {"templateAnnotations": {MIN_SCALE_ANNOTATION: "0"}}


def _write(gateway: kube.KubeGateway, kind: str, namespace: str, name: str, method: str, state: dict) -> dict:
    resource = RESOURCES[kind]
    if method == M_SCALE:
        return gateway.set_scale(resource, name, state["replicas"], namespace=namespace)
    if "annotations" in state:
        patch = {"metadata": {"annotations": state["annotations"]}}
    elif "minReplicas" in state:
        patch = {"spec": {"predictor": {"minReplicas": state["minReplicas"]}}}
    else:
        patch = {"spec": {"template": {"metadata": {"annotations": state["templateAnnotations"]}}}}
    # A JSON merge patch with null removes the key: restoring "absent" is exact.
    return gateway.patch(resource, name, patch, namespace=namespace, patch_type="merge")


def _at_target(method: str, current: dict, target: dict) -> bool:
    if method == M_NOTEBOOK:  # any stop time means stopped
        return current["annotations"][NOTEBOOK_STOP_ANNOTATION] is not None
    return current == target


def read_owner(gateway: kube.KubeGateway, kind: str, namespace: str, name: str) -> dict:
    obj = gateway.get(RESOURCES[kind], name, namespace=namespace)
    obj.setdefault("apiVersion", RESOURCES[kind].api_version)
    obj.setdefault("kind", kind)
    return obj


def scale_to_zero_intent(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
                         now: datetime) -> tuple[dict, dict, dict]:
    """Re-read the owner and say what scaling it to zero would take away and set.

    Returns (owner as re-read, restore_state, applied_state); changes nothing, so the
    caller can record both states before `write` touches the cluster."""
    obj = read_owner(gateway, kind, namespace, name)
    if _annotations(obj).get(OPT_OUT_ANNOTATION) == "false":
        raise NothingToDo(f"{kind} {namespace}/{name} opted out ({OPT_OUT_ANNOTATION}: \"false\") since the plan")
    before, target = current_state(method, obj), _target_state(method, now)
    if _at_target(method, before, target):
        raise NothingToDo(f"{kind} {namespace}/{name} is already scaled to zero")
    return obj, before, target


def write(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str, state: dict) -> dict:
    """Set `state` (an applied_state or a restore_state) on the owner."""
    return _write(gateway, kind, namespace, name, method, state)


# What the owner holds now, against a recorded intent.
APPLIED, NOT_APPLIED, CHANGED = "applied", "not-applied", "changed"


def settle(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
           restore_state: dict, applied_state: dict) -> tuple[dict, str, dict]:
    """Whether a scale-down whose outcome was not recorded took effect, from the owner's
    real state: (owner, APPLIED | NOT_APPLIED | CHANGED, its current state)."""
    obj = read_owner(gateway, kind, namespace, name)
    state = current_state(method, obj)
    if _at_target(method, state, applied_state):
        return obj, APPLIED, state
    if state == restore_state:
        return obj, NOT_APPLIED, state
    return obj, CHANGED, state


def restore(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
            restore_state: dict, applied_state: dict) -> tuple[dict, bool]:
    """Put `restore_state` back. Returns (owner, restored?) — False when it changed since."""
    obj = read_owner(gateway, kind, namespace, name)
    if not _at_target(method, current_state(method, obj), applied_state):
        return obj, False
    _write(gateway, kind, namespace, name, method, restore_state)
    return obj, True
