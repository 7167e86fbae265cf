"""The model-serving runbook (deploying on scarce GPUs) as pure decisions over what the cluster holds.

- `registry_build`: each InferenceService and each pynode Knative Service, its org,
  its Knative revisions (ready, pending pods, GPUs held).
- `blocked_revisions`: a new revision whose pods are Pending for lack of GPUs while an
  older revision of the same Knative Service still holds GPUs. The runbook's fix is to
  delete the older revision (not graceful: its pods stop at once, traffic included).
- `resources_patch`: the merge patch that puts a resource spec on an InferenceService;
  `resources_change`: what it would change (each request and limit, old → new), for a preview.
- `redeploy_plan`: the redeploy's merge patch and, for a model its dormant org keeps at
  zero, what its new revision starts and what returns it to zero.
- `merge_patch_holds`, `redeploy_landed`, `deleted`: whether an action announced before
  its write shows on the cluster (how an action left `acting` by a dead worker is settled).

Inputs are the cluster snapshot's pods and the serving objects as the gateway returns
them; no ORM, no HTTP.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from clusters.labels import (
    COMPONENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    ISVC_LABEL,
    KNATIVE_SERVICE_LABEL,
    MODEL_LABEL,
    ORG_LABEL,
    OWNER_INITIAL_SCALE,
    OWNER_MIN_SCALE,
    PYNODE_COMPONENT,
    REDEPLOY_ANNOTATION,
    REVISION_LABEL,
)
from clusters.knative import (
    ALLOW_ZERO_INITIAL_SCALE,
    INITIAL_SCALE_UNKNOWN,
    InitialScale,
    min_scale_current,
    revision_initial_pods,
    scale_count,
)
from clusters.snapshot import PodView
from orgs.planning import model_floor, pynode_initial_zero_patch


@dataclass(frozen=True)
class RevisionEntry:
    name: str
    created: str
    ready: bool
    pods_running: int
    pods_pending: int
    gpus_held: int                 # GPUs requested by its pods bound to a node and not leaving
    pending_for_gpus: int          # its pods the scheduler could not place for want of GPUs


@dataclass(frozen=True)
class Unblock:
    service: str                   # Knative Service
    pending_revision: str
    old_revision: str
    gpus_held: int
    reason: str


@dataclass(frozen=True)
class ModelEntry:
    kind: str                      # "InferenceService" or "pynode"
    namespace: str
    name: str
    model: str                     # models with several versions share it (label capacity.io/model)
    framework: str
    knative_service: str
    org: str | None
    ready: bool
    uid: str
    revisions: tuple[RevisionEntry, ...] = ()
    unblocks: tuple[Unblock, ...] = field(default=())

    @property
    def gpus_held(self) -> int:
        return sum(r.gpus_held for r in self.revisions)


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _ready(obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or ())


def _revision_entry(rev: dict, pods: list[PodView]) -> RevisionEntry:
    live = [p for p in pods if not p.terminating]
    return RevisionEntry(
        name=_meta(rev)["name"], created=_meta(rev).get("creationTimestamp", ""), ready=_ready(rev),
        pods_running=sum(1 for p in live if p.phase == "Running"),
        pods_pending=sum(1 for p in live if p.phase == "Pending"),
        gpus_held=sum(p.gpus for p in live if p.holds_gpus),
        pending_for_gpus=sum(1 for p in live if p.pending_for_gpus))


def blocked_revisions(service: str, revisions: list[RevisionEntry]) -> tuple[Unblock, ...]:
    """Older revisions holding GPUs while the newest revision waits for GPUs."""
    if len(revisions) < 2:
        return ()
    ordered = sorted(revisions, key=lambda r: (r.created, _generation(r.name)))
    newest = ordered[-1]
    if not newest.pending_for_gpus or newest.ready:
        return ()
    return tuple(Unblock(service=service, pending_revision=newest.name, old_revision=old.name,
                         gpus_held=old.gpus_held,
                         reason=f"{newest.name} has {newest.pending_for_gpus} pod(s) Pending for lack of GPUs "
                                f"while {old.name} holds {old.gpus_held} GPU(s)")
                 for old in ordered[:-1] if old.gpus_held > 0)


def _generation(name: str) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def registry_build(*, isvcs: list[dict], ksvcs: list[dict], revisions: list[dict], pods: Iterable[PodView],
                   namespaces: list[dict]) -> list[ModelEntry]:
    """`pods` are the cluster snapshot's (`ClusterSnapshot.pods`): GPUs held and pods
    Pending for want of GPUs are counted as everywhere else."""
    org_of_ns = {_meta(n)["name"]: (_meta(n).get("labels") or {}).get(ORG_LABEL) for n in namespaces}
    pods_by_rev: dict[tuple[str, str], list[PodView]] = {}
    for pod in pods:
        rev = pod.labels.get(REVISION_LABEL)
        if rev:
            pods_by_rev.setdefault((pod.namespace, rev), []).append(pod)
    revs_by_ksvc: dict[tuple[str, str], list[RevisionEntry]] = {}
    for rev in revisions:
        meta = _meta(rev)
        service = (meta.get("labels") or {}).get(KNATIVE_SERVICE_LABEL)
        if service:
            revs_by_ksvc.setdefault((meta.get("namespace", ""), service), []).append(
                _revision_entry(rev, pods_by_rev.get((meta.get("namespace", ""), meta["name"]), [])))

    entries = []
    for isvc in isvcs:
        meta = _meta(isvc)
        ns, name = meta.get("namespace", ""), meta["name"]
        service = f"{name}-predictor"
        model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
        revs = tuple(sorted(revs_by_ksvc.get((ns, service), []), key=lambda r: _generation(r.name)))
        entries.append(ModelEntry(
            kind="InferenceService", namespace=ns, name=name,
            model=(meta.get("labels") or {}).get(MODEL_LABEL, name),
            framework=(model.get("modelFormat") or {}).get("name", "custom"), knative_service=service,
            org=(meta.get("labels") or {}).get(ORG_LABEL) or org_of_ns.get(ns), ready=_ready(isvc),
            uid=meta.get("uid", ""), revisions=revs, unblocks=blocked_revisions(service, list(revs))))
    for ksvc in ksvcs:
        meta = _meta(ksvc)
        labels = meta.get("labels") or {}
        if labels.get(COMPONENT_LABEL) != PYNODE_COMPONENT or labels.get(ISVC_LABEL):
            continue
        ns, name = meta.get("namespace", ""), meta["name"]
        revs = tuple(sorted(revs_by_ksvc.get((ns, name), []), key=lambda r: _generation(r.name)))
        entries.append(ModelEntry(
            kind="pynode", namespace=ns, name=name, model=labels.get(MODEL_LABEL, name), framework="pynode",
            knative_service=name, org=labels.get(ORG_LABEL) or org_of_ns.get(ns), ready=_ready(ksvc),
            uid=meta.get("uid", ""), revisions=revs, unblocks=blocked_revisions(name, list(revs))))
    return sorted(entries, key=lambda e: (e.namespace, e.name))


@dataclass(frozen=True)
class ResourceValues:
    gpu_count: int
    gpu_product: str
    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str

    def resources(self) -> dict:
        requests = {"cpu": self.cpu_request, "memory": self.memory_request}
        limits = {"cpu": self.cpu_limit, "memory": self.memory_limit}
        # None removes a GPU request the model had (JSON merge patch semantics).
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(self.gpu_count) if self.gpu_count else None
        return {"requests": requests, "limits": limits}


def resource_values(*, framework: str, defaults: dict, override: dict | None = None) -> ResourceValues:
    """The framework's defaults (settings) under the model's override (admin)."""
    base = {**(defaults.get(framework) or defaults.get("default") or {}),
            **{k: v for k, v in (override or {}).items() if v not in (None, "")}}
    missing = [k for k in ResourceValues.__dataclass_fields__ if k not in base]
    if missing:
        raise ValueError(f"no resource defaults for framework {framework!r} and no override for "
                         f"{', '.join(missing)}")
    return ResourceValues(**{k: base[k] for k in ResourceValues.__dataclass_fields__})


def resources_patch(isvc: dict, values: ResourceValues) -> dict:
    """Merge patch for the predictor: resources on the model (or first container), the
    GPU product as a node selector. KServe turns it into a new Knative revision."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    node_selector = {GPU_PRODUCT_LABEL: values.gpu_product} if values.gpu_count and values.gpu_product else \
        {GPU_PRODUCT_LABEL: None}
    patch: dict = {"spec": {"predictor": {"nodeSelector": node_selector}}}
    if predictor.get("model") is not None or not predictor.get("containers"):
        patch["spec"]["predictor"]["model"] = {"resources": values.resources()}
    else:
        containers = [dict(c) for c in predictor["containers"]]
        containers[0]["resources"] = {kind: {k: v for k, v in amounts.items() if v is not None}
                                      for kind, amounts in values.resources().items()}
        patch["spec"]["predictor"]["containers"] = containers
    return patch



@dataclass(frozen=True)
class AmountChange:
    """One resource of a pod: its request and limit now and under the spec (None: not set)."""
    resource: str
    request_old: str | None
    request_new: str | None
    limit_old: str | None
    limit_new: str | None

    @property
    def changed(self) -> bool:
        return (self.request_old, self.limit_old) != (self.request_new, self.limit_new)


@dataclass(frozen=True)
class ResourceChange:
    """What saving a resource spec would do to one deployed version of the model."""
    target: str                    # namespace/name of the InferenceService
    org: str
    framework: str
    amounts: tuple[AmountChange, ...] = ()
    gpu_product_old: str | None = None
    gpu_product_new: str | None = None
    error: str = ""                # it could not be planned (not read, no defaults): the apply records its outcome

    @property
    def redeploys(self) -> bool:
        """A spec that changes nothing leaves the InferenceService as it is: no new revision."""
        return not self.error and (any(a.changed for a in self.amounts)
                                   or self.gpu_product_old != self.gpu_product_new)


def _current_resources(predictor: dict) -> dict:
    """The resources the predictor's pods ask for now: the model's, else the first container's
    (where `resources_patch` writes)."""
    if predictor.get("model") is not None or not predictor.get("containers"):
        return (predictor.get("model") or {}).get("resources") or {}
    return predictor["containers"][0].get("resources") or {}


def resources_change(*, isvc: dict, values: ResourceValues, target: str, org: str,
                     framework: str) -> ResourceChange:
    """Each request and limit of `isvc`'s pods before and after `resources_patch(isvc, values)`,
    and its GPU product node selector: the preview of a resource spec, computed without writing."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    old, new = _current_resources(predictor), values.resources()
    names = sorted({*(old.get("requests") or {}), *(old.get("limits") or {}), *new["requests"], *new["limits"]})

    def amount(side: dict, kind: str, name: str) -> str | None:
        value = (side.get(kind) or {}).get(name)
        return None if value is None else str(value)

    amounts = tuple(AmountChange(resource=name, request_old=amount(old, "requests", name),
                                 request_new=amount(new, "requests", name), limit_old=amount(old, "limits", name),
                                 limit_new=amount(new, "limits", name))
                    for name in names)
    selector = resources_patch(isvc, values)["spec"]["predictor"]["nodeSelector"][GPU_PRODUCT_LABEL]
    return ResourceChange(target=target, org=org, framework=framework, amounts=amounts,
                          gpu_product_old=(predictor.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL),
                          gpu_product_new=selector)


# --- what the cluster shows of an action announced before it was sent ----------------------------
def merge_patch_holds(obj: dict | None, patch: dict) -> bool:
    """Whether `obj` already reads as `patch` (RFC 7386) would leave it: every value set,
    every null absent. A merge patch that holds needs no sending, and one that does not
    hold was not applied (or was overwritten since)."""
    if obj is None:
        return False
    for key, want in patch.items():
        if want is None:
            if key in obj:
                return False
        elif isinstance(want, dict):
            have = obj.get(key)
            if not isinstance(have, dict) or not merge_patch_holds(have, want):
                return False
        elif obj.get(key) != want:
            return False
    return True


def redeploy_patch(kind: str, stamp: str) -> dict:
    """The redeploy's merge patch: the pod template stamped with `stamp`. An
    InferenceService carries it on itself (KServe copies its annotations onto the Knative
    template); a pynode's Knative Service on its template."""
    annotations = {"annotations": {REDEPLOY_ANNOTATION: stamp}}
    if kind == "InferenceService":
        return {"metadata": annotations}
    return {"spec": {"template": {"metadata": annotations}}}


@dataclass(frozen=True)
class Schedule:
    """A periodic task as installed: its name and interval (None: disabled, or not an interval)."""
    name: str
    every_seconds: int | None

    def describe(self) -> str:
        if self.every_seconds is None:
            return f"the schedule \"{self.name}\" is disabled or not an interval"
        return f"the schedule \"{self.name}\" runs every {self.every_seconds} s"


# What returns a model its org keeps at zero to zero after a redeploy's new revision.
STAYS_ASLEEP = "stays asleep"        # its new revision starts no pod
AUTOSCALER = "autoscaler"            # its new revision has min-scale 0: Knative ends the pod once idle
RECONCILE = "reconcile"              # its new revision has a min-scale above 0 until the org's reconcile


@dataclass(frozen=True)
class RedeployPlan:
    """A redeploy of one model: its merge patch and, when its dormant org keeps it at zero
    (`asleep`, the org's words), what its new revision does (`outcome`, `effect`).
    `old`/`new`: the annotations the patch sets besides the stamp, before and after (audited)."""
    kind: str
    stamp: str
    patch: dict
    asleep: str = ""
    outcome: str = ""
    effect: str = ""
    old: dict = field(default_factory=dict)
    new: dict = field(default_factory=dict)

    @property
    def wakes(self) -> bool:
        """Whether a model its org keeps at zero gets a pod from this redeploy."""
        return bool(self.asleep) and self.outcome != STAYS_ASLEEP


def _merge(base: dict, extra: dict) -> dict:
    """Two merge patches as one (RFC 7386): one write, so one new revision."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def redeploy_plan(*, kind: str, obj: dict, stamp: str, asleep: str = "",
                  initial: InitialScale | None = None, reconcile: Schedule | None = None,
                  reapply_seconds: int | None = None) -> RedeployPlan:
    """The redeploy of `obj` (as just read) stamped `stamp`.

    `asleep`: why its dormant org keeps it at zero ("" = it does not); then `initial` (what
    config-autoscaler says of a zero initial scale), `reconcile` (the org's scale-to-zero
    reconcile as installed) and `reapply_seconds` (when the org's scale to zero is applied
    again after a redeploy that wakes a model, None: not asked) say what the new revision does:
    - a pynode the org holds at min-scale "0": the new revision inherits that "0". Where a
      zero initial scale is allowed it also carries initial-scale "0" (the switch's own, or
      set here in the same patch, with the owner's value written down for the wake to give
      back): it starts no pod and the model stays asleep. Otherwise it starts its initial
      scale, which Knative's autoscaler ends once idle.
    - a model (InferenceService): KServe puts the owner's minReplicas on every new revision
      as its min-scale; the org's "0" is on the old revision (or its PodAutoscaler). Above
      0 the new revision runs that many pods, whatever its initial scale, until the org's
      reconcile sets it to "0"; an initial-scale "0" would not keep it asleep, and the
      switch never writes one on a model (nor the wake takes it away), so none is written.
    """
    patch = redeploy_patch(kind, stamp)
    if not asleep:
        return RedeployPlan(kind=kind, stamp=stamp, patch=patch)
    initial = initial or INITIAL_SCALE_UNKNOWN
    if kind == "InferenceService":
        annotations = _meta(obj).get("annotations") or {}
        floor = scale_count(model_floor(obj)) or 0
        where = "the owner's minReplicas, which KServe gives every new revision; the org's 0 is on the old one"
    else:
        annotations = (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
        floor = scale_count(min_scale_current(annotations)) or 0
        where = "its template's, as the org's switch is not on it yet"
    pods, source = revision_initial_pods(initial, annotations)
    pods = 1 if pods is None else pods   # Knative's default
    if floor > 0:
        return RedeployPlan(kind=kind, stamp=stamp, patch=patch, asleep=asleep, outcome=RECONCILE, effect=(
            f"its new revision starts {max(pods, floor)} pod(s) (min-scale {floor}: {where}) and keeps them until "
            f"{_back_to_zero_words(reconcile, reapply_seconds)}; Knative's autoscaler then ends them once they get "
            f"no requests"))
    stays = "it stays asleep and runs the new revision when its org wakes"
    if pods == 0:
        return RedeployPlan(kind=kind, stamp=stamp, patch=patch, asleep=asleep, outcome=STAYS_ASLEEP,
                            effect=f"its new revision starts no pod ({source} is 0: {initial.cause}): {stays}")
    notes = _meta(obj).get("annotations") or {}
    # The wake gives an initial scale back only beside the owner's min-scale the switch wrote
    # down: on a "0" the switch did not write (its owner's), an initial-scale "0" would stay.
    zero = pynode_initial_zero_patch(obj, reason="redeploy of a pynode its org keeps at zero") \
        if kind != "InferenceService" and initial.zero_allowed and OWNER_MIN_SCALE in notes else None
    if zero is not None:
        new = {zero.initial[0]: zero.initial[1],
               **({OWNER_INITIAL_SCALE: zero.record_initial} if zero.record_initial is not None else {})}
        return RedeployPlan(
            kind=kind, stamp=stamp, patch=_merge(patch, zero.merge_patch()), asleep=asleep, outcome=STAYS_ASLEEP,
            old={key: (annotations if key == zero.initial[0] else notes).get(key) for key in new}, new=new,
            effect=(f"its new revision starts no pod ({initial.cause}; initial-scale 0 set with the stamp, as the "
                    f"org's switch sets it): {stays}, which gives back its owner's initial scale"))
    if not initial.readable:
        why = f"initial-scale 0 is not set, as whether Knative allows it could not be read: {initial.cause}"
    elif not initial.zero_allowed:
        why = (f"initial-scale 0 is not set, as Knative refuses it without {ALLOW_ZERO_INITIAL_SCALE}: \"true\": "
               f"{initial.cause or 'config-autoscaler not read'}")
    else:
        why = ("initial-scale 0 is not set, as the org's wake would not take it away: its switch sets one only on a "
               "pynode whose owner's min-scale it wrote down")
    return RedeployPlan(kind=kind, stamp=stamp, patch=patch, asleep=asleep, outcome=AUTOSCALER, effect=(
        f"its new revision starts {pods} pod(s) ({source}; {why}); its min-scale stays 0, so Knative's "
        f"autoscaler ends it once it gets no requests"))


def _back_to_zero_words(reconcile: Schedule | None, reapply_seconds: int | None) -> str:
    said = f"the org's scale-to-zero reconcile sets it to min-scale 0 ({_reconcile_words(reconcile)})"
    if reapply_seconds is None:
        return said
    return (f"the org's scale to zero, applied again {reapply_seconds} s after this redeploy, sets it to min-scale 0 "
            f"(or else {said})")


def _reconcile_words(reconcile: Schedule | None) -> str:
    if reconcile is None:
        return "its schedule was not read"
    if reconcile.every_seconds is None:
        return f"{reconcile.describe()}: until it runs again, or the org wakes"
    return f"within {reconcile.every_seconds} s: {reconcile.describe()}"


def redeploy_landed(*, obj: dict | None, kind: str, revisions: Iterable[dict], stamp: str) -> bool:
    """A redeploy landed when its stamp is on the object, or on a revision it made (a later
    redeploy may have stamped the object again since)."""
    if merge_patch_holds(obj, redeploy_patch(kind, stamp)):
        return True
    return any((_meta(r).get("annotations") or {}).get(REDEPLOY_ANNOTATION) == stamp for r in revisions)


def deleted(obj: dict | None, uid: str) -> bool:
    """A delete guarded by `uid` took effect: the object is gone, being deleted (a
    foreground delete waits for its dependents), or its name now holds another object."""
    if obj is None:
        return True
    meta = _meta(obj)
    return meta.get("uid") != uid or bool(meta.get("deletionTimestamp"))
