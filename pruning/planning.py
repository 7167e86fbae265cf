"""Pure prune decisions: GPU series + a cluster view + `now` → a `PrunePlan`.

No ORM, no HTTP, no clock here (CONVENTIONS.md). Where gpu-pruner falls short
(KUBERNETES.md, "Prior art"), the rules below are stricter: every GPU of a pod must be
idle, the pod must have data for all its GPUs and the whole window, and each owner is
acted on once per run whatever number of its pods are idle.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# What config-autoscaler says of a zero initial scale, read as the orgs' switch reads it.
from clusters.knative import (
    ALLOW_ZERO_INITIAL_SCALE, AUTOSCALER_CONFIG, InitialScale, min_scale_current, revision_initial_pods,
)
from clusters.labels import (
    ISVC_LABEL, KNATIVE_SERVICE_LABEL, KSERVE_STOP_ANNOTATION, NOTEBOOK_STOP_ANNOTATION, PRUNE_OPT_OUT,
)
# A candidate pod is the cluster snapshot's pod view, read one by one or from a filtered
# list (only the pods Prometheus saw idle); the objects of the owner walk have their own view.
from clusters.snapshot import PodView

from .query import GpuSeries

# A pod in these phases holds nothing for its owner any more.
FINISHED_PHASES = ("Succeeded", "Failed")

OPT_OUT_ANNOTATION = PRUNE_OPT_OUT

# Decisions
PRUNE = "prune"
SKIP = "skip"

# Reasons a pod that looked idle is still not pruned (stable strings: stored, filtered on).
R_IDLE = "idle"
R_GAP = "gap-in-data"
R_MISSING_GPU = "missing-gpu-data"
R_YOUNG = "too-young"
R_PENDING = "pending"
R_DELETING = "being-deleted"
R_POD_GONE = "pod-not-found"
R_NO_OWNER = "no-owner"
R_UNSUPPORTED = "unsupported-owner"
R_OWNER_GONE = "owner-not-found"
R_OPT_OUT = "opted-out"
R_PROTECTED = "protected-namespace"
R_ORG = "org-disallows-scale-to-zero"
# An operator exempted or snoozed the org or the workload (orgs.planning.HELD_EXEMPT /
# HELD_SNOOZED: the org panel's exemptions, passed in as `PruneSettings.held_*`).
R_HELD_EXEMPT = "exempted-by-operator"
R_HELD_SNOOZED = "snoozed-by-operator"
R_CAP = "cap-reached"
R_SAME_OWNER = "owner-already-in-plan"
R_AT_ZERO = "already-at-zero"
R_MISSING_POWER = "missing-power-data"      # a power threshold is set and a GPU's power data misses part of the window
# Another GPU pod of the same owner was busy, or has no complete data for the window (it
# was no candidate: every GPU of it at or above the threshold, or no series at all; or it
# is young, pending, has a gap…): scaling the owner to zero would stop that pod too.
R_OWNER_NOT_IDLE = "another-pod-not-idle"
# The owner's pods could not be told (no selector, or one that does not find the pod seen
# idle): it is never counted idle.
R_OWNER_PODS_UNKNOWN = "owner-pods-unknown"
# A Knative Service whose template already has min-scale "0": Knative scales it by its
# traffic, and the pruner has nothing left to lower.
R_MIN_SCALE_ZERO = "min-scale-already-zero"
R_KIND_NOT_SELECTED = "owner-kind-not-selected"

# Action methods, per owner kind
M_SCALE = "scale"                     # Deployment / ReplicaSet / StatefulSet `scale` subresource
M_NOTEBOOK = "notebook-stop"          # kubeflow-resource-stopped annotation
M_KSERVE_STOP = "kserve-stop"         # serving.kserve.io/stop: "true" (KServe >= 0.15)
M_MIN_REPLICAS = "kserve-min-replicas"  # spec.predictor.minReplicas: 0 (older KServe)
M_KNATIVE_MIN_SCALE = "knative-min-scale"  # autoscaling.knative.dev/min-scale: "0"

# What each method does to the owner, as messages say it. Setting a Knative Service's
# template annotation makes a new Revision, which starts its `initial-scale` pods (1 unless
# config-autoscaler says otherwise) and goes to zero once it has no traffic. That is what
# M_KNATIVE_MIN_SCALE says here, and all a run recorded before initial-scale was looked at
# ever wrote; a run now says for each Service what its write does (`knative_min_scale_effect`):
# where config-autoscaler allows it, initial-scale "0" is set in the same write and the new
# Revision starts no pod.
EFFECT = {
    M_SCALE: "scaled to zero",
    M_NOTEBOOK: "stopped (scaled to zero)",
    M_KSERVE_STOP: "stopped (scaled to zero)",
    M_MIN_REPLICAS: "set to minReplicas 0 (scaled to zero once it has no traffic)",
    M_KNATIVE_MIN_SCALE: "set to min-scale 0 (a new revision starts its initial-scale pods, 1 by default, "
                         "and goes to zero once it has no traffic)",
}

# The owner kinds the pruner acts on, by the names an operator filters on (`--owner-kinds`);
# a Knative Service is "KnativeService" there, its kind being plain "Service".
OWNER_KINDS = {"Deployment": "Deployment", "ReplicaSet": "ReplicaSet", "StatefulSet": "StatefulSet",
               "Notebook": "Notebook", "InferenceService": "InferenceService", "KnativeService": "Service"}

API_VERSIONS = {
    "Deployment": "apps/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1",
    "Notebook": "kubeflow.org/v1", "InferenceService": "serving.kserve.io/v1beta1",
    "Service": "serving.knative.dev/v1", "Revision": "serving.knative.dev/v1",
    "Configuration": "serving.knative.dev/v1",
}


@dataclass(frozen=True)
class ObjectView:
    """An object the owner walk passes through (ReplicaSet, Deployment, Notebook…)."""
    kind: str
    namespace: str
    name: str
    uid: str
    annotations: dict
    labels: dict
    owner: tuple[str, str] | None
    replicas: int | None = None       # spec.replicas where the kind has one
    min_replicas: int | None = None   # InferenceService spec.predictor.minReplicas
    # spec.selector as requirements ((key, operator, values), operator In, NotIn, Exists or
    # DoesNotExist), for the kinds that select their pods; None where the object has none.
    selector: tuple | None = None
    template_annotations: Mapping = field(default_factory=dict)   # spec.template.metadata.annotations


@dataclass(frozen=True)
class ClusterView:
    pods: dict            # (namespace, name) -> clusters.snapshot.PodView
    objects: dict         # (kind, namespace, name) -> ObjectView
    kserve_stop_supported: bool = True
    # Owner key (kind, namespace, name) -> the (namespace, name) of each of its GPU pods that
    # is neither finished nor being deleted, as read from the cluster by the owner's selector
    # (`reads.cluster_view_read`): an owner is idle only when every one of them is. None:
    # `pods` holds every pod of the owners (a view built whole, in tests).
    owner_pods: Mapping | None = None


@dataclass(frozen=True)
class PruneSettings:
    window_seconds: int = 1800
    grace_seconds: int = 300
    idle_threshold: float = 0.01
    protected_namespaces: frozenset = frozenset({"kube-system", "kube-public", "kube-node-lease"})
    # Namespaces whose org has scale_to_zero_allowed off.
    org_blocked_namespaces: frozenset = frozenset()
    # Exemptions and snoozes in force: namespace -> reason (the whole org), and owner
    # (kind, namespace, name) -> reason (one model or pynode); R_HELD_EXEMPT or R_HELD_SNOOZED.
    held_namespaces: Mapping[str, str] = field(default_factory=dict)
    held_owners: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    max_scale_downs: int = 20
    # Watts: a GPU that drew more at any sample of the window is busy whatever its
    # utilization, and one without power samples is never idle. None: power not looked at.
    power_threshold_watts: float | None = None
    # Owner kinds (values of OWNER_KINDS) the run may act on; None: all of them.
    owner_kinds: frozenset | None = None


@dataclass(frozen=True)
class Owner:
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @property
    def api_version(self) -> str:
        return API_VERSIONS.get(self.kind, "")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


@dataclass(frozen=True)
class Decision:
    namespace: str
    pod: str
    gpus: tuple[str, ...]
    max_utilization: float | None
    decision: str
    reason: str
    owner: Owner | None = None
    method: str = ""


@dataclass(frozen=True)
class PrunePlan:
    now: datetime
    settings: PruneSettings
    decisions: tuple[Decision, ...]
    pods_seen: int               # GPU pods reporting at the evaluation time, and every candidate
    busy: int                    # of those, pods with a GPU above the threshold

    @property
    def to_prune(self) -> list[Decision]:
        return [d for d in self.decisions if d.decision == PRUNE]

    def explain(self) -> list[str]:
        return [f"{d.decision:5} {d.namespace}/{d.pod} -> "
                f"{d.owner.kind + '/' + d.owner.name if d.owner else '-'}: {d.reason}"
                for d in self.decisions]


def resolve_owner(pod: PodView, view: ClusterView) -> tuple[Owner | None, str]:
    """The object to scale for `pod`, or None and the reason it has none.

    InferenceService label first (its pods sit under Knative or a Deployment); then
    ReplicaSet → Deployment → (Knative Revision → Service); StatefulSet → Notebook;
    a bare ReplicaSet or StatefulSet stands for itself."""
    ns = pod.namespace
    isvc = pod.labels.get(ISVC_LABEL)
    if isvc:
        obj = view.objects.get(("InferenceService", ns, isvc))
        return (Owner("InferenceService", ns, isvc, obj.uid), "") if obj else (None, R_OWNER_GONE)
    controller = pod.controller
    if controller is None:
        return None, R_NO_OWNER
    kind, name = controller.kind, controller.name
    if kind not in ("ReplicaSet", "StatefulSet"):
        return None, R_UNSUPPORTED
    obj = view.objects.get((kind, ns, name))
    if obj is None:
        return None, R_OWNER_GONE
    if kind == "StatefulSet":
        if obj.owner and obj.owner[0] == "Notebook":
            nb = view.objects.get(("Notebook", ns, obj.owner[1]))
            return (Owner("Notebook", ns, nb.name, nb.uid), "") if nb else (None, R_OWNER_GONE)
        return Owner("StatefulSet", ns, name, obj.uid), ""
    if not obj.owner:
        return Owner("ReplicaSet", ns, name, obj.uid), ""
    if obj.owner[0] != "Deployment":
        return None, R_UNSUPPORTED
    dep = view.objects.get(("Deployment", ns, obj.owner[1]))
    if dep is None:
        return None, R_OWNER_GONE
    if dep.owner and dep.owner[0] == "Revision":
        rev = view.objects.get(("Revision", ns, dep.owner[1]))
        svc_name = rev.labels.get(KNATIVE_SERVICE_LABEL) if rev else None
        svc = view.objects.get(("Service", ns, svc_name)) if svc_name else None
        return (Owner("Service", ns, svc.name, svc.uid), "") if svc else (None, R_OWNER_GONE)
    return Owner("Deployment", ns, dep.name, dep.uid), ""


def knative_min_scale_effect(initial: InitialScale, *, zero_initial: bool, template: Mapping | None = None) -> str:
    """What the M_KNATIVE_MIN_SCALE write does to a Knative Service, said as it is:
    `zero_initial`, whether initial-scale "0" goes with min-scale "0" (only where
    config-autoscaler allows it, `initial`); `template`, the Service's template annotations
    before the write (its own initial-scale is what the new Revision starts without the "0").
    An `initial` not read says what EFFECT says."""
    if not initial.known:
        return EFFECT[M_KNATIVE_MIN_SCALE]
    if zero_initial:
        return f"set to min-scale 0 and initial-scale 0 (its new revision starts no pod: {initial.cause})"
    pods, source = revision_initial_pods(initial, template or {})
    starts = f"{pods} pod(s) ({source})" if pods is not None else "the cluster's initial scale of pods (1 by default)"
    return (f"set to min-scale 0 (its new revision starts {starts} and goes to zero once it has no traffic; "
            f"initial-scale \"0\" is not set, as Knative refuses it without {ALLOW_ZERO_INITIAL_SCALE}: \"true\": "
            f"{initial.cause})")


def knative_initial_scale_note(initial: InitialScale) -> str:
    """The run's word on what its Knative Services' new Revisions start, and why; "" when
    config-autoscaler was not read (no Knative Service planned)."""
    if not initial.known:
        return ""
    if initial.zero_allowed:
        return (f"{initial.cause}: a Knative Service the pruner sets to min-scale 0 also gets initial-scale \"0\" "
                "in the same write, so its new revision starts no pod; restore puts back the initial-scale it had.")
    pods = f"{initial.pods}, the cluster's" if initial.pods else "the cluster's, 1 by default"
    return (f"{initial.cause}: a Knative Service the pruner sets to min-scale 0 gets a new revision that starts its "
            f"initial-scale pods ({pods}, unless its template sets its own) before it goes to zero; "
            f"initial-scale \"0\" is not set, as Knative refuses it without {ALLOW_ZERO_INITIAL_SCALE}: \"true\". "
            f"Setting it in {AUTOSCALER_CONFIG} lets a prune start none.")


def action_method(owner: Owner, view: ClusterView) -> str:
    if owner.kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        return M_SCALE
    if owner.kind == "Notebook":
        return M_NOTEBOOK
    if owner.kind == "InferenceService":
        return M_KSERVE_STOP if view.kserve_stop_supported else M_MIN_REPLICAS
    return M_KNATIVE_MIN_SCALE


def already_at_zero(obj: ObjectView, method: str) -> bool:
    if method == M_SCALE:
        return obj.replicas == 0
    if method == M_NOTEBOOK:
        return NOTEBOOK_STOP_ANNOTATION in obj.annotations
    if method == M_KSERVE_STOP:
        return obj.annotations.get(KSERVE_STOP_ANNOTATION) == "true"
    if method == M_MIN_REPLICAS:
        return obj.min_replicas == 0
    if method == M_KNATIVE_MIN_SCALE:
        return min_scale_current(obj.template_annotations) == "0"
    return False


def selector_requirements(selector: dict | None) -> tuple | None:
    """A `metav1.LabelSelector` (matchLabels, matchExpressions) as requirements, or None."""
    if not isinstance(selector, dict):
        return None
    reqs = [(k, "In", (str(v),)) for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or ():
        reqs.append((expr.get("key", ""), expr.get("operator", ""), tuple(sorted(expr.get("values") or ()))))
    return tuple(reqs)


def selector_matches(reqs: tuple, labels: Mapping) -> bool:
    """Whether `labels` satisfy every requirement (Kubernetes' label selector semantics;
    an operator it does not know matches nothing)."""
    for key, op, values in reqs:
        if op == "In":
            if labels.get(key) not in values:
                return False
        elif op == "NotIn":
            if key in labels and labels[key] in values:
                return False
        elif op == "Exists":
            if key not in labels:
                return False
        elif op == "DoesNotExist":
            if key in labels:
                return False
        else:
            return False
    return True


def selector_text(reqs: tuple) -> str:
    """The requirements as a `labelSelector` query parameter."""
    parts = []
    for key, op, values in reqs:
        if op == "In" and len(values) == 1:
            parts.append(f"{key}={values[0]}")
        elif op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:   # unknown operator: a selector that matches nothing would hide pods; refuse instead
            raise ValueError(f"unknown label selector operator {op!r}")
    return ",".join(parts)


def owner_selector(owner: Owner, view: ClusterView) -> tuple | None:
    """What selects every pod of `owner` in its namespace (a little more, never less, as
    labels go), or None when that cannot be told. A Deployment's selector also matches its
    older ReplicaSets' pods; every pod of an InferenceService, or of any revision of a
    Knative Service, carries its name in a label; a Notebook's pods are its StatefulSet's."""
    if owner.kind == "InferenceService":
        return ((ISVC_LABEL, "In", (owner.name,)),)
    if owner.kind == "Service":
        return ((KNATIVE_SERVICE_LABEL, "In", (owner.name,)),)
    if owner.kind == "Notebook":
        for (kind, ns, _), obj in view.objects.items():
            if kind == "StatefulSet" and ns == owner.namespace and obj.owner == ("Notebook", owner.name):
                return obj.selector
        return None
    obj = view.objects.get(owner.key)
    return obj.selector if obj is not None else None


def counts_for_owner(pod: PodView, *, has_gpu_series: bool = False) -> bool:
    """A pod that holds or asks for GPUs for its owner (`pod_counts_for_owner`)."""
    return pod_counts_for_owner(nvidia=pod.asks_nvidia or has_gpu_series, phase=pod.phase,
                                deleting=pod.terminating)


def pod_counts_for_owner(*, nvidia: bool, phase: str | None, deleting: bool) -> bool:
    """The rule, on a pod's fields: it asks for some NVIDIA device (whole GPUs, MIG slices,
    shared GPUs: each gets DCGM series) or is seen with GPU series, and is neither finished
    nor being deleted (pending, running or of unknown state: an owner with such a pod is
    not known to be idle)."""
    return nvidia and not deleting and phase not in FINISHED_PHASES


def _owner_pods_from_view(view: ClusterView, seen) -> dict:
    out: dict = {}
    for key, pod in view.pods.items():
        owner, _ = resolve_owner(pod, view)
        if owner is not None and counts_for_owner(pod, has_gpu_series=key in seen):
            out.setdefault(owner.key, set()).add(key)
    return out


def _idle_reason(pod: PodView | None, series: list[GpuSeries], s: PruneSettings,
                 now: datetime) -> str:
    """Why a pod whose GPUs all stayed under the threshold is still not idle ('' = idle)."""
    if pod is None:
        return R_POD_GONE
    if pod.terminating:
        return R_DELETING
    if pod.phase == "Pending":
        return R_PENDING
    # A pod without a creation time cannot be shown to have lived through the window.
    if not pod.created_at or now - datetime.fromisoformat(pod.created_at) < timedelta(
            seconds=s.window_seconds + s.grace_seconds):
        return R_YOUNG
    if len(series) < max(pod.gpus, 1):
        return R_MISSING_GPU
    if any(not g.complete or g.max_utilization is None for g in series):
        return R_GAP
    return ""


def _power_unknown(gpus: list[GpuSeries], s: PruneSettings) -> bool:
    """A power threshold is set and some GPU's power data does not cover the window."""
    return s.power_threshold_watts is not None and any(
        g.max_power_watts is None or not g.power_complete for g in gpus)


def _drawing(gpus: list[GpuSeries], s: PruneSettings) -> bool:
    return s.power_threshold_watts is not None and any(
        g.max_power_watts is not None and g.max_power_watts > s.power_threshold_watts for g in gpus)


def pods_to_look_up(series: list[GpuSeries], settings: PruneSettings) -> set[tuple[str, str]]:
    """The pods `plan_prune` will look up in the cluster view: those neither busy (by
    utilization or power) nor without power data when a power threshold is set."""
    by_pod: dict[tuple[str, str], list[GpuSeries]] = {}
    for g in series:
        by_pod.setdefault((g.namespace, g.pod), []).append(g)
    out = set()
    for key, gpus in by_pod.items():
        peak = max((g.max_utilization for g in gpus if g.max_utilization is not None), default=None)
        if (peak is not None and peak >= settings.idle_threshold) or _drawing(gpus, settings):
            continue
        if _power_unknown(gpus, settings):
            continue
        out.add(key)
    return out


def plan_prune(*, series: list[GpuSeries], view: ClusterView, settings: PruneSettings,
               now: datetime, pods_seen: int | None = None) -> PrunePlan:
    """`series`: the GPUs of the pods that may be idle (or of every pod); `pods_seen`: the
    GPU pods reporting at the evaluation time (the census) when the series hold only the
    candidates'. The census's pods not in the series count as busy; a candidate none of whose
    GPUs reports any more (its pod gone within the window) is not among the census's pods, so
    it is added to the pods seen and takes no busy pod's place."""
    by_pod: dict[tuple[str, str], list[GpuSeries]] = {}
    for g in series:
        by_pod.setdefault((g.namespace, g.pod), []).append(g)
    decisions: list[Decision] = []
    planned: set[tuple] = set()
    gone = sum(1 for gpus in by_pod.values() if not any(g.reporting for g in gpus))
    busy = 0 if pods_seen is None else max(pods_seen - (len(by_pod) - gone), 0)
    # Why each pod of the series is not idle ("" = idle, with data for all its GPUs and
    # the whole window): an owner is idle only when every one of its GPU pods is.
    why_not: dict[tuple[str, str], str] = {}
    for key, gpus in by_pod.items():
        peak = max((g.max_utilization for g in gpus if g.max_utilization is not None), default=None)
        # IMPORTANT: one busy GPU keeps the whole pod (gpu-pruner flagged per GPU); so does
        # one GPU drawing more power than the threshold, whatever its utilization says.
        if (peak is not None and peak >= settings.idle_threshold) or _drawing(gpus, settings):
            why_not[key] = "busy"
        elif _power_unknown(gpus, settings):
            why_not[key] = R_MISSING_POWER   # unknown draw: never counted idle
        else:
            why_not[key] = _idle_reason(view.pods.get(key), gpus, settings, now)
    owner_pods = view.owner_pods if view.owner_pods is not None else _owner_pods_from_view(view, by_pod)
    for (ns, name), gpus in sorted(by_pod.items()):
        peak = max((g.max_utilization for g in gpus if g.max_utilization is not None), default=None)
        reason = why_not[(ns, name)]
        if reason == "busy":
            busy += 1
            continue
        ids = tuple(sorted(g.gpu for g in gpus))

        def skip(reason, owner=None, method=""):
            decisions.append(Decision(ns, name, ids, peak, SKIP, reason, owner, method))

        if reason:
            skip(reason)
            continue
        pod = view.pods[(ns, name)]
        owner, why = resolve_owner(pod, view)
        if owner is None:
            skip(why)
            continue
        method = action_method(owner, view)
        obj = view.objects.get(owner.key)
        if settings.owner_kinds is not None and owner.kind not in settings.owner_kinds:
            skip(R_KIND_NOT_SELECTED, owner, method)
        elif ns in settings.protected_namespaces:
            skip(R_PROTECTED, owner, method)
        elif ns in settings.org_blocked_namespaces:
            skip(R_ORG, owner, method)
        elif ns in settings.held_namespaces:
            skip(settings.held_namespaces[ns], owner, method)
        elif owner.key in settings.held_owners:
            skip(settings.held_owners[owner.key], owner, method)
        elif obj is not None and obj.annotations.get(OPT_OUT_ANNOTATION) == "false":
            skip(R_OPT_OUT, owner, method)
        elif owner.key in planned:
            skip(R_SAME_OWNER, owner, method)
        elif obj is not None and already_at_zero(obj, method):
            skip(R_MIN_SCALE_ZERO if method == M_KNATIVE_MIN_SCALE else R_AT_ZERO, owner, method)
        # A selector that does not even find this pod says nothing of the owner's others.
        elif (ns, name) not in owner_pods.get(owner.key, ()):
            skip(R_OWNER_PODS_UNKNOWN, owner, method)
        # IMPORTANT: before the cap, so that an owner kept by a busy pod takes no place in it.
        elif any(why_not.get(other, "not-a-candidate") for other in owner_pods[owner.key]):
            skip(R_OWNER_NOT_IDLE, owner, method)
        elif len(planned) >= settings.max_scale_downs:
            skip(R_CAP, owner, method)
        else:
            planned.add(owner.key)
            decisions.append(Decision(ns, name, ids, peak, PRUNE, R_IDLE, owner, method))
    return PrunePlan(now=now, settings=settings, decisions=tuple(decisions),
                     pods_seen=len(by_pod) if pods_seen is None else pods_seen + gone, busy=busy)
