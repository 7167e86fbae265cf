"""Pure decisions for scale to zero of dormant orgs: which workloads to patch, and how.

No ORM, no HTTP, no clock: callers pass the objects they read and `now`.

The rule: the org switch owns only the scaling it adds. Enabling sets min-scale "0";
disabling returns each workload to its owner's floor and nothing above it:
- a model (InferenceService): its `spec.predictor.minReplicas` ("0" stays "0"), "1"
  where the owner set nothing (KServe's own default);
- a pynode (Knative Service labelled `capacity.io/component=pynode`): the template's
  min-scale before the product first set it to "0", recorded at that moment in the
  Service's `capacity.io/owner-min-scale` annotation (metadata, so recording makes no
  Revision) and removed again on restore; "" there means the owner set none.
Disabling patches only a "0" it finds where the floor is higher (the product's own
"0"); any other value is the owner's business and is left alone.

A pynode is switched through its template, so each switch makes a new Revision, and a
new Revision starts `initial-scale` pods (1 by default) before the autoscaler may take it
to zero: a pod spun up for nothing on every dormancy switch. Where the cluster's
`config-autoscaler` allows a zero initial scale (`allow-zero-initial-scale`), enabling
also sets the template's `initial-scale` to "0" (the owner's value recorded beside the
min-scale one, and given back on disable); where it does not, Knative's webhook would
refuse that "0", so it is not set and the panel says that one pod starts per switch.

How models are switched (the lever) follows the Knative version the cluster states:
- Knative >= 1.21 copies a Revision's autoscaling annotations onto its PodAutoscaler on
  every reconcile (a direct PA patch is reverted), so the Revision is patched; that
  changes the Deployment's pod template, so Knative replaces the model's pods.
- Knative < 1.21 keeps a direct PodAutoscaler patch, and that replaces no pod.
- Unknown version (a `devel` label, a digest-pinned image): the PodAutoscaler, the lever
  that replaces no pod. Observed on Knative 1.15: a Revision patch rolled the pods and
  the PA did not follow, a PA patch held (../shared/REALTIER.md). A Revision is never
  patched on a guess.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

# config-autoscaler's word on a zero initial scale is read once for every feature (clusters.knative).
from clusters.knative import INITIAL_SCALE_UNKNOWN, InitialScale, initial_scale_key, min_scale_current, min_scale_key
from clusters.labels import (
    COMPONENT_LABEL, DEPLOYMENT_MODE, INITIAL_SCALE, MIN_SCALE, ORG_LABEL, OWNER_INITIAL_SCALE,
    OWNER_MIN_SCALE, PYNODE_COMPONENT,
)

PYNODE_SELECTOR = f"{COMPONENT_LABEL}={PYNODE_COMPONENT}"
RAW_MODES = {"Standard", "RawDeployment"}

ENABLED, DISABLED = "enabled", "disabled"

VIA_REVISION = "revision-annotation"
VIA_PODAUTOSCALER = "podautoscaler-patch"


def parse_version(text: str | None) -> tuple[int, ...]:
    """ "1.21.0", "v1.20", "knative-v1.21.1" → (1, 21, 0) …; unparseable ("devel") → ()."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return ()
    return tuple(int(part) for part in match.groups() if part is not None)


def pynode_initial_scale_statement(initial: InitialScale) -> str:
    """What a pynode's switch starts, as the panel says it, from what config-autoscaler
    says (`clusters.knative`); "" when it was not read."""
    if not initial.known:
        return ""
    if not initial.readable:
        return (f"{initial.cause}: a pynode switched to min-scale 0 gets a new revision that starts the cluster's "
                "initial scale of pods (1 by default) before it scales to zero; initial-scale \"0\" is not set, "
                "since Knative refuses it unless allow-zero-initial-scale is on.")
    if initial.zero_allowed:
        return (f"{initial.cause}: a pynode switched to min-scale 0 also gets initial-scale \"0\", so its new "
                "revision starts no pod.")
    return (f"{initial.cause}: each switch of a pynode to min-scale 0 makes a new revision that starts "
            f"{initial.pods} pod(s) (the cluster's initial-scale) before it scales to zero. Setting "
            "allow-zero-initial-scale: \"true\" there lets the switch start none.")


@dataclass(frozen=True)
class Lever:
    """How models are switched on a cluster, and the evidence it was chosen by; and
    whether a pynode's switch may start its new Revision at zero pods."""

    target: str             # VIA_REVISION or VIA_PODAUTOSCALER
    version: str            # as the cluster states it; "" unknown
    reason: str
    restarts_pods: bool
    initial_scale: InitialScale = INITIAL_SCALE_UNKNOWN

    def describe(self) -> str:
        shown = self.version or "unknown"
        restart = ", restarts model pods" if self.restarts_pods else ""
        pynodes = "pynodes via template"
        if self.initial_scale.known:
            pynodes += " at initial-scale 0" if self.initial_scale.zero_allowed else ", a pod starts per switch"
        return f"models via {self.target} (Knative {shown}{restart}); {pynodes}"

    def explain(self) -> str:
        """Everything the panel shows: why this lever, and what a pynode switch starts."""
        return " ".join(part for part in (self.reason, pynode_initial_scale_statement(self.initial_scale)) if part)

    def with_initial_scale(self, initial_scale: InitialScale) -> "Lever":
        return Lever(self.target, self.version, self.reason, self.restarts_pods, initial_scale)


def knative_lever(*, version: str, source: str = "", looked_at: tuple[str, ...] = ()) -> Lever:
    parsed = parse_version(version)
    where = f" ({source})" if source else ""
    if parsed and parsed >= (1, 21):
        return Lever(VIA_REVISION, version, f"Knative {version}{where} copies a Revision's autoscaling annotations "
                     "onto its PodAutoscaler, so a PodAutoscaler patch would be reverted: the Revision is patched, "
                     "and each switch restarts the model's pods (a new ReplicaSet).", True)
    if parsed:
        return Lever(VIA_PODAUTOSCALER, version, f"Knative {version}{where} keeps a direct PodAutoscaler patch: "
                     "the PodAutoscaler is patched and no pod is replaced.", False)
    seen = "; ".join(looked_at) or "nothing on the cluster states it"
    return Lever(VIA_PODAUTOSCALER, "", f"Knative version unknown ({seen}): the PodAutoscaler is patched, which "
                 "replaces no pod. A Revision patch would restart every model pod, so it is not used on a guess.",
                 False)


@dataclass(frozen=True)
class Patch:
    """One workload to patch: its resource ("ksvc", "revision", "podautoscaler"), where,
    the min-scale it has and the one it gets (None: no value, Knative's default), and why.
    For a pynode, `record` is the owner's value to write down ("" = none) and
    `clear_record` removes that note once the owner's value is back."""

    target: str
    namespace: str
    name: str
    current: str | None
    wanted: str | None
    reason: str
    key: str = MIN_SCALE
    record: str | None = None
    clear_record: bool = False
    # A pynode's initial scale set with its min-scale (key, value; None removes it), and
    # the owner's value to write down ("" = none; None = nothing to write).
    initial: tuple[str, str | None] | None = None
    record_initial: str | None = None

    @property
    def changes_scale(self) -> bool:
        return self.current != self.wanted

    def merge_patch(self) -> dict:
        body: dict = {}
        if self.changes_scale or self.initial is not None:
            annotations = {self.key: self.wanted} if self.changes_scale else {}
            if self.initial is not None:
                annotations[self.initial[0]] = self.initial[1]
            if self.target == "ksvc":
                body["spec"] = {"template": {"metadata": {"annotations": annotations}}}
            else:
                body["metadata"] = {"annotations": annotations}
        if self.record is not None or self.clear_record:
            notes = body.setdefault("metadata", {}).setdefault("annotations", {})
            notes[OWNER_MIN_SCALE] = None if self.clear_record else self.record
            if self.clear_record and self.initial is not None and self.record_initial is None:
                notes[OWNER_INITIAL_SCALE] = None
        if self.record_initial is not None:
            # Also without a min-scale record: an initial-scale "0" whose owner's value is not
            # written down would never be given back by the wake.
            body.setdefault("metadata", {}).setdefault("annotations", {})[OWNER_INITIAL_SCALE] = self.record_initial
        return body

    def describe(self) -> str:
        text = f"{self.target} {self.namespace}/{self.name}: min-scale {self.current or 'unset'} → {self.wanted or 'unset'}"
        if not self.changes_scale:
            text = f"{self.target} {self.namespace}/{self.name}: min-scale stays {self.current or 'unset'}"
        if self.initial is not None:
            text += f", initial-scale {self.initial[1] or 'unset'}"
        if self.record is not None:
            text += f" (owner's value {self.record or 'unset'} recorded)"
        if self.clear_record:
            text += " (owner's value restored)"
        return text


@dataclass(frozen=True)
class ScaleToZeroPlan:
    namespace: str
    setting: str
    patches: tuple[Patch, ...]
    holding: tuple[str, ...]      # workloads already right
    skipped: tuple[str, ...]      # workloads that cannot scale to zero, and why
    mechanism: str
    notes: tuple[str, ...] = ()       # kinds this cluster does not serve: none of those here
    incomplete: tuple[str, ...] = ()  # what could not be planned (a read failed), and why
    exempt: tuple[str, ...] = ()      # workloads an operator exempted or snoozed: kept at their owner's floor

    @property
    def in_place(self) -> bool:
        return not self.patches

    def describe(self) -> list[str]:
        return [p.describe() for p in self.patches]


def _annotations(obj: dict, *, template: bool = False) -> dict:
    if template:
        return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations")) or {}
    return (obj.get("metadata") or {}).get("annotations") or {}


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def model_floor(isvc: dict) -> str:
    """What a model holds when scale to zero is disabled: its own minReplicas ("0" stays
    "0"), "1" where the owner set none or set something that is not a whole number >= 0."""
    raw = ((isvc.get("spec") or {}).get("predictor") or {}).get("minReplicas")
    if isinstance(raw, bool) or raw is None:
        return "1"
    try:
        floor = int(raw)
    except (TypeError, ValueError):
        return "1"
    return str(floor) if floor >= 0 else "1"


def pynode_floor(ksvc: dict, *, applied: str, enabled_since: datetime | None = None) -> str | None:
    """The owner's min-scale of a pynode (None: the owner set none).

    The recorded value when there is one; else the template's value. A "0" without a
    record on an org the product last held enabled is the one doubtful case: the product
    records the owner's value with every "0" it writes, so such a "0" is either written
    by a product from before values were recorded, or set by the owner after the product
    last applied. A pynode created after `enabled_since` (when the product last set scale
    to zero on the org) was never touched by any product: its "0" is its owner's and
    stays. Otherwise the safe reading is the warm one, "1"."""
    notes = _annotations(ksvc)
    if OWNER_MIN_SCALE in notes:
        return notes[OWNER_MIN_SCALE] or None
    current = min_scale_current(_annotations(ksvc, template=True))
    if current == "0" and applied == ENABLED and not _created_after(ksvc, enabled_since):
        return "1"
    return current


def _created_after(obj: dict, moment: datetime | None) -> bool:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if moment is None or not isinstance(created, str):
        return False
    try:
        at = datetime.fromisoformat(created)
    except ValueError:
        return False
    return at.tzinfo is not None and at > moment


def switched_kind(obj: dict) -> str | None:
    """Which of the org switch's workloads `obj` is, as exemptions name them: "pynode" (a
    Knative Service labelled as one), "inferenceservice" (a model not in a raw mode, which
    can scale to zero); None for anything the switch never sets to "0"."""
    kind, meta = obj.get("kind"), obj.get("metadata") or {}
    if kind == "Service" and (meta.get("labels") or {}).get(COMPONENT_LABEL) == PYNODE_COMPONENT:
        return "pynode"
    if kind == "InferenceService" and (meta.get("annotations") or {}).get(DEPLOYMENT_MODE) not in RAW_MODES:
        return "inferenceservice"
    return None


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
                       knative_version: str | None = None, lever: Lever | None = None, applied: str = "",
                       unserved: tuple[str, ...] = (), unreadable: dict[str, str] | None = None,
                       held: dict[tuple[str, str], str] | None = None,
                       enabled_since: datetime | None = None) -> ScaleToZeroPlan:
    """The patches that bring every pynode and model of a namespace to `setting`.

    `held` maps ("pynode" | "inferenceservice", name) to the description of an operator's
    exemption or snooze in force: such a workload is never set to "0"; it is kept at (or
    returned to) its owner's floor, as when scale to zero is disabled.

    `applied` is the setting last seen holding on the org ("" never), `enabled_since` when
    the product last set scale to zero on it (see `pynode_floor`); `unserved` names the
    kinds the cluster does not serve ("inferenceservices", "knative services",
    "podautoscalers", "revisions"), `unreadable` the kinds whose read failed, with why."""
    if setting not in (ENABLED, DISABLED):
        raise ValueError(f"setting must be {ENABLED!r} or {DISABLED!r}, not {setting!r}")
    lever = lever or knative_lever(version=knative_version or "")
    unreadable = unreadable or {}
    patches: list[Patch] = []
    holding: list[str] = []
    skipped: list[str] = []
    notes: list[str] = []
    incomplete: list[str] = []
    held = held or {}
    exempt: list[str] = []

    def setting_for(kind: str, name: str) -> str:
        if setting == ENABLED and (kind, name) in held:
            exempt.append(f"{kind} {namespace}/{name}: {held[(kind, name)]}; kept at its owner's floor")
            return DISABLED
        return setting

    def consider(target: str, obj: dict, wanted: str | None, reason: str) -> None:
        annotations = _annotations(obj)
        current = min_scale_current(annotations)
        if current == wanted:
            holding.append(f"{target} {namespace}/{_name(obj)}")
        else:
            patches.append(Patch(target, namespace, _name(obj), current, wanted, reason, key=min_scale_key(annotations)))

    def restore(target: str, obj: dict, floor: str, reason: str) -> None:
        """Disabling: only the product's own "0" goes back to the floor."""
        annotations = _annotations(obj)
        current = min_scale_current(annotations)
        if current == "0" and floor != "0":
            patches.append(Patch(target, namespace, _name(obj), current, floor, reason, key=min_scale_key(annotations)))
        else:
            holding.append(f"{target} {namespace}/{_name(obj)}")

    if "knative services" in unserved:
        notes.append("Knative Serving is not served on this cluster: no pynodes or models to switch")
    elif "knative services" in unreadable:
        incomplete.append(f"pynodes and models of {namespace}: cannot read Knative Services: "
                          f"{unreadable['knative services']}")
    else:
        for ksvc in sorted(pynodes, key=_name):
            patch = _pynode_patch(ksvc, namespace=namespace, setting=setting_for("pynode", _name(ksvc)),
                                  applied=applied, enabled_since=enabled_since,
                                  zero_initial=lever.initial_scale.zero_allowed)
            if patch is None:
                holding.append(f"ksvc {namespace}/{_name(ksvc)}")
            else:
                patches.append(patch)

    lever_kind = "revisions" if lever.target == VIA_REVISION else "podautoscalers"
    if "inferenceservices" in unserved:
        notes.append("KServe is not served on this cluster: no models to switch")
    elif "knative services" in unserved or "knative services" in unreadable:
        pass  # said above
    elif "inferenceservices" in unreadable:
        incomplete.append(f"models of {namespace}: cannot read InferenceServices: {unreadable['inferenceservices']}")
    elif inference_services and lever_kind in unserved:
        skipped.append(f"models of {namespace}: {lever_kind} are not served on this cluster, so models cannot be "
                       "switched; they stay at their own floor")
    elif inference_services and (lever_kind in unreadable or "revisions" in unreadable):
        kind = lever_kind if lever_kind in unreadable else "revisions"
        incomplete.append(f"models of {namespace}: cannot read {kind}: {unreadable[kind]}")
    else:
        ksvc_by_name = {_name(k): k for k in knative_services}
        rev_by_name = {_name(r): r for r in revisions}
        pa_by_name = {_name(p): p for p in podautoscalers}
        for isvc in sorted(inference_services, key=_name):
            name = _name(isvc)
            if _annotations(isvc).get(DEPLOYMENT_MODE) in RAW_MODES:
                skipped.append(f"inferenceservice {namespace}/{name}: raw deployment mode cannot scale to zero")
                continue
            ksvc = ksvc_by_name.get(f"{name}-predictor") or ksvc_by_name.get(f"{name}-predictor-default")
            if ksvc is None:
                skipped.append(f"inferenceservice {namespace}/{name}: no predictor Knative Service yet")
                continue
            floor = model_floor(isvc)
            own = setting_for("inferenceservice", name)
            reason = f"model {name}: scale to zero {setting}" if own == setting else \
                f"model {name}: exempt from scale to zero, kept at its owner's floor"
            for rev_name in routed_revisions(ksvc):
                revision, pa = rev_by_name.get(rev_name), pa_by_name.get(rev_name)
                target = revision if lever.target == VIA_REVISION else pa
                if target is not None:
                    target_kind = "revision" if lever.target == VIA_REVISION else "podautoscaler"
                    if own == ENABLED:
                        consider(target_kind, target, "0", reason)
                    else:
                        restore(target_kind, target, floor, reason)
                if own == DISABLED and lever.target == VIA_PODAUTOSCALER and revision is not None:
                    # A "0" on the Revision of an awake model can only be an earlier Revision
                    # patch; left there, a Knative that copies it to the PA keeps the model
                    # cold. Undoing it restarts the model's pods, which warm is worth.
                    annotations = _annotations(revision)
                    if min_scale_current(annotations) == "0" and floor != "0":
                        patches.append(Patch("revision", namespace, rev_name, "0", floor,
                                             f"model {name}: undo an earlier Revision patch (restarts its pods)",
                                             key=min_scale_key(annotations)))
    return ScaleToZeroPlan(namespace=namespace, setting=setting, patches=tuple(patches), holding=tuple(holding),
                           skipped=tuple(skipped), mechanism=lever.describe(), notes=tuple(notes),
                           incomplete=tuple(incomplete), exempt=tuple(exempt))


def pynode_initial_zero(ksvc: dict) -> tuple[tuple[str, str], str | None]:
    """The initial-scale "0" the switch puts on a pynode's template beside its min-scale "0"
    (key, "0"), so that the new Revision starts no pod, and the owner's initial scale to
    write down for the wake to give back ("" = none; None = written down already). Only
    where config-autoscaler allows a zero initial scale: Knative refuses the "0" otherwise."""
    template, notes = _annotations(ksvc, template=True), _annotations(ksvc)
    key = initial_scale_key(template)
    return (key, "0"), (None if OWNER_INITIAL_SCALE in notes else template.get(key) or "")


def pynode_initial_zero_patch(ksvc: dict, *, reason: str) -> Patch | None:
    """The switch's initial-scale "0" alone, for a pynode the org holds at min-scale "0"
    whose template lacks it (the switch ran while the cluster did not allow a zero initial
    scale): another writer that makes the pynode a new Revision (the runbook's redeploy)
    adds it so that Revision starts no pod, and the wake gives the owner's value back as
    for the switch's own. None when the template already has it."""
    meta = ksvc.get("metadata") or {}
    template = _annotations(ksvc, template=True)
    (key, zero), record_initial = pynode_initial_zero(ksvc)
    if template.get(key) == zero:
        return None
    current = min_scale_current(template)
    return Patch("ksvc", meta.get("namespace", ""), _name(ksvc), current, current, reason,
                 key=min_scale_key(template), initial=(key, zero), record_initial=record_initial)


def _pynode_patch(ksvc: dict, *, namespace: str, setting: str, applied: str,
                  zero_initial: bool = False, enabled_since: datetime | None = None) -> Patch | None:
    template = _annotations(ksvc, template=True)
    notes = _annotations(ksvc)
    current = min_scale_current(template)
    recorded = OWNER_MIN_SCALE in notes
    name, key = _name(ksvc), min_scale_key(template)
    reason = f"pynode: scale to zero {setting}"
    initial_key = initial_scale_key(template)
    if setting == ENABLED:
        if current == "0" and recorded:
            return None
        # A value other than "0" is the owner's, also over an earlier record: an owner who
        # changed the floor while the org slept gets the new one back when it wakes.
        owner = current if current != "0" else pynode_floor(ksvc, applied=applied, enabled_since=enabled_since)
        record = owner or ""
        if recorded and notes[OWNER_MIN_SCALE] == record:
            record = None   # written down already
        initial = record_initial = None
        if zero_initial:
            initial, record_initial = pynode_initial_zero(ksvc)
        return Patch("ksvc", namespace, name, current, "0", reason, key=key,
                     record=record, initial=initial, record_initial=record_initial)
    floor = pynode_floor(ksvc, applied=applied, enabled_since=enabled_since)
    if not recorded and current == floor:
        return None
    initial = (initial_key, notes[OWNER_INITIAL_SCALE] or None) if OWNER_INITIAL_SCALE in notes else None
    return Patch("ksvc", namespace, name, current, floor, reason, key=key, clear_record=recorded, initial=initial)


# --- exemptions and snoozes -------------------------------------------------------------------
# Stable words stored on prune decisions and shown as skip reasons.
HELD_EXEMPT = "exempted-by-operator"
HELD_SNOOZED = "snoozed-by-operator"


def duration_words(delta: timedelta) -> str:
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else "under a minute"


@dataclass(frozen=True)
class Hold:
    """An operator's exemption (no `until`: until removed) or snooze (until a time) of an
    org or one workload from dormancy and pruning. A snooze past its time simply stops
    applying: every reader compares with `now`, nothing has to run when it ends."""

    until: datetime | None
    reason: str = ""

    def active(self, now: datetime) -> bool:
        return self.until is None or self.until > now

    @property
    def word(self) -> str:
        """The skip reason the pruner records for what this hold keeps."""
        return HELD_EXEMPT if self.until is None else HELD_SNOOZED

    def remaining(self, now: datetime) -> timedelta | None:
        return None if self.until is None else max(self.until - now, timedelta(0))

    def describe(self, now: datetime) -> str:
        why = f": {self.reason}" if self.reason else ""
        if self.until is None:
            return f"exempt until removed{why}"
        if not self.active(now):
            return f"snooze ended {self.until:%Y-%m-%d %H:%M} UTC{why}"
        return f"snoozed for {duration_words(self.until - now)} more (until {self.until:%Y-%m-%d %H:%M} UTC){why}"


# The longest snooze an operator may set: beyond it, an exemption says what is meant.
SNOOZE_MAX = timedelta(days=366)


def snooze_until(*, now: datetime, duration: timedelta | None = None, until: datetime | None = None) -> datetime:
    """The end of a snooze given as a duration from `now` or as a time; refused by name
    when it is not in the future or longer than SNOOZE_MAX."""
    if (duration is None) == (until is None):
        raise ValueError("give the snooze a duration or an end time (one of them)")
    if duration is not None:
        seconds = duration.total_seconds()
        if seconds != seconds or seconds <= 0:  # NaN compares unequal to itself
            raise ValueError(f"snooze duration must be positive, got {duration}")
        if duration > SNOOZE_MAX:
            raise ValueError(f"snooze duration must be at most {SNOOZE_MAX.days} days, got {duration}; "
                             "exempt the org or workload instead")
        return now + duration
    if until.tzinfo is None:
        raise ValueError("snooze end time must carry a time zone")
    if until <= now:
        raise ValueError(f"snooze end time must be in the future, got {until:%Y-%m-%d %H:%M %Z}")
    if until - now > SNOOZE_MAX:
        raise ValueError(f"snooze end time must be within {SNOOZE_MAX.days} days; exempt instead")
    return until


# --- the dormancy sweep ------------------------------------------------------------------------
class OrgActivity(NamedTuple):
    """What the sweep needs to know of one org (a tuple: the sweep reads thousands per run)."""

    id: int
    slug: str
    last_activity_at: datetime | None
    dormant: bool
    scale_to_zero_allowed: bool
    exempt: bool = False
    snoozed_until: datetime | None = None

    def held(self, now: datetime) -> bool:
        return self.exempt or (self.snoozed_until is not None and self.snoozed_until > now)


@dataclass(frozen=True)
class SweepPlan:
    now: datetime
    cutoff: datetime
    to_dormant: tuple[str, ...] = field(default_factory=tuple)
    over_budget: tuple[str, ...] = field(default_factory=tuple)
    held: tuple[str, ...] = field(default_factory=tuple)       # idle, but exempt or snoozed
    chosen: tuple[OrgActivity, ...] = field(default_factory=tuple)   # the orgs of `to_dormant`, as read

    def describe(self) -> list[str]:
        lines = [f"{slug}: no activity since before {self.cutoff:%Y-%m-%d %H:%M} UTC → dormant"
                 for slug in self.to_dormant]
        return lines + self.describe_left_awake()

    def describe_left_awake(self) -> list[str]:
        """The idle orgs the plan leaves awake, and why (a sweep that ran says them too)."""
        lines = [f"{slug}: would turn dormant, left for the next sweep (budget)" for slug in self.over_budget]
        lines += [f"{slug}: idle, but exempt or snoozed: stays awake" for slug in self.held]
        return lines


def sweep_cutoff(*, now: datetime, dormant_after: timedelta) -> datetime:
    if dormant_after <= timedelta(0):
        raise ValueError(f"the dormancy period must be positive, got {dormant_after}")
    return now - dormant_after


def is_idle(org: OrgActivity, cutoff: datetime) -> bool:
    """Awake with no activity since before `cutoff`. The sweep's database read narrows to
    these orgs (by the indexed columns) before `plan_sweep` applies the whole rule.

    An org never seen active counts from its registration: callers pass that time as
    `last_activity_at` (a new org is not dormant at birth)."""
    return not org.dormant and org.last_activity_at is not None and org.last_activity_at < cutoff


def is_sweepable(org: OrgActivity, cutoff: datetime, now: datetime) -> bool:
    """The dormancy rule, the only statement of it: idle, scale to zero allowed, and
    neither exempt nor snoozed. The sweep marks exactly the orgs its plan chose."""
    return is_idle(org, cutoff) and org.scale_to_zero_allowed and not org.held(now)


def plan_sweep(*, orgs: list[OrgActivity], now: datetime, dormant_after: timedelta, budget: int) -> SweepPlan:
    """Which orgs the sweep marks dormant: at most `budget`, longest idle first."""
    if budget < 0:
        raise ValueError(f"the sweep budget must be >= 0, got {budget}")
    cutoff = sweep_cutoff(now=now, dormant_after=dormant_after)
    due = sorted((o for o in orgs if is_sweepable(o, cutoff, now)), key=lambda o: (o.last_activity_at, o.id))
    held = sorted(o.slug for o in orgs if is_idle(o, cutoff) and o.scale_to_zero_allowed and o.held(now))
    return SweepPlan(now=now, cutoff=cutoff, to_dormant=tuple(o.slug for o in due[:budget]),
                     over_budget=tuple(o.slug for o in due[budget:]), held=tuple(held),
                     chosen=tuple(due[:budget]))
