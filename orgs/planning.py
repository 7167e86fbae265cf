"""Pure decisions for scale to zero (seed 004): which workloads to patch, and how.

No ORM, no HTTP, no clock: callers pass the objects they read and `now`.

- pynodes: Knative Services labelled `capacity.io/component=pynode` → the template's
  `autoscaling.knative.dev/min-scale` ("0" enable, "1" disable). A template change
  makes a new Revision, as the seed says.
- models: InferenceServices → their predictor Knative Service's routed Revisions.
  Knative ≥ 1.21 copies the Revision's autoscaling annotations onto the PodAutoscaler
  on every reconcile (a direct PA patch is reverted), so the Revision is patched; on
  older Knative the PA is patched directly (the seed's way). Unknown version: both,
  which holds under either behaviour. No redeploy either way.
- Disabling returns a model to its own floor (`spec.predictor.minReplicas`, at least 1)
  so that scale to zero never lowers what a model asked for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

MIN_SCALE = "autoscaling.knative.dev/min-scale"
MIN_SCALE_LEGACY = "autoscaling.knative.dev/minScale"
PYNODE_SELECTOR = "capacity.io/component=pynode"
ORG_LABEL = "capacity.io/org"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
RAW_MODES = {"Standard", "RawDeployment"}

ENABLED, DISABLED = "enabled", "disabled"

VIA_REVISION = "revision-annotation"
VIA_PODAUTOSCALER = "podautoscaler-patch"


def parse_version(text: str | None) -> tuple[int, ...]:
    """ "1.21.0", "v1.20", "knative-v1.21.1" → (1, 21, 0) …; unparseable → ()."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return ()
    return tuple(int(part) for part in match.groups() if part is not None)


def model_mechanisms(knative_version: str | None) -> tuple[str, ...]:
    version = parse_version(knative_version)
    if not version:
        return (VIA_REVISION, VIA_PODAUTOSCALER)  # unknown: both levers, right under either rule
    return (VIA_REVISION,) if version >= (1, 21) else (VIA_PODAUTOSCALER,)


def describe_mechanism(knative_version: str | None) -> str:
    shown = knative_version or "unknown"
    return f"models via {' + '.join(model_mechanisms(knative_version))} (Knative {shown}); pynodes via template"


@dataclass(frozen=True)
class Patch:
    """One workload to patch: its resource ("ksvc", "revision", "podautoscaler"), where,
    the min-scale it has and the one it gets, and why."""

    target: str
    namespace: str
    name: str
    current: str | None
    wanted: str
    reason: str

    def merge_patch(self) -> dict:
        annotations = {MIN_SCALE: self.wanted}
        if self.target == "ksvc":
            return {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        return {"metadata": {"annotations": annotations}}

    def describe(self) -> str:
        return f"{self.target} {self.namespace}/{self.name}: min-scale {self.current or 'unset'} → {self.wanted}"


@dataclass(frozen=True)
class ScaleToZeroPlan:
    namespace: str
    setting: str
    patches: tuple[Patch, ...]
    holding: tuple[str, ...]   # workloads already right
    skipped: tuple[str, ...]   # workloads that cannot scale to zero, and why
    mechanism: str

    @property
    def in_place(self) -> bool:
        return not self.patches

    def describe(self) -> list[str]:
        return [p.describe() for p in self.patches]


def _annotations(obj: dict, *, template: bool = False) -> dict:
    if template:
        return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations")) or {}
    return (obj.get("metadata") or {}).get("annotations") or {}


def current_min_scale(annotations: dict) -> str | None:
    value = annotations.get(MIN_SCALE)
    return annotations.get(MIN_SCALE_LEGACY) if value is None else value


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def model_floor(isvc: dict) -> str:
    """What a model holds when scale to zero is disabled: its own minReplicas, at least 1."""
    raw = ((isvc.get("spec") or {}).get("predictor") or {}).get("minReplicas")
    try:
        floor = int(raw) if raw is not None else 1
    except (TypeError, ValueError):
        floor = 1
    return str(max(1, floor))


def routed_revisions(ksvc: dict) -> list[str]:
    """Revisions a Knative Service sends traffic to, else its latest ready one."""
    status = ksvc.get("status") or {}
    names = [t["revisionName"] for t in status.get("traffic") or () if t.get("revisionName") and (t.get("percent") or 0) > 0]
    latest = status.get("latestReadyRevisionName") or status.get("latestCreatedRevisionName")
    if latest and latest not in names:
        names.append(latest)
    return names


def plan_scale_to_zero(*, namespace: str, setting: str, pynodes: list[dict], inference_services: list[dict],
                       knative_services: list[dict], revisions: list[dict], podautoscalers: list[dict],
                       knative_version: str | None) -> ScaleToZeroPlan:
    """The patches that bring every pynode and model of a namespace to `setting`."""
    if setting not in (ENABLED, DISABLED):
        raise ValueError(f"setting must be {ENABLED!r} or {DISABLED!r}, not {setting!r}")
    patches: list[Patch] = []
    holding: list[str] = []
    skipped: list[str] = []

    def consider(target: str, name: str, current: str | None, wanted: str, reason: str) -> None:
        if current == wanted:
            holding.append(f"{target} {namespace}/{name}")
        else:
            patches.append(Patch(target, namespace, name, current, wanted, reason))

    for ksvc in sorted(pynodes, key=_name):
        wanted = "0" if setting == ENABLED else "1"
        consider("ksvc", _name(ksvc), current_min_scale(_annotations(ksvc, template=True)), wanted,
                 f"pynode: scale to zero {setting}")

    ksvc_by_name = {_name(k): k for k in knative_services}
    rev_by_name = {_name(r): r for r in revisions}
    pa_by_name = {_name(p): p for p in podautoscalers}
    mechanisms = model_mechanisms(knative_version)
    for isvc in sorted(inference_services, key=_name):
        name = _name(isvc)
        if _annotations(isvc).get(DEPLOYMENT_MODE) in RAW_MODES:
            skipped.append(f"inferenceservice {namespace}/{name}: raw deployment mode cannot scale to zero")
            continue
        wanted = "0" if setting == ENABLED else model_floor(isvc)
        ksvc = ksvc_by_name.get(f"{name}-predictor") or ksvc_by_name.get(f"{name}-predictor-default")
        if ksvc is None:
            skipped.append(f"inferenceservice {namespace}/{name}: no predictor Knative Service yet")
            continue
        for rev_name in routed_revisions(ksvc):
            reason = f"model {name}: scale to zero {setting}"
            if VIA_REVISION in mechanisms and rev_name in rev_by_name:
                consider("revision", rev_name, current_min_scale(_annotations(rev_by_name[rev_name])), wanted, reason)
            if VIA_PODAUTOSCALER in mechanisms and rev_name in pa_by_name:
                consider("podautoscaler", rev_name, current_min_scale(_annotations(pa_by_name[rev_name])), wanted,
                         reason)
    return ScaleToZeroPlan(namespace=namespace, setting=setting, patches=tuple(patches), holding=tuple(holding),
                           skipped=tuple(skipped), mechanism=describe_mechanism(knative_version))


@dataclass(frozen=True)
class OrgActivity:
    """What the sweep needs to know of one org."""

    id: int
    slug: str
    last_activity_at: datetime | None
    dormant: bool
    scale_to_zero_allowed: bool


@dataclass(frozen=True)
class SweepPlan:
    now: datetime
    cutoff: datetime
    to_dormant: tuple[str, ...] = field(default_factory=tuple)
    over_budget: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> list[str]:
        lines = [f"{slug}: no activity since before {self.cutoff:%Y-%m-%d %H:%M} UTC → dormant"
                 for slug in self.to_dormant]
        lines += [f"{slug}: would turn dormant, left for the next sweep (budget)" for slug in self.over_budget]
        return lines


def sweep_cutoff(*, now: datetime, dormant_after: timedelta) -> datetime:
    if dormant_after <= timedelta(0):
        raise ValueError(f"the dormancy period must be positive, got {dormant_after}")
    return now - dormant_after


def is_sweepable(org: OrgActivity, cutoff: datetime) -> bool:
    """The sweep's rule; the database UPDATE in services encodes the same condition.

    An org never seen active counts from its registration: callers pass that time as
    `last_activity_at` (a new org is not dormant at birth)."""
    return (not org.dormant and org.scale_to_zero_allowed
            and org.last_activity_at is not None and org.last_activity_at < cutoff)


def plan_sweep(*, orgs: list[OrgActivity], now: datetime, dormant_after: timedelta, budget: int) -> SweepPlan:
    """Which orgs the sweep would mark dormant (the dry run shows this)."""
    if budget < 0:
        raise ValueError(f"the sweep budget must be >= 0, got {budget}")
    cutoff = sweep_cutoff(now=now, dormant_after=dormant_after)
    due = sorted((o for o in orgs if is_sweepable(o, cutoff)), key=lambda o: (o.last_activity_at, o.id))
    return SweepPlan(now=now, cutoff=cutoff, to_dormant=tuple(o.slug for o in due[:budget]),
                     over_budget=tuple(o.slug for o in due[budget:]))
