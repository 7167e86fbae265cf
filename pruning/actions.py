"""Scale-to-zero and restore, per owner kind, through the Kubernetes gateway.

Each action re-reads the owner right before changing it (never act on a stale view),
returns what it took away (`restore_state`) and what it set (`applied_state`), and
raises the gateway's errors on failure. Every write carries the `resourceVersion` of
that read, so a change made in between is refused (409 Conflict) and the caller reads
again. Restore puts `restore_state` back only while the owner is the object the prune
acted on (same UID) and still holds exactly `applied_state`: an owner who scaled back
up, stopped the notebook again themselves, or deleted and re-created the workload wins.

A Knative Service's state holds the template annotations the prune sets: min-scale, and
initial-scale where config-autoscaler allows a zero initial scale (`zero_initial_scale`).
Restore and the settle compare and write exactly the keys the prune recorded, so a run
recorded before initial-scale was written restores min-scale alone, as it always did.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from clusters import kube
from clusters.errors import Conflict, Invalid
from clusters.knative import initial_scale_key, min_scale_current, min_scale_key
from clusters.labels import INITIAL_SCALE, INITIAL_SCALE_LEGACY, MIN_SCALE, OWNER_INITIAL_SCALE, OWNER_MIN_SCALE

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


def template_annotations(obj: dict) -> dict:
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {})


def sets_initial_scale(state: dict | None) -> bool:
    """Whether a Knative Service's recorded state holds initial-scale beside min-scale."""
    return any(key in (INITIAL_SCALE, INITIAL_SCALE_LEGACY) for key in (state or {}).get("templateAnnotations") or ())


def state_text(state: dict | None) -> str:
    """A restore or applied state as an operator reads it, in a message or an Event:
    "replicas 2", "template annotation autoscaling.knative.dev/min-scale=1", "minReplicas
    unset", never a Python dict."""
    if not state:
        return "nothing recorded"
    words = {"annotations": "annotation", "templateAnnotations": "template annotation"}
    parts = []
    for key, value in state.items():
        if isinstance(value, dict):
            parts += [f"{words.get(key, key)} {name}{' unset' if v is None else f'={v}'}"
                      for name, v in value.items()]
        else:
            parts.append(f"{key} {'unset' if value is None else value}")
    return ", ".join(parts) or "nothing recorded"


def recorded_keys(state: dict | None) -> tuple[str, ...]:
    """The template annotations a Knative Service's recorded state holds (min-scale alone
    in a run recorded before initial-scale was written)."""
    return tuple((state or {}).get("templateAnnotations") or ()) or (MIN_SCALE_ANNOTATION,)


def current_state(method: str, obj: dict, *, keys: tuple[str, ...] = (MIN_SCALE_ANNOTATION,)) -> dict:
    """The part of the owner each method changes, as stored in restore/applied state
    (`keys`: the template annotations of a Knative Service that count; absent = None)."""
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
        template = template_annotations(obj)
        return {"templateAnnotations": {key: template.get(key) for key in keys}}
    raise ValueError(f"unknown prune method {method!r}")


def _target_state(method: str, now: datetime, initial_key: str | None = None,
                  min_key: str = MIN_SCALE_ANNOTATION) -> dict:
    if method == M_SCALE:
        return {"replicas": 0}
    if method == M_NOTEBOOK:
        # The Notebook controller reads it as an RFC 3339 time (KUBERNETES.md).
        return {"annotations": {NOTEBOOK_STOP_ANNOTATION: now.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    if method == M_KSERVE_STOP:
        return {"annotations": {KSERVE_STOP_ANNOTATION: "true"}}
    if method == M_MIN_REPLICAS:
        return {"minReplicas": 0}
    # IMPORTANT: initial-scale "0" goes in the same patch as min-scale "0": one new Revision,
    # and it starts no pod. Only where config-autoscaler allows it (Knative's webhook refuses it otherwise).
    return {"templateAnnotations": {min_key: "0", **({initial_key: "0"} if initial_key else {})}}


def _write(gateway: kube.KubeGateway, kind: str, namespace: str, name: str, method: str, state: dict,
           resource_version: str = "") -> dict:
    resource = RESOURCES[kind]
    # The version read just before: the API server refuses the write (409) when the object
    # changed since, as a merge patch with metadata.resourceVersion is a compare-and-swap
    # (for the scale subresource too: a Scale carries its object's version).
    meta = {"resourceVersion": resource_version} if resource_version else {}
    if method == M_SCALE:
        replicas = state.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise Invalid(f"replicas must be a whole number >= 0, got {replicas!r}", code=400)
        patch = {"spec": {"replicas": state["replicas"]}, **({"metadata": meta} if meta else {})}
        return gateway.patch(resource, name, patch, namespace=namespace, patch_type="merge", subresource="scale")
    if "annotations" in state:
        patch = {"metadata": {"annotations": state["annotations"], **meta}}
    elif "minReplicas" in state:
        patch = {"spec": {"predictor": {"minReplicas": state["minReplicas"]}}}
    else:
        patch = {"spec": {"template": {"metadata": {"annotations": state["templateAnnotations"]}}}}
    if meta and "metadata" not in patch:
        patch["metadata"] = meta
    # A JSON merge patch with null removes the key: restoring "absent" is exact.
    return gateway.patch(resource, name, patch, namespace=namespace, patch_type="merge")


def _stopped(method: str, current: dict, target: dict) -> bool:
    """Whether the owner is already where a scale-down would take it."""
    if method == M_NOTEBOOK:  # any stop time means stopped
        return current["annotations"][NOTEBOOK_STOP_ANNOTATION] is not None
    if method == M_KNATIVE_MIN_SCALE:  # min-scale "0" is left to Knative, whatever its initial-scale
        return min_scale_current(current["templateAnnotations"]) == "0"
    return current == target


def _uid(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("uid") or ""


def _version(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


def _other_object(obj: dict, uid: str) -> bool:
    """The owner read is not the object seen (deleted and created again under its name)."""
    return bool(uid) and bool(_uid(obj)) and _uid(obj) != uid


def read_owner(gateway: kube.KubeGateway, kind: str, namespace: str, name: str) -> dict:
    obj = gateway.get(RESOURCES[kind], name, namespace=namespace)
    obj.setdefault("apiVersion", RESOURCES[kind].api_version)
    obj.setdefault("kind", kind)
    return obj


def scale_to_zero_intent(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
                         now: datetime, uid: str = "", zero_initial_scale: bool = False) -> tuple[dict, dict, dict]:
    """Re-read the owner and say what scaling it to zero would take away and set.

    Returns (owner as re-read, restore_state, applied_state); changes nothing, so the
    caller can record both states before `write` touches the cluster. `uid`: the owner
    the plan saw; another object under its name is left alone. `zero_initial_scale`: a
    Knative Service also gets initial-scale "0" (its own value, or its absence, is
    recorded for restore), under the key its template uses."""
    obj = read_owner(gateway, kind, namespace, name)
    if _other_object(obj, uid):
        raise NothingToDo(f"{kind} {namespace}/{name} was deleted and created again since the plan (UID {uid}, "
                          f"now {_uid(obj)}): it is not the workload seen idle")
    if _annotations(obj).get(OPT_OUT_ANNOTATION) == "false":
        raise NothingToDo(f"{kind} {namespace}/{name} opted out ({OPT_OUT_ANNOTATION}: \"false\") since the plan")
    # A Knative Service's keys are the spellings its template uses (Knative refuses both
    # spellings of one key on an object), min-scale first.
    min_key = min_scale_key(template_annotations(obj)) if method == M_KNATIVE_MIN_SCALE else MIN_SCALE_ANNOTATION
    keys, initial_key = (min_key,), None
    if method == M_KNATIVE_MIN_SCALE and zero_initial_scale:
        initial_key = initial_scale_key(template_annotations(obj))
        keys = (min_key, initial_key)
    before, target = current_state(method, obj, keys=keys), _target_state(method, now, initial_key, min_key)
    if _stopped(method, before, target):
        if method == M_KNATIVE_MIN_SCALE:
            raise NothingToDo(f"{kind} {namespace}/{name} already has min-scale \"0\": Knative scales it by its "
                              "traffic, nothing left to lower")
        raise NothingToDo(f"{kind} {namespace}/{name} is already scaled to zero")
    return obj, before, target


def write(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str, state: dict,
          resource_version: str = "") -> dict:
    """Set `state` (an applied_state or a restore_state) on the owner; with
    `resource_version`, only while it is still at that version (else `Conflict`)."""
    return _write(gateway, kind, namespace, name, method, state, resource_version)


# What the owner holds now, against a recorded intent.
APPLIED, NOT_APPLIED, CHANGED = "applied", "not-applied", "changed"


def settle(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
           restore_state: dict, applied_state: dict, uid: str = "") -> tuple[dict, str, dict]:
    """Whether a scale-down whose outcome was not recorded took effect, from the owner's
    real state: (owner, APPLIED | NOT_APPLIED | CHANGED, its current state). Only exactly
    what the prune wrote, on the object it wrote to (`uid`), counts as applied."""
    obj = read_owner(gateway, kind, namespace, name)
    state = current_state(method, obj, keys=recorded_keys(applied_state))
    if _other_object(obj, uid):
        return obj, CHANGED, state
    if state == applied_state:
        return obj, APPLIED, state
    if state == restore_state:
        return obj, NOT_APPLIED, state
    return obj, CHANGED, state


# Re-reads of an owner whose restore write was refused because it changed meanwhile (409).
RESTORE_ATTEMPTS = 3


def owner_record(restore_state: dict) -> dict:
    """A Knative Service's owner values from a prune's restore state, as the org switch
    records them on a pynode it holds at "0" (`capacity.io/owner-min-scale`, and
    `owner-initial-scale` where the prune wrote initial-scale; "" = the owner set none)."""
    template = restore_state.get("templateAnnotations") or {}
    record = {OWNER_MIN_SCALE: min_scale_current(template) or ""}
    for key in (INITIAL_SCALE, INITIAL_SCALE_LEGACY):
        if key in template:
            record[OWNER_INITIAL_SCALE] = template[key] or ""
    return record


def restore(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, method: str,
            restore_state: dict, applied_state: dict, uid: str = "",
            kept_asleep: Callable[[dict], str] | None = None) -> tuple[dict, bool, str, str]:
    """Put `restore_state` back, only on the object the prune acted on (`uid`) and while it
    still holds exactly `applied_state`. Returns (owner, restored?, why not, asleep) —
    nothing is written when it changed since. A change racing the write (409) is read again.

    `kept_asleep(owner)`: why another feature with the right to (an org's dormancy) keeps
    the owner as just read at zero, "" when none does. Such an owner is not woken (`asleep`
    says why): a pynode keeps its "0" and the owner's values go to the org switch's record,
    which gives them back when the org wakes (a metadata write: no new Revision, no pod);
    a model is left as it is, since giving KServe back its minReplicas or removing its stop
    starts a new revision's pods (restored False: restore it once the org is awake)."""
    for attempt in range(RESTORE_ATTEMPTS):
        obj = read_owner(gateway, kind, namespace, name)
        if _other_object(obj, uid):
            return obj, False, (f"the {kind} was deleted and created again since the prune (UID {uid}, now "
                                f"{_uid(obj)}): it is another workload"), ""
        state = current_state(method, obj, keys=recorded_keys(applied_state))
        if state != applied_state:
            return obj, False, (f"it now holds {state_text(state)}, not what the prune set "
                                f"({state_text(applied_state)})"), ""
        asleep = kept_asleep(obj) if kept_asleep is not None else ""
        if asleep and method != M_KNATIVE_MIN_SCALE:
            return obj, False, (f"{asleep}; giving it back {state_text(restore_state)} now would start its GPU pods, so "
                                "restore it once the org is awake"), asleep
        try:
            if asleep:
                gateway.patch(RESOURCES[kind], name, {"metadata": {"annotations": owner_record(restore_state),
                                                                   "resourceVersion": _version(obj)}},
                              namespace=namespace, patch_type="merge")
            else:
                _write(gateway, kind, namespace, name, method, restore_state, _version(obj))
        except Conflict:
            if attempt == RESTORE_ATTEMPTS - 1:
                raise
            continue
        return obj, True, "", asleep
    raise AssertionError("unreachable")
