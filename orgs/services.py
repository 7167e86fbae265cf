"""Writes for orgs: activity, the dormancy sweep, scale to zero on the cluster, admin acts.

Decisions come from `orgs.planning`; this module re-reads the state right before acting,
applies through the Kubernetes gateway and records what it did.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils.text import slugify

from django.db.models import Exists, OuterRef, Q

from clusters import discovery, kube
from clusters.errors import Conflict, KubeError, NotFound, is_transient
from clusters.models import Cluster
from config import clock
from config.actors import actor_label_current
from orgs import planning
from orgs.models import AuditRecord, DormancySwitch, Org

logger = logging.getLogger(__name__)

TARGETS = {"ksvc": kube.KNATIVE_SERVICES, "revision": kube.REVISIONS, "podautoscaler": kube.PODAUTOSCALERS}
CONFLICT_RETRIES = 3   # a 409 on a merge patch is a race with a controller: try again at once
# The retry task (config/schedule.py "orgs: scale-to-zero retry") runs every RETRY_EVERY and
# leaves alone an org whose switch is younger than RETRY_GRACE (its queued apply is normally
# done within a second): an org whose wanted setting is not the applied one is applied again
# within RETRY_EVERY + RETRY_GRACE of its switch, whatever became of the queue message.
RETRY_EVERY = timedelta(seconds=60)
RETRY_GRACE = timedelta(seconds=30)
RETRY_BUDGET = 200   # orgs per retry run; the rest wait a minute
RETRY_PROMISE = "within 2 minutes"


def audit(*, action: str, actor, org: Org | None, old: dict, new: dict, at: datetime, cause: str = "") -> AuditRecord:
    return AuditRecord.objects.create(action=action, actor=actor, org=org, old=old, new=new, at=at,
                                      cause=cause[:200])


def _enqueue_apply(org_id: int, switch_id: int | None, *, urgent: bool) -> str:
    """Queue the cluster work. Returns "" when queued, else why not: the org row holds the
    intent and the retry task applies it (RETRY_PROMISE), so a broker failure loses nothing."""
    from orgs.tasks import HIGH_PRIORITY, NORMAL_PRIORITY, org_scale_to_zero_apply

    try:
        org_scale_to_zero_apply.apply_async(args=[org_id], kwargs={"switch_id": switch_id},
                                            priority=HIGH_PRIORITY if urgent else NORMAL_PRIORITY)
    except Exception as exc:  # noqa: BLE001 - the database state is right; the retry task will act
        logger.error("could not queue scale-to-zero apply for org %s: %s; the retry task applies it %s",
                     org_id, exc, RETRY_PROMISE)
        return f"{type(exc).__name__}: {exc}"
    return ""


# --- activity -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarkActiveResult:
    """What recording an activity did: whether the org woke, and whether its wake reached
    the queue (None: nothing to queue, or queued when the caller's transaction commits)."""

    org: str
    woke: bool
    queued: bool | None = None
    queue_error: str = ""

    def describe(self) -> str:
        if not self.woke:
            return f"{self.org}: activity recorded (it was awake)"
        if self.queued is False:
            return (f"{self.org}: activity recorded; it was dormant and is marked active, but the scale-to-zero "
                    f"disable could not be queued ({self.queue_error}); the retry task applies it {RETRY_PROMISE} "
                    "once the queue answers")
        if self.queued:
            return f"{self.org}: activity recorded; it was dormant, scale to zero disable queued at high priority"
        return f"{self.org}: activity recorded; it was dormant and is marked active"


def org_mark_active(*, org_slug: str, cause: str, actor=None, at: datetime | None = None,
                    enqueue: bool = True) -> MarkActiveResult:
    """Record activity now; a dormant org becomes active at once and its scale to zero
    is disabled at high priority (queued; `enqueue=False`: the caller applies it)."""
    now = at or clock.now()
    # The common case, one UPDATE: an active org only gets its activity time. Its row
    # lock makes a concurrent sweep re-check the condition and leave the org alone.
    if Org.objects.filter(slug=org_slug, dormant=False).update(last_activity_at=now):
        if actor is not None:
            org = Org.objects.get(slug=org_slug)
            audit(action="org_mark_active", actor=actor, org=org, old={"dormant": False},
                  new={"dormant": False, "last_activity_at": now.isoformat()}, at=now, cause=cause)
        return MarkActiveResult(org=org_slug, woke=False)
    queue_errors: list[str] = []
    with transaction.atomic():
        try:
            org = Org.objects.select_for_update().get(slug=org_slug)
        except Org.DoesNotExist:
            raise Org.DoesNotExist(f"no org with slug {org_slug!r}") from None
        old = {"dormant": org.dormant, "dormant_since": org.dormant_since and org.dormant_since.isoformat()}
        org.last_activity_at = now
        woke = org.dormant
        if woke:
            org.dormant, org.dormant_since = False, None
        org.save(update_fields=["last_activity_at", "dormant", "dormant_since"])
        if woke:
            switch = DormancySwitch.objects.create(org=org, at=now, direction=DormancySwitch.Direction.TO_ACTIVE,
                                                   cause=cause, actor=actor)
            org_id, switch_id = org.id, switch.id
            if enqueue:
                transaction.on_commit(lambda: queue_errors.append(_enqueue_apply(org_id, switch_id, urgent=True)))
        if actor is not None:
            audit(action="org_mark_active", actor=actor, org=org, old=old, new={"dormant": False}, at=now,
                  cause=cause)
    if not (woke and enqueue):
        return MarkActiveResult(org=org_slug, woke=woke)
    if not queue_errors:  # the caller's own transaction holds the commit, and the queueing
        return MarkActiveResult(org=org_slug, woke=True)
    return MarkActiveResult(org=org_slug, woke=True, queued=not queue_errors[0], queue_error=queue_errors[0])


# --- the dormancy sweep -------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepResult:
    now: datetime
    cutoff: datetime
    dry_run: bool
    switched: tuple[str, ...]
    lines: tuple[str, ...] = ()
    switches: tuple[tuple[int, int], ...] = ()   # (org id, switch id) of each org marked

    def as_dict(self) -> dict:
        return {"now": self.now.isoformat(), "cutoff": self.cutoff.isoformat(), "dry_run": self.dry_run,
                "dormant": list(self.switched), "lines": list(self.lines)}


_SWEEP_CONDITION = "NOT o.dormant AND o.scale_to_zero_allowed AND o.last_activity_at < %(cutoff)s"

# PostgreSQL: marking and recording in ONE statement. IMPORTANT: the condition is in the
# UPDATE's own WHERE, so a row an activity changed meanwhile is re-checked on its newest
# version (READ COMMITTED re-evaluation) and an org with fresh activity is never marked.
_SWEEP_PG = f"""
WITH switched AS (
    UPDATE orgs_org o SET dormant = TRUE, dormant_since = %(now)s
    WHERE {_SWEEP_CONDITION} {{budget}}
    RETURNING o.id, o.slug
), recorded AS (
    INSERT INTO orgs_dormancyswitch (org_id, at, direction, cause, actor_id, actor_label, patched, errors)
    SELECT id, %(now)s, 'dormant', %(cause)s, %(actor)s, %(actor_label)s, '[]'::jsonb, '[]'::jsonb FROM switched
    RETURNING id, org_id
)
SELECT s.id, s.slug, r.id FROM switched s JOIN recorded r ON r.org_id = s.id
"""
_SWEEP_SQLITE = f"""
UPDATE orgs_org AS o SET dormant = 1, dormant_since = %(now)s
WHERE {_SWEEP_CONDITION} {{budget}}
RETURNING id, slug
"""
_BUDGET = ("AND o.id IN (SELECT i.id FROM orgs_org i WHERE NOT i.dormant AND i.scale_to_zero_allowed"
           " AND i.last_activity_at < %(cutoff)s ORDER BY i.last_activity_at, i.id LIMIT %(budget)s)")


class _OverBudget(Exception):
    """The unlimited sweep statement marked more orgs than the budget: roll it back."""


def _sweep_statement(params: dict, *, limited: bool, now: datetime, actor) -> list[tuple[int, str, int]]:
    """Mark and record in the database; returns (org id, slug, switch id) of each org marked."""
    budget_sql = _BUDGET if limited else ""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One round trip: the switches' ids come back with the orgs (no second query).
            cursor.execute(_SWEEP_PG.format(budget=budget_sql), params)
            return cursor.fetchall()
        cursor.execute(_SWEEP_SQLITE.format(budget=budget_sql), params)
        marked = cursor.fetchall()
    created = DormancySwitch.objects.bulk_create(
        DormancySwitch(org_id=org_id, at=now, direction=DormancySwitch.Direction.TO_DORMANT,
                       cause=params["cause"], actor=actor) for org_id, _ in marked)
    return [(org_id, slug, switch.id) for (org_id, slug), switch in zip(marked, created)]


def dormancy_sweep(*, now: datetime, actor=None, dry_run: bool = False, budget: int | None = None,
                   enqueue: bool = True) -> SweepResult:
    """Mark orgs with no activity for ORGS_DORMANT_AFTER dormant, and queue enabling scale to zero
    (`enqueue=False`: the caller applies it, as the CLI does to report what was applied).

    At most `budget` orgs (ORGS_SWEEP_BUDGET) per sweep, longest idle first; 0 marks none,
    as the dry run says."""
    budget = settings.ORGS_SWEEP_BUDGET if budget is None else budget
    if dry_run:
        rows = Org.objects.values_list("id", "slug", "last_activity_at", "dormant", "scale_to_zero_allowed")
        plan = planning.plan_sweep(orgs=[planning.OrgActivity(*row) for row in rows], now=now,
                                   dormant_after=settings.ORGS_DORMANT_AFTER, budget=budget)
        return SweepResult(now=now, cutoff=plan.cutoff, dry_run=True, switched=plan.to_dormant,
                           lines=tuple(plan.describe()))
    cutoff = planning.sweep_cutoff(now=now, dormant_after=settings.ORGS_DORMANT_AFTER)
    if budget < 0:
        raise ValueError(f"the sweep budget must be >= 0, got {budget}")
    ops = connection.ops
    params = {"now": ops.adapt_datetimefield_value(now), "cutoff": ops.adapt_datetimefield_value(cutoff),
              "cause": DormancySwitch.Cause.ADMIN if actor else DormancySwitch.Cause.SWEEP,
              "actor": actor.pk if actor else None, "actor_label": actor_label_current(), "budget": budget}
    with transaction.atomic():
        switched: list[tuple[int, str, int]] = []
        if budget:
            # The budget's ordered sub-select costs about a quarter of the sweep, and it only
            # bites when more orgs are due than the budget allows (a clock jump). So the plain
            # statement runs first in a savepoint; only when it marked more than `budget` is it
            # rolled back and the ordered, limited one run instead (longest idle first).
            try:
                with transaction.atomic():
                    switched = _sweep_statement(params, limited=False, now=now, actor=actor)
                    if len(switched) > budget:
                        raise _OverBudget
            except _OverBudget:
                switched = _sweep_statement(params, limited=True, now=now, actor=actor)
        slugs = tuple(sorted(slug for _, slug, _ in switched))
        if actor is not None:
            audit(action="dormancy_sweep", actor=actor, org=None, old={}, new={"dormant": list(slugs)}, at=now)
        if switched and enqueue:
            pairs = [(org_id, switch_id) for org_id, _, switch_id in switched]
            transaction.on_commit(lambda: [_enqueue_apply(i, s, urgent=False) for i, s in pairs])
    return SweepResult(now=now, cutoff=cutoff, dry_run=False, switched=slugs,
                       lines=tuple(f"{s}: dormant" for s in slugs),
                       switches=tuple(sorted((org_id, switch_id) for org_id, _, switch_id in switched)))


# --- scale to zero on the cluster ---------------------------------------------------------------
@dataclass
class Workloads:
    pynodes: list[dict] = field(default_factory=list)
    inference_services: list[dict] = field(default_factory=list)
    knative_services: list[dict] = field(default_factory=list)
    revisions: list[dict] = field(default_factory=list)
    podautoscalers: list[dict] = field(default_factory=list)
    unserved: tuple[str, ...] = ()                       # kinds the cluster does not serve
    unreadable: dict[str, KubeError] = field(default_factory=dict)   # kinds whose read failed, and why


# What the planner calls each kind, the attribute it lands in, and its resource.
_KINDS = (("knative services", "knative_services", kube.KNATIVE_SERVICES),
          ("inferenceservices", "inference_services", kube.INFERENCESERVICES),
          ("revisions", "revisions", kube.REVISIONS),
          ("podautoscalers", "podautoscalers", kube.PODAUTOSCALERS))


def _by_namespace(items: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for item in items:
        grouped.setdefault(item["metadata"].get("namespace", ""), []).append(item)
    return grouped


@dataclass
class ClusterWorkloads:
    """What `workloads_read` found, by namespace, and which kinds were not served or read."""

    by_namespace: dict[str, Workloads]
    unserved: tuple[str, ...] = ()
    unreadable: dict[str, KubeError] = field(default_factory=dict)

    def of(self, namespace: str) -> Workloads:
        found = self.by_namespace.get(namespace) or Workloads()
        found.unserved, found.unreadable = self.unserved, dict(self.unreadable)
        return found


def workloads_read(gateway: kube.KubeGateway, *, namespace: str | None, cluster: Cluster,
                   now: datetime | None = None) -> ClusterWorkloads:
    """The pynodes and models (and what serves them) of one namespace, or of all.

    A kind the cluster does not serve (no KServe, say) is "none here", not a failure; a
    kind whose read fails is named in `unreadable` and the rest is still read, so what
    can be applied is."""
    now = now or clock.now()
    served = discovery.served_groups(cluster=cluster, now=now, gateway=gateway)
    unserved: list[str] = []
    unreadable: dict[str, KubeError] = {}
    by_namespace: dict[str, Workloads] = {}
    for kind, attr, resource in _KINDS:
        try:
            items = discovery.list_if_served(gateway, resource, cluster=cluster, now=now, served=served,
                                             namespace=namespace)
        except KubeError as exc:
            unreadable[kind] = exc
            continue
        if items is None:
            unserved.append(kind)
            continue
        for ns, group in _by_namespace(items).items():
            setattr(by_namespace.setdefault(ns, Workloads()), attr, group)
    for workloads in by_namespace.values():
        workloads.pynodes = [k for k in workloads.knative_services
                             if (k["metadata"].get("labels") or {}).get("capacity.io/component") == "pynode"]
    return ClusterWorkloads(by_namespace=by_namespace, unserved=tuple(unserved), unreadable=unreadable)


@dataclass
class ApplyOutcome:
    org: str
    setting: str
    kind: str = "holding"   # "first apply", "switch", "drift repair", "holding"
    cause: str = ""
    patched: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    old: dict = field(default_factory=dict)
    new: dict = field(default_factory=dict)
    mechanism: str = ""
    failures: list[KubeError] = field(default_factory=list)   # what kept it from being complete

    @property
    def complete(self) -> bool:
        return not self.errors and not self.pending

    @property
    def transient(self) -> bool:
        """Whether trying again later may finish it: some failure was transient (no
        answer, 5xx, 429). Refusals alone (403, 404, 422, a conflict that outlasted its
        re-reads) would be refused again; they stay recorded on the org for an operator."""
        return any(is_transient(exc) for exc in self.failures)

    def summary(self) -> str:
        """One line: what was applied, and what not."""
        what = f"{self.org}: scale to zero {self.setting}"
        if self.complete:
            done = f"{len(self.patched)} workload(s) patched" if self.patched else "already holding, nothing patched"
            return f"{what} applied ({self.kind}): {done}"
        reason = (self.pending or self.errors)[0]
        return (f"{what} NOT fully applied ({self.kind}): {len(self.patched)} patched, "
                f"{len(self.pending)} pending; first: {reason}")


def _patch(gateway: kube.KubeGateway, patch: planning.Patch) -> None:
    resource = TARGETS[patch.target]
    for attempt in range(CONFLICT_RETRIES):
        try:
            gateway.patch(resource, patch.name, patch.merge_patch(), namespace=patch.namespace)
            return
        except Conflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise


def knative_initial_scale_read(gateway: kube.KubeGateway) -> planning.InitialScale:
    """What config-autoscaler says about a zero initial scale. A ConfigMap that cannot be
    read (no permission, no answer) never fails a switch: the pynode is then switched
    without initial-scale "0", which Knative accepts whatever the flag, and the panel
    says that a pod starts."""
    namespace, name = planning.AUTOSCALER_CONFIG.split("/")
    try:
        config = gateway.get(kube.CONFIGMAPS, name, namespace=namespace)
    except NotFound:
        return planning.knative_initial_scale(config=None)
    except KubeError as exc:
        return planning.knative_initial_scale(config=None, error=str(exc))
    return planning.knative_initial_scale(config=config.get("data") or {})


def cluster_knative_lever(*, gateway: kube.KubeGateway, cluster: Cluster, now: datetime) -> planning.Lever:
    """Read the Knative version the cluster states and its autoscaler's initial-scale
    rule, choose the lever by them and record both (with the evidence) on the cluster
    row, where the panel shows them."""
    stated = discovery.knative_version_read(gateway)
    lever = planning.knative_lever(version=stated.version, source=stated.source, looked_at=stated.looked_at)
    if f"no {discovery.KNATIVE_NAMESPACE} namespace" not in stated.looked_at:   # Knative is installed
        lever = lever.with_initial_scale(knative_initial_scale_read(gateway))
    fields = {"knative_version": stated.version[:40], "knative_lever": lever.target,
              "knative_lever_reason": lever.explain()}
    changed = {k: v for k, v in fields.items() if getattr(cluster, k) != v}
    if changed:
        for key, value in changed.items():
            setattr(cluster, key, value)
        cluster.versions_seen_at = now
        cluster.save(update_fields=[*changed, "versions_seen_at"])
    return lever


def _apply_once(org: Org, workloads: Workloads, gateway: kube.KubeGateway, lever: planning.Lever,
                outcome: ApplyOutcome) -> planning.ScaleToZeroPlan:
    plan = planning.plan_scale_to_zero(
        namespace=org.namespace, setting=outcome.setting, pynodes=workloads.pynodes,
        inference_services=workloads.inference_services, knative_services=workloads.knative_services,
        revisions=workloads.revisions, podautoscalers=workloads.podautoscalers, lever=lever, applied=org.applied,
        unserved=workloads.unserved, unreadable={kind: str(exc) for kind, exc in workloads.unreadable.items()})
    outcome.skipped, outcome.notes, outcome.mechanism = list(plan.skipped), list(plan.notes), plan.mechanism
    outcome.pending = list(plan.incomplete)
    if plan.incomplete:   # what could not be planned could not be read
        outcome.failures += workloads.unreadable.values()
    if org.applied == outcome.setting:
        # We believed the setting held: anything to patch now is drift (reverted, failed, or new).
        outcome.drift += [{"workload": f"{p.target} {p.namespace}/{p.name}", "found": p.current,
                           "wanted": p.wanted} for p in plan.patches if p.changes_scale]
    for patch in plan.patches:
        try:
            _patch(gateway, patch)
            outcome.patched.append(patch.describe())
            workload = f"{patch.target} {patch.namespace}/{patch.name}"
            outcome.old.setdefault(workload, patch.current or "unset")
            outcome.new[workload] = patch.wanted or "unset"
        except NotFound:
            outcome.skipped.append(f"{patch.target} {patch.namespace}/{patch.name}: gone before the patch")
        except KubeError as exc:
            outcome.errors.append(f"{patch.describe()}: {exc}")
            outcome.pending.append(f"{patch.target} {patch.namespace}/{patch.name}: {exc}")
            outcome.failures.append(exc)
    return plan


def _kind_of_apply(org: Org, setting: str, switch_id: int | None) -> str:
    if switch_id is not None:
        return "switch"
    if not org.applied:
        return "first apply"
    return "switch" if org.applied != setting else "drift repair"


def org_scale_to_zero_apply(*, org_id: int, now: datetime | None = None, switch_id: int | None = None,
                            workloads: Workloads | None = None, cause: str = "", actor=None) -> ApplyOutcome:
    """Bring the org's pynodes and models to the setting its row wants, and record it:
    the org's state, the switch's record, and an audit row with `cause` for every patch.

    IMPORTANT: the org row is re-read before acting and again after; if an activity (or
    the sweep) changed what it wants meanwhile, the work is redone for the new state,
    so an org that turned active is never left scaled to zero.
    """
    now = now or clock.now()
    org = Org.objects.select_related("cluster").get(id=org_id)
    outcome = ApplyOutcome(org=org.slug, setting=org.wanted)
    if switch_id is not None and not cause:
        switch = DormancySwitch.objects.filter(id=switch_id).first()
        if switch is not None:
            cause = f"switch #{switch.id}: {switch.get_direction_display()} ({switch.get_cause_display()})"
    first_kind = _kind_of_apply(org, org.wanted, switch_id)
    outcome.kind = first_kind
    outcome.cause = cause or first_kind
    try:
        gateway = kube.gateway_for(org.cluster)
        lever = cluster_knative_lever(gateway=gateway, cluster=org.cluster, now=now)
        for _ in range(3):
            outcome.setting = org.wanted
            current = workloads if workloads is not None else \
                workloads_read(gateway, namespace=org.namespace, cluster=org.cluster, now=now).of(org.namespace)
            workloads = None  # a second round reads afresh
            _apply_once(org, current, gateway, lever, outcome)
            org = Org.objects.select_related("cluster").get(id=org_id)
            if org.wanted == outcome.setting:
                break
            outcome.kind, outcome.cause = "switch", "the org switched while it was applied"
    except KubeError as exc:
        outcome.errors.append(f"{org.namespace}: {exc}")
        outcome.pending.append(f"namespace {org.namespace}: {exc}")
        outcome.failures.append(exc)
    if outcome.kind == "drift repair" and not outcome.drift and not outcome.pending:
        outcome.kind = "holding" if not outcome.patched else outcome.kind
    _record_outcome(org, outcome, now=now, switch_id=switch_id, actor=actor)
    return outcome


def _record_outcome(org: Org, outcome: ApplyOutcome, *, now: datetime, switch_id: int | None, actor) -> None:
    fields = {"reconciled_at": now, "last_error": "\n".join(outcome.errors)[:4000], "drift": outcome.drift,
              "pending": outcome.pending}
    if outcome.mechanism:
        fields["mechanism"] = outcome.mechanism[:120]
    if outcome.complete:
        fields["applied"] = outcome.setting
    Org.objects.filter(id=org.id).update(**fields)
    if switch_id is not None:
        switch_fields = {"patched": outcome.patched, "errors": outcome.errors + [
            f"not applied: {p}" for p in outcome.pending if not any(p.split(":")[0] in e for e in outcome.errors)]}
        if outcome.complete:
            switch_fields["applied_at"] = now
        DormancySwitch.objects.filter(id=switch_id).update(**switch_fields)
    if outcome.drift:
        audit(action="scale_to_zero_drift_repaired" if outcome.complete else "scale_to_zero_drift_found",
              actor=actor, org=org, old={d["workload"]: d["found"] for d in outcome.drift},
              new={d["workload"]: d["wanted"] for d in outcome.drift}, at=now, cause=outcome.cause)
    elif outcome.patched or not outcome.complete:
        new = dict(outcome.new)
        if not outcome.complete:
            new["not applied"] = outcome.pending
        audit(action="scale_to_zero_applied" if outcome.complete else "scale_to_zero_apply_incomplete",
              actor=actor, org=org, old={**outcome.old, "setting": org.applied or "never applied"},
              new={**new, "setting": outcome.setting}, at=now, cause=outcome.cause)


def orgs_reconcile(*, now: datetime, cluster: Cluster | None = None) -> list[ApplyOutcome]:
    """Check every org's workloads against its wanted setting and repair what drifted,
    including models and pynodes that appeared since (they get the org's setting).
    Reads each cluster once (cluster-wide lists), then writes only what must change.
    Each outcome says what it was: a first apply, a switch not yet applied, a drift repair."""
    outcomes = []
    clusters = [cluster] if cluster else Cluster.objects.filter(orgs__isnull=False).distinct()
    for each in clusters:
        try:
            gateway = kube.gateway_for(each)
            discovery.cluster_discovery_refresh(cluster=each, now=now, gateway=gateway)
            by_namespace = workloads_read(gateway, namespace=None, cluster=each, now=now)
        except KubeError as exc:
            logger.error("reconcile of cluster %s: cannot read workloads: %s", each.name, exc)
            Org.objects.filter(cluster=each).update(last_error=f"reconcile could not read the cluster: {exc}")
            continue
        for org in Org.objects.filter(cluster=each):
            kind = _kind_of_apply(org, org.wanted, None)
            outcomes.append(org_scale_to_zero_apply(org_id=org.id, now=now, cause=f"reconcile: {kind}",
                                                    workloads=by_namespace.of(org.namespace)))
    return outcomes


def _unapplied_orgs(now: datetime):
    wanted_enabled = Q(dormant=True, scale_to_zero_allowed=True)
    mismatch = (wanted_enabled & ~Q(applied=planning.ENABLED)) | (~wanted_enabled & ~Q(applied=planning.DISABLED)) \
        | ~Q(pending=[])
    fresh_switch = DormancySwitch.objects.filter(org=OuterRef("pk"), at__gt=now - RETRY_GRACE, applied_at__isnull=True)
    return Org.objects.filter(mismatch).exclude(Exists(fresh_switch)).order_by("reconciled_at", "id")


SKIPPED = "skipped"   # an ApplyOutcome's kind: not tried in this pass, its cluster did not answer


def orgs_apply_unapplied(*, now: datetime, budget: int = RETRY_BUDGET) -> list[ApplyOutcome]:
    """Apply again every org whose wanted setting is not the applied one (a lost or failed
    queue message, a partial apply), oldest check first; the org row is the intent.

    A cluster that gave no answer (connection refused, timeout) to one org's apply is not
    tried again for its other orgs in this pass: each would spend the gateway's retries on
    it. They stay unapplied and untouched (outcome kind SKIPPED), and are tried in the next pass."""
    outcomes = []
    silent: dict[int, KubeError] = {}   # cluster id -> the failure that showed it does not answer
    for org in _unapplied_orgs(now).select_related("cluster")[:budget]:
        if org.cluster_id in silent:
            outcomes.append(ApplyOutcome(
                org=org.slug, setting=org.wanted, kind=SKIPPED, cause="retry: cluster did not answer",
                pending=[f"not tried: cluster {org.cluster.name} did not answer this pass "
                         f"({silent[org.cluster_id]}); left for the next pass"]))
            continue
        if org.pending:
            cause = "retry: a partial apply"
        elif not org.applied:
            cause = "retry: first apply"
        else:
            cause = f"retry: wanted {org.wanted}, applied {org.applied}"
        outcome = org_scale_to_zero_apply(org_id=org.id, now=now, cause=cause)
        outcomes.append(outcome)
        unanswered = next((exc for exc in outcome.failures if exc.code == 0), None)
        if unanswered is not None:
            silent[org.cluster_id] = unanswered
    skipped = [o.org for o in outcomes if o.kind == SKIPPED]
    if skipped:
        logger.warning("scale-to-zero retry: %d org(s) not tried, their cluster did not answer: %s",
                       len(skipped), ", ".join(skipped))
    return outcomes


# --- operator acts ---------------------------------------------------------------------------
def org_scale_to_zero_allow(*, org: Org, allowed: bool, actor, now: datetime) -> ApplyOutcome | None:
    """Allow or disallow scale to zero. Disallowing reverts the org's workloads now."""
    if org.scale_to_zero_allowed == allowed:
        return None
    Org.objects.filter(id=org.id).update(scale_to_zero_allowed=allowed)
    action = "org_allow_scale_to_zero" if allowed else "org_disallow_scale_to_zero"
    audit(action=action, actor=actor, org=org, old={"scale_to_zero_allowed": not allowed},
          new={"scale_to_zero_allowed": allowed}, at=now, cause="operator")
    org.scale_to_zero_allowed = allowed
    if org.wanted != org.applied or not allowed:
        return org_scale_to_zero_apply(org_id=org.id, now=now, actor=actor,
                                       cause=f"operator {'allowed' if allowed else 'disallowed'} scale to zero")
    return None


def org_mark_active_now(*, org: Org, actor, now: datetime) -> MarkActiveResult:
    return org_mark_active(org_slug=org.slug, cause=DormancySwitch.Cause.ADMIN, actor=actor, at=now)


# --- the registry of orgs ---------------------------------------------------------------------
@dataclass
class SyncResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def orgs_sync(*, cluster: Cluster, now: datetime) -> SyncResult:
    """Create or update an Org for every namespace labelled `capacity.io/org=<slug>`."""
    result = SyncResult()
    for ns in kube.gateway_for(cluster).list(kube.NAMESPACES, label_selector=planning.ORG_LABEL):
        namespace = ns["metadata"]["name"]
        slug = (ns["metadata"].get("labels") or {}).get(planning.ORG_LABEL, "")
        if not slug or slugify(slug) != slug:
            result.errors.append(f"namespace {namespace}: label {planning.ORG_LABEL}={slug!r} is not a valid slug "
                                 "(lowercase letters, digits, hyphens)")
            continue
        org = Org.objects.filter(slug=slug).first()
        if org is None:
            clash = Org.objects.filter(cluster=cluster, namespace=namespace).first()
            if clash is not None:
                result.errors.append(f"namespace {namespace}: already the namespace of org {clash.slug!r}")
                continue
            # A new org counts as active from now: it is not dormant at birth.
            Org.objects.create(slug=slug, cluster=cluster, namespace=namespace, last_activity_at=now)
            result.created.append(slug)
        elif org.cluster_id != cluster.id:
            result.errors.append(f"namespace {namespace}: org {slug!r} already lives on cluster {org.cluster.name!r}")
        elif org.namespace != namespace:
            Org.objects.filter(id=org.id).update(namespace=namespace)
            result.updated.append(slug)
        else:
            result.unchanged.append(slug)
    return result

