"""Writes for orgs: activity, the dormancy sweep, scale to zero on the cluster, admin acts.

Decisions come from `orgs.planning`; this module re-reads the state right before acting,
applies through the Kubernetes gateway and records what it did.
"""
from __future__ import annotations

import gc
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import orjson
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils.text import slugify

from django.db.models import Exists, F, OuterRef, Q, Value
from django.db.models.functions import Coalesce, Greatest

from clusters import discovery, kube, labels
from clusters.selectors import clusters_with_orgs, knative_initial_scale_read
from clusters.errors import Conflict, KubeError, NotFound, is_transient
from config import clock
from config.actors import acting_as, actor_label_current
from config.celery import app as celery_app, task_send
from orgs import planning
from audit.models import AuditEntry
from audit.services import audit as audit_write
from orgs.models import DormancySwitch, Org, WorkloadExemption
from orgs.selectors import org_enabled_since, workload_holds_read, workload_presence

if TYPE_CHECKING:
    from clusters.models import Cluster

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
# The kind of an apply an operator's exemption or snooze (or its removal) asks for: what
# it patches follows the operator's change, it is no drift.
EXEMPTION_CHANGE = "exemption change"


def audit(*, action: str, actor, org: Org | None, old: dict, new: dict, at: datetime, cause: str = "") -> AuditEntry:
    """An org's change in the one audit trail (target Org/<slug>; none for a sweep or a token)."""
    return audit_write(app="orgs", action=action, actor=actor, org=org, target=f"Org/{org.slug}" if org else "",
                       old=old, new=new, at=at, cause=cause)


# Redis serves priority 0 first (see CELERY_BROKER_TRANSPORT_OPTIONS): waking an org
# must not wait behind a sweep's worth of scale-to-zero enables.
HIGH_PRIORITY = 0
NORMAL_PRIORITY = 6
ORG_SCALE_TO_ZERO_APPLY_TASK = "orgs.tasks.org_scale_to_zero_apply"


def _enqueue_apply(org_id: int, switch_id: int | None, *, urgent: bool) -> str:
    """Queue the cluster work. Returns "" when queued, else why not: the org row holds the
    intent and the retry task applies it (RETRY_PROMISE), so a broker failure loses nothing."""
    try:
        task_send(ORG_SCALE_TO_ZERO_APPLY_TASK, args=[org_id], kwargs={"switch_id": switch_id},
                  priority=HIGH_PRIORITY if urgent else NORMAL_PRIORITY)
    except Exception as exc:  # noqa: BLE001 - the database state is right; the retry task will act
        logger.error("could not queue scale-to-zero apply for org %s: %s; the retry task applies it %s",
                     org_id, exc, RETRY_PROMISE)
        return f"{type(exc).__name__}: {exc}"
    return ""


def _enqueue_applies(pairs: list[tuple[int, int]]) -> str:
    """Queue the cluster work of a sweep's switches, (org id, switch id) each, at normal
    priority over one producer: a sweep of 10,000 orgs borrowed and returned a pooled
    producer 10,000 times, a third of its queueing time (bench/orgs_sweep.py). Returns ""
    when all are queued, else why not: the first failure stops the rest (a broker that
    does not answer is tried once, not once per org), and the retry task applies what
    was not queued (RETRY_PROMISE), since the org rows hold the intent."""
    if not pairs:
        return ""
    queued = 0
    try:
        with celery_app.producer_or_acquire() as producer:
            for org_id, switch_id in pairs:
                task_send(ORG_SCALE_TO_ZERO_APPLY_TASK, args=[org_id], kwargs={"switch_id": switch_id},
                          priority=NORMAL_PRIORITY, producer=producer)
                queued += 1
    except Exception as exc:  # noqa: BLE001 - the database state is right; the retry task will act
        logger.error("could not queue scale-to-zero apply for %d of %d org(s) (first: org %s): %s; the retry "
                     "task applies them %s", len(pairs) - queued, len(pairs), pairs[queued][0], exc,
                     RETRY_PROMISE)
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
    # IMPORTANT: the activity time only moves forward. A write stamped earlier (a process
    # whose clock lags, an event reported late) must not make an org that was just active
    # look idle to the sweep.
    latest = Coalesce(Greatest(F("last_activity_at"), Value(now)), Value(now))
    # The common case, one UPDATE: an active org only gets its activity time. Its row
    # lock makes a concurrent sweep re-check the condition and leave the org alone.
    if Org.objects.filter(slug=org_slug, dormant=False).update(last_activity_at=latest):
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
            if Org.all_objects.filter(slug=org_slug).exclude(retired_at=None).exists():
                raise Org.DoesNotExist(f"org {org_slug!r} is retired: no act reaches it") from None
            raise Org.DoesNotExist(f"no org with slug {org_slug!r}") from None
        old = {"dormant": org.dormant, "dormant_since": org.dormant_since and org.dormant_since.isoformat()}
        org.last_activity_at = max(filter(None, (org.last_activity_at, now)))
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
    over_budget: tuple[str, ...] = ()   # idle and due, left awake for the next sweep (budget)
    held: tuple[str, ...] = ()          # idle, but exempt or snoozed
    # Whether the switches' cluster work reached the queue (None: nothing queued, or queued
    # when the caller's transaction commits), and why not.
    queued: bool | None = None
    queue_error: str = ""

    def as_dict(self) -> dict:
        body = {"now": self.now.isoformat(), "cutoff": self.cutoff.isoformat(), "dry_run": self.dry_run,
                "dormant": list(self.switched), "over_budget": list(self.over_budget), "held": list(self.held),
                "lines": list(self.lines)}
        if self.queued is not None:
            body["queued"] = self.queued
        if self.queue_error:
            body["queue_error"] = self.queue_error
        return body

    def queue_failure(self) -> str:
        """What could not be queued, and what becomes of it ("" when nothing failed)."""
        if self.queued is not False:
            return ""
        return (f"{len(self.switched)} org(s) turned dormant and are marked, but their scale to zero could not be "
                f"queued ({self.queue_error}); the retry task applies it {RETRY_PROMISE} once the queue answers")


# Mark the orgs the plan chose, and record their switches, in one statement. IMPORTANT:
# each row is marked only if it still reads as the plan read it (compare-and-set on the
# columns the rule looks at): an org whose activity, flag or exemption changed since the
# read is left alone. Its row lock makes a concurrent activity or exemption wait for the
# UPDATE, or the UPDATE re-check the newest row version (READ COMMITTED re-evaluation).
_SWEEP_PG = """
WITH chosen AS (
    SELECT (e->>0)::bigint AS id, (e->>1)::timestamptz AS last_activity_at,
           (e->>2)::boolean AS scale_to_zero_allowed, (e->>3)::boolean AS exempt,
           (e->>4)::timestamptz AS snoozed_until
    FROM jsonb_array_elements(%(chosen)s::jsonb) AS e
), switched AS (
    UPDATE orgs_org o SET dormant = TRUE, dormant_since = %(now)s
    FROM chosen c
    WHERE o.id = c.id AND NOT o.dormant
      AND (o.last_activity_at, o.scale_to_zero_allowed, o.exempt, o.snoozed_until)
          IS NOT DISTINCT FROM (c.last_activity_at, c.scale_to_zero_allowed, c.exempt, c.snoozed_until)
    RETURNING o.id
), recorded AS (
    INSERT INTO orgs_dormancyswitch (org_id, at, direction, cause, actor_id, actor_label, patched, errors)
    SELECT id, %(now)s, 'dormant', %(cause)s, %(actor)s, %(actor_label)s, '[]'::jsonb, '[]'::jsonb FROM switched
    RETURNING id, org_id
)
SELECT org_id, id FROM recorded
"""
# SQLite (the demo): the same compare-and-set; its datetimes are text written by one adapter.
_SWEEP_SQLITE = """
UPDATE orgs_org AS o SET dormant = 1, dormant_since = %(now)s
FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.last_activity_at') AS last_activity_at,
             json_extract(value, '$.scale_to_zero_allowed') AS scale_to_zero_allowed,
             json_extract(value, '$.exempt') AS exempt, json_extract(value, '$.snoozed_until') AS snoozed_until
      FROM json_each(%(chosen)s)) AS c
WHERE o.id = c.id AND NOT o.dormant AND o.last_activity_at IS c.last_activity_at
  AND o.scale_to_zero_allowed IS c.scale_to_zero_allowed AND o.exempt IS c.exempt
  AND o.snoozed_until IS c.snoozed_until
RETURNING id, slug
"""


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The sweep makes tens of thousands of short-lived tuples (the rows it reads, the
    plan, the statement's parameter) with no cycles among them, all freed by reference
    counting when it ends. Left on, the cyclic collector counted them and ran a full
    collection of the worker's whole heap midway: 140-190 ms at 10,000 orgs going dormant,
    more than the read itself (bench/orgs_sweep.py). Paused, the count falls back as they
    are freed, so no collection is owed afterwards either."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_SWEEP_COLUMNS = ("id", "slug", "last_activity_at", "dormant", "scale_to_zero_allowed", "exempt", "snoozed_until")


def _sweep_candidates_read(cutoff: datetime) -> list[planning.OrgActivity]:
    """The orgs the rule could pick: awake and idle since before `cutoff` (`planning.is_idle`,
    read through the sweep index so the hourly read stays small), in no order: `plan_sweep`
    decides and orders."""
    candidates = Org.objects.filter(dormant=False, last_activity_at__lt=cutoff).order_by().values_list(
        *_SWEEP_COLUMNS)
    if connection.vendor == "postgresql":
        # The same query, its rows in PostgreSQL's binary format straight from psycopg:
        # timestamps decoded in C and no per-row work of the ORM's, 10,000 rows in about
        # a third of the time (bench/orgs_sweep.py). Same connection, same transaction.
        sql, params = candidates.query.sql_with_params()
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params, binary=True)
            return [planning.OrgActivity._make(row) for row in cursor.fetchall()]
    return [planning.OrgActivity._make(row) for row in candidates]


def _sweep_statement(chosen: tuple[planning.OrgActivity, ...], params: dict, *, now: datetime,
                     actor) -> list[tuple[int, str, int]]:
    """Mark and record the chosen orgs; returns (org id, slug, switch id) of each org marked."""
    if not chosen:
        return []
    if connection.vendor == "postgresql":
        # One JSON array of rows, as read (orjson writes 10,000 in a few ms; a list of
        # Python datetimes adapted one by one as an array parameter took 20 times longer).
        # In id order, the order of the table's rows and of its primary key: the marking
        # then walks both front to back instead of jumping about (the plan's order,
        # longest idle first, is given back to the result below).
        rows = sorted((o.id, o.last_activity_at, o.scale_to_zero_allowed, o.exempt, o.snoozed_until) for o in chosen)
        params = {**params, "chosen": orjson.dumps(rows).decode()}
        with connection.cursor() as cursor:
            # One round trip: the switches' ids come back with the orgs (no second query), and
            # no join back to the marked rows: the plan knows each id's slug.
            cursor.execute(_SWEEP_PG, params)
            switch_of = dict(cursor.fetchall())
        return [(o.id, o.slug, switch_of[o.id]) for o in chosen if o.id in switch_of]
    when = connection.ops.adapt_datetimefield_value   # SQLite: the text its datetimes are stored as
    rows = [{"id": o.id, "last_activity_at": when(o.last_activity_at), "scale_to_zero_allowed": int(o.scale_to_zero_allowed),
             "exempt": int(o.exempt), "snoozed_until": when(o.snoozed_until)} for o in chosen]
    with connection.cursor() as cursor:
        cursor.execute(_SWEEP_SQLITE, {**params, "chosen": json.dumps(rows)})
        marked = cursor.fetchall()
    created = DormancySwitch.objects.bulk_create(
        DormancySwitch(org_id=org_id, at=now, direction=DormancySwitch.Direction.TO_DORMANT,
                       cause=params["cause"], actor=actor) for org_id, _ in marked)
    return [(org_id, slug, switch.id) for (org_id, slug), switch in zip(marked, created)]


def dormancy_sweep(*, now: datetime, actor=None, dry_run: bool = False, budget: int | None = None,
                   enqueue: bool = True) -> SweepResult:
    """Mark dormant the orgs `planning.plan_sweep` chooses (no activity for ORGS_DORMANT_AFTER,
    scale to zero allowed, neither exempt nor snoozed), and queue enabling scale to zero
    (`enqueue=False`: the caller applies it, as the CLI does to report what was applied).

    At most `budget` orgs (ORGS_SWEEP_BUDGET) per sweep, longest idle first; 0 marks none,
    as the dry run says. The dry run shows the same plan the sweep executes."""
    with _cyclic_gc_paused():
        return _dormancy_sweep(now=now, actor=actor, dry_run=dry_run, budget=budget, enqueue=enqueue)


def _dormancy_sweep(*, now: datetime, actor, dry_run: bool, budget: int | None, enqueue: bool) -> SweepResult:
    budget = settings.ORGS_SWEEP_BUDGET if budget is None else budget
    cutoff = planning.sweep_cutoff(now=now, dormant_after=settings.ORGS_DORMANT_AFTER)
    plan = planning.plan_sweep(orgs=_sweep_candidates_read(cutoff), now=now,
                               dormant_after=settings.ORGS_DORMANT_AFTER, budget=budget)
    if dry_run:
        return SweepResult(now=now, cutoff=plan.cutoff, dry_run=True, switched=plan.to_dormant,
                           lines=tuple(plan.describe()), over_budget=plan.over_budget, held=plan.held)
    ops = connection.ops
    params = {"now": ops.adapt_datetimefield_value(now),
              "cause": DormancySwitch.Cause.ADMIN if actor else DormancySwitch.Cause.SWEEP,
              "actor": actor.pk if actor else None, "actor_label": actor_label_current()}
    queue_errors: list[str] = []
    with transaction.atomic():
        switched = _sweep_statement(plan.chosen, params, now=now, actor=actor)
        slugs = tuple(sorted(slug for _, slug, _ in switched))
        if actor is not None:
            audit(action="dormancy_sweep", actor=actor, org=None, old={}, new={"dormant": list(slugs)}, at=now)
        if switched and enqueue:
            pairs = [(org_id, switch_id) for org_id, _, switch_id in switched]
            transaction.on_commit(lambda: queue_errors.append(_enqueue_applies(pairs)))
    changed = sorted(set(plan.to_dormant) - set(slugs))
    lines = tuple(f"{s}: dormant" for s in slugs) + tuple(
        f"{s}: changed since the sweep read it (activity, flag or exemption): left awake" for s in changed) + tuple(
        plan.describe_left_awake())
    # No entry: nothing was queued, or the caller's own transaction holds the commit.
    queued = not queue_errors[0] if queue_errors else None
    return SweepResult(now=now, cutoff=cutoff, dry_run=False, switched=slugs, lines=lines,
                       over_budget=plan.over_budget, held=plan.held,
                       switches=tuple(sorted((org_id, switch_id) for org_id, _, switch_id in switched)),
                       queued=queued, queue_error=queue_errors[0] if queue_errors else "")


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
                   now: datetime | None = None, served: discovery.ServedGroups | None = None) -> ClusterWorkloads:
    """The pynodes and models (and what serves them) of one namespace, or of all
    (`served`: the API groups just read, else the recorded answer or a fresh one).

    A kind the cluster does not serve (no KServe, say) is "none here", not a failure; a
    kind whose read fails is named in `unreadable` and the rest is still read, so what
    can be applied is. After a read that got no answer the cluster is not asked for the
    other kinds (each would spend the gateway's retries): they are unreadable for the same reason."""
    now = now or clock.now()
    served = served or discovery.served_groups(cluster=cluster, now=now, gateway=gateway)
    unserved: list[str] = []
    unreadable: dict[str, KubeError] = {}
    by_namespace: dict[str, Workloads] = {}
    silent: KubeError | None = None   # a read that got no answer: the cluster is not asked again
    for kind, attr, resource in _KINDS:
        if silent is not None:
            unreadable[kind] = silent
            continue
        try:
            items = discovery.list_if_served(gateway, resource, cluster=cluster, now=now, served=served,
                                             namespace=namespace)
        except KubeError as exc:
            unreadable[kind] = exc
            if exc.code == 0:
                silent = exc
            continue
        if items is None:
            unserved.append(kind)
            continue
        for ns, group in _by_namespace(items).items():
            setattr(by_namespace.setdefault(ns, Workloads()), attr, group)
    for workloads in by_namespace.values():
        workloads.pynodes = [k for k in workloads.knative_services
                             if (k["metadata"].get("labels") or {}).get(labels.COMPONENT_LABEL) == labels.PYNODE_COMPONENT]
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


def cluster_knative_lever(*, gateway: kube.KubeGateway, cluster: Cluster, now: datetime) -> planning.Lever:
    """Read the Knative version the cluster states and its autoscaler's initial-scale
    rule, choose the lever by them and record both (with the evidence) on the cluster
    row, where the panel shows them."""
    stated = discovery.knative_version_read(gateway)
    lever = planning.knative_lever(version=stated.version, source=stated.source, looked_at=stated.looked_at)
    if f"no {discovery.KNATIVE_NAMESPACE} namespace" not in stated.looked_at:   # Knative is installed
        # A ConfigMap that cannot be read never fails a switch: the pynode is then switched
        # without initial-scale "0", and the panel says that a pod starts.
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
                outcome: ApplyOutcome, held: dict[tuple[str, str], str] | None = None) -> planning.ScaleToZeroPlan:
    plan = planning.plan_scale_to_zero(
        namespace=org.namespace, setting=outcome.setting, pynodes=workloads.pynodes,
        inference_services=workloads.inference_services, knative_services=workloads.knative_services,
        revisions=workloads.revisions, podautoscalers=workloads.podautoscalers, lever=lever, applied=org.applied,
        unserved=workloads.unserved, unreadable={kind: str(exc) for kind, exc in workloads.unreadable.items()},
        held=held, enabled_since=org_enabled_since(org=org))
    outcome.skipped, outcome.notes, outcome.mechanism = list(plan.skipped), list(plan.notes), plan.mechanism
    outcome.skipped += plan.exempt
    outcome.pending = list(plan.incomplete)
    if plan.incomplete:   # what could not be planned could not be read
        outcome.failures += workloads.unreadable.values()
    if org.applied == outcome.setting and outcome.kind != EXEMPTION_CHANGE:
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
                            workloads: Workloads | None = None, cause: str = "", actor=None,
                            kind: str = "") -> ApplyOutcome:
    """Bring the org's pynodes and models to the setting its row wants, and record it:
    the org's state, the switch's record, and an audit row with `cause` for every patch.
    Workloads an operator exempted or snoozed keep their owner's floor (`kind`
    EXEMPTION_CHANGE: the apply an exemption's change asks for, which is no drift).

    IMPORTANT: the org row is re-read before acting and again after; if an activity (or
    the sweep) changed what it wants meanwhile, the work is redone for the new state,
    so an org that turned active is never left scaled to zero.
    """
    now = now or clock.now()
    org = Org.objects.select_related("cluster").get(id=org_id)
    outcome = ApplyOutcome(org=org.slug, setting=org.wanted)
    switch = None if switch_id is None else DormancySwitch.objects.select_related("actor").filter(id=switch_id).first()
    if switch is not None and not cause:
        cause = f"switch #{switch.id}: {switch.get_direction_display()} ({switch.get_cause_display()})"
    first_kind = kind or _kind_of_apply(org, org.wanted, switch_id)
    outcome.kind = first_kind
    outcome.cause = cause or first_kind
    held, ended = workload_holds_read(org=org, now=now)
    if ended and not kind:
        outcome.cause += "; " + "; ".join(ended)
    try:
        gateway = kube.gateway_for(org.cluster)
        lever = cluster_knative_lever(gateway=gateway, cluster=org.cluster, now=now)
        for _ in range(3):
            outcome.setting = org.wanted
            current = workloads if workloads is not None else \
                workloads_read(gateway, namespace=org.namespace, cluster=org.cluster, now=now).of(org.namespace)
            workloads = None  # a second round reads afresh
            _apply_once(org, current, gateway, lever, outcome, held=held)
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
    # The patches of a switch are the act of whoever made it switch (an operator, a token's
    # caller, a shell), also when a worker applies them with no one in its own context.
    if switch is not None and actor is None:
        actor = switch.actor
    with acting_as(actor_label_current() or (switch.actor_label if switch is not None else "")):
        _record_outcome(org, outcome, now=now, switch_id=switch_id, actor=actor)
    return outcome


def _record_outcome(org: Org, outcome: ApplyOutcome, *, now: datetime, switch_id: int | None, actor) -> None:
    fields = {"reconciled_at": now, "last_error": "\n".join(outcome.errors)[:4000], "drift": outcome.drift,
              "pending": outcome.pending,
              # A retry that leaves it partial again keeps the first time: the age of the partial apply.
              "pending_since": Coalesce(F("pending_since"), Value(now)) if outcome.pending else None}
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


@dataclass
class ReconcileResult:
    """What a reconcile did: each org's outcome, and the clusters it could not reconcile
    (name -> why: unreadable, or it stopped answering), whose other orgs were not touched."""

    outcomes: list[ApplyOutcome] = field(default_factory=list)
    clusters_failed: dict[str, str] = field(default_factory=dict)


def _unanswered(exc: KubeError | None) -> bool:
    return exc is not None and exc.code == 0


def orgs_reconcile(*, now: datetime, cluster: Cluster | None = None) -> ReconcileResult:
    """Check every org's workloads against its wanted setting and repair what drifted,
    including models and pynodes that appeared since (they get the org's setting).
    Reads each cluster once (cluster-wide lists), then writes only what must change.
    Each outcome says what it was: a first apply, a switch not yet applied, a drift repair.

    A cluster that cannot be read, or that gives no answer (connection refused, timeout),
    is a failure of the reconcile, named in `clusters_failed`: its orgs are not tried one
    by one, each spending the gateway's retries on it (as `orgs_apply_unapplied` does)."""
    result = ReconcileResult()
    clusters = [cluster] if cluster else clusters_with_orgs()
    for each in clusters:
        try:
            gateway = kube.gateway_for(each)
            served = discovery.cluster_discovery_refresh(cluster=each, now=now, gateway=gateway)
            by_namespace = workloads_read(gateway, namespace=None, cluster=each, now=now, served=served)
            unread = by_namespace.unreadable
            if unread and (len(unread) + len(by_namespace.unserved) == len(_KINDS)
                           or any(_unanswered(exc) for exc in unread.values())):
                # No kind of workload could be read, or the cluster gave no answer: no org can be checked.
                raise next((exc for exc in unread.values() if _unanswered(exc)), next(iter(unread.values())))
        except KubeError as exc:
            logger.error("reconcile of cluster %s: cannot read workloads: %s", each.name, exc)
            Org.objects.filter(cluster=each).update(last_error=f"reconcile could not read the cluster: {exc}")
            result.clusters_failed[each.name] = f"could not be read: {exc}"
            continue
        orgs = list(Org.objects.filter(cluster=each).order_by("slug"))
        for done, org in enumerate(orgs, start=1):
            kind = _kind_of_apply(org, org.wanted, None)
            outcome = org_scale_to_zero_apply(org_id=org.id, now=now, cause=f"reconcile: {kind}",
                                              workloads=by_namespace.of(org.namespace))
            result.outcomes.append(outcome)
            unanswered = next((exc for exc in outcome.failures if _unanswered(exc)), None)
            if unanswered is not None and done < len(orgs):
                result.clusters_failed[each.name] = (
                    f"stopped answering ({unanswered}); {len(orgs) - done} org(s) not checked: "
                    f"{', '.join(o.slug for o in orgs[done:])}")
                logger.error("reconcile of cluster %s: %s", each.name, result.clusters_failed[each.name])
                break
    return result


def _unapplied_orgs(now: datetime):
    wanted_enabled = Q(dormant=True, scale_to_zero_allowed=True)
    mismatch = (wanted_enabled & ~Q(applied=planning.ENABLED)) | (~wanted_enabled & ~Q(applied=planning.DISABLED)) \
        | ~Q(pending=[])
    fresh_switch = DormancySwitch.objects.filter(org=OuterRef("pk"), at__gt=now - RETRY_GRACE, applied_at__isnull=True)
    return Org.objects.filter(mismatch).exclude(Exists(fresh_switch)).order_by("reconciled_at", "id")


SKIPPED = "skipped"   # an ApplyOutcome's kind: not tried in this pass, its cluster did not answer


def clusters_with_unapplied_orgs(*, now: datetime) -> list[int]:
    """The ids of the clusters holding an org the retry would apply again (one query)."""
    return sorted(set(_unapplied_orgs(now).order_by().values_list("cluster_id", flat=True)))


def orgs_apply_unapplied(*, now: datetime, budget: int = RETRY_BUDGET,
                         cluster: Cluster | None = None) -> list[ApplyOutcome]:
    """Apply again every org whose wanted setting is not the applied one (a lost or failed
    queue message, a partial apply), oldest check first; the org row is the intent.

    A cluster that gave no answer (connection refused, timeout) to one org's apply is not
    tried again for its other orgs in this pass: each would spend the gateway's retries on
    it. They stay unapplied and untouched (outcome kind SKIPPED), and are tried in the next pass."""
    outcomes = []
    silent: dict[int, KubeError] = {}   # cluster id -> the failure that showed it does not answer
    unapplied = _unapplied_orgs(now) if cluster is None else _unapplied_orgs(now).filter(cluster=cluster)
    for org in unapplied.select_related("cluster")[:budget]:
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
    not_synced: list[str] = field(default_factory=list)   # the namespaces an error kept from syncing


def orgs_sync(*, cluster: Cluster, now: datetime, actor=None) -> SyncResult:
    """Create or update an Org for every namespace labelled `capacity.io/org=<slug>`.

    One org, one namespace: when several namespaces carry the same org label the org is
    left as it was and the error names them all (moving it to either would leave the other's
    workloads as the product last set them, and the next sync would move it back). An org
    moves to a newly labelled namespace only once its old namespace is gone; the move is
    audited, and the new namespace counts as never applied (the retry task applies it)."""
    result = SyncResult()
    gateway = kube.gateway_for(cluster)
    by_slug: dict[str, list[str]] = {}
    for ns in gateway.list(kube.NAMESPACES, label_selector=labels.ORG_LABEL):
        namespace = ns["metadata"]["name"]
        slug = (ns["metadata"].get("labels") or {}).get(labels.ORG_LABEL, "")
        if not slug or slugify(slug) != slug:
            result.errors.append(f"namespace {namespace}: label {labels.ORG_LABEL}={slug!r} is not a valid slug "
                                 "(lowercase letters, digits, hyphens)")
            result.not_synced.append(namespace)
            continue
        by_slug.setdefault(slug, []).append(namespace)
    for slug, namespaces in sorted(by_slug.items()):
        org = Org.objects.filter(slug=slug).first()
        if len(namespaces) > 1:
            kept = f"org {slug!r} is left in namespace {org.namespace}" if org is not None else "no org is created"
            result.errors.append(f"org {slug!r}: namespaces {', '.join(sorted(namespaces))} all carry "
                                 f"{labels.ORG_LABEL}={slug}; {kept} (keep the label on one namespace only)")
            result.not_synced += sorted(namespaces)
            continue
        [namespace] = namespaces
        clash = Org.objects.filter(cluster=cluster, namespace=namespace).exclude(slug=slug).first()
        if org is None:
            if clash is not None:
                result.errors.append(f"namespace {namespace}: already the namespace of org {clash.slug!r}")
                result.not_synced.append(namespace)
                continue
            # A new org counts as active from now: it is not dormant at birth.
            Org.objects.create(slug=slug, cluster=cluster, namespace=namespace, last_activity_at=now)
            result.created.append(slug)
        elif org.cluster_id != cluster.id:
            result.errors.append(f"namespace {namespace}: org {slug!r} already lives on cluster {org.cluster.name!r}")
            result.not_synced.append(namespace)
        elif org.namespace != namespace:
            error = _org_move_refused(gateway, org=org, namespace=namespace, clash=clash)
            if error:
                result.errors.append(error)
                result.not_synced.append(namespace)
                continue
            _org_move(org=org, namespace=namespace, actor=actor, now=now)
            result.updated.append(slug)
        else:
            result.unchanged.append(slug)
    return result


def _org_move_refused(gateway: kube.KubeGateway, *, org: Org, namespace: str, clash: Org | None) -> str:
    """Why the org cannot move to `namespace` ("" when it can): its old namespace still
    exists (its workloads would be left as the product last set them), or another org
    holds the new one."""
    label = f"{labels.ORG_LABEL}={org.slug}"
    if clash is not None:
        return f"namespace {namespace}: labelled {label}, but already the namespace of org {clash.slug!r}"
    try:
        gateway.get(kube.NAMESPACES, org.namespace)
    except NotFound:
        return ""
    except KubeError as exc:
        return (f"namespace {namespace}: labelled {label}, but whether org {org.slug!r}'s namespace {org.namespace} "
                f"is gone could not be read ({exc}); the org is left there")
    return (f"namespace {namespace}: labelled {label}, but org {org.slug!r} lives in namespace {org.namespace}, "
            f"which still exists; the org is left there (delete {org.namespace} to move it, or remove the label "
            f"from {namespace})")


def _org_move(*, org: Org, namespace: str, actor, now: datetime) -> None:
    """Move the org to its new namespace, audited. What was applied held in the old one:
    the new one counts as never applied (the retry task applies the org's setting)."""
    with transaction.atomic():
        locked = Org.objects.select_for_update().get(id=org.id)
        old = {"namespace": locked.namespace, "applied": locked.applied}
        Org.objects.filter(id=org.id).update(namespace=namespace, applied="", pending=[], drift=[])
        audit(action="org_namespace_move", actor=actor, org=locked, old=old,
              new={"namespace": namespace, "applied": ""}, at=now,
              cause=f"sync: namespace {old['namespace']} is gone and {namespace} carries "
                    f"{labels.ORG_LABEL}={org.slug}")


# --- exemptions and snoozes ------------------------------------------------------------------
_WORKLOAD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def _hold_reason_clean(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("reason: say why (it is shown beside the exemption and kept in the audit)")
    if len(reason) > 200:
        raise ValueError(f"reason: at most 200 characters, got {len(reason)}")
    return reason


def _hold_state(exempt: bool, until: datetime | None, reason: str) -> dict:
    if exempt:
        return {"exempt": True, "reason": reason}
    if until is not None:
        return {"snoozed_until": until.isoformat(), "reason": reason}
    return {"exempt": False, "snoozed_until": None}


@dataclass(frozen=True)
class HoldOutcome:
    """What an exemption or snooze (or its end) did, in the panel's words."""

    subject: str
    message: str
    woke: bool = False
    applied: ApplyOutcome | None = None
    waiting: bool = False   # a hold of a workload not on the cluster (yet): it applies once it appears

    def describe(self) -> str:
        text = f"{self.subject}: {self.message}"
        if self.applied is not None:
            text += f"; {self.applied.summary()}"
        return text


def org_hold_set(*, org: Org, until: datetime | None, reason: str, actor, now: datetime) -> HoldOutcome:
    """Exempt the org from dormancy and pruning (`until` None: until removed) or snooze it
    until `until`. A dormant org wakes at once (its workloads return to their owner's
    floor, queued at high priority); the sweep leaves it awake while the hold lasts.

    IMPORTANT: the org row is locked and written, so a sweep between its read and its
    UPDATE sees a changed row and leaves the org alone."""
    reason = _hold_reason_clean(reason)
    if until is not None:
        until = planning.snooze_until(now=now, until=until)
    queue_errors: list[str] = []
    with transaction.atomic():
        locked = Org.objects.select_for_update().get(id=org.id)
        old = _hold_state(locked.exempt, locked.snoozed_until, locked.exemption_reason)
        locked.exempt, locked.snoozed_until, locked.exemption_reason = until is None, until, reason
        woke = locked.dormant
        if woke:
            locked.dormant, locked.dormant_since = False, None
        locked.save(update_fields=["exempt", "snoozed_until", "exemption_reason", "dormant", "dormant_since"])
        action = "org_exempt" if until is None else "org_snooze"
        hold = locked.hold()
        audit(action=action, actor=actor, org=locked, old={**old, "dormant": woke},
              new={**_hold_state(until is None, until, reason), "dormant": False}, at=now,
              cause=f"operator: {hold.describe(now)}")
        if woke:
            switch = DormancySwitch.objects.create(org=locked, at=now, direction=DormancySwitch.Direction.TO_ACTIVE,
                                                   cause=DormancySwitch.Cause.ADMIN, actor=actor)
            org_id, switch_id = locked.id, switch.id
            transaction.on_commit(lambda: queue_errors.append(_enqueue_apply(org_id, switch_id, urgent=True)))
    org.exempt, org.snoozed_until, org.exemption_reason = locked.exempt, locked.snoozed_until, reason
    org.dormant, org.dormant_since = locked.dormant, locked.dormant_since
    message = hold.describe(now)
    if woke:
        if queue_errors and queue_errors[0]:
            message += (f"; it was dormant and is marked active, but returning its workloads to their floor could not "
                        f"be queued ({queue_errors[0]}); the retry task applies it {RETRY_PROMISE}")
        else:
            message += "; it was dormant and is marked active: its workloads return to their owner's floor (queued)"
    return HoldOutcome(subject=org.slug, message=message, woke=woke)


def org_hold_clear(*, org: Org, actor, now: datetime) -> HoldOutcome:
    """End the org's exemption or snooze; the next sweep treats it like any other org."""
    with transaction.atomic():
        locked = Org.objects.select_for_update().get(id=org.id)
        if not locked.exempt and locked.snoozed_until is None:
            return HoldOutcome(subject=org.slug, message="was neither exempt nor snoozed: nothing changed")
        old = _hold_state(locked.exempt, locked.snoozed_until, locked.exemption_reason)
        Org.objects.filter(id=org.id).update(exempt=False, snoozed_until=None, exemption_reason="")
        audit(action="org_exemption_end", actor=actor, org=locked, old=old, new=_hold_state(False, None, ""),
              at=now, cause="operator")
    org.exempt, org.snoozed_until, org.exemption_reason = False, None, ""
    return HoldOutcome(subject=org.slug, message="exemption or snooze ended: the next dormancy sweep and prune "
                                                 "run treat the org like any other")


class WorkloadMissing(ValueError):
    """A hold named a workload that is not on the cluster (or could not be checked): refused."""


def workload_hold_set(*, org: Org, kind: str, name: str, until: datetime | None, reason: str, actor,
                      now: datetime, not_deployed_yet: bool = False) -> HoldOutcome:
    """Exempt (`until` None) or snooze one model or pynode of the org. On a dormant org the
    workload returns to its owner's floor now (applied at once, audited with the cause).

    The workload is read first: one that is not on the cluster, or that cannot be read, is
    refused (`WorkloadMissing`, nothing written), so that no operator believes a misspelt
    model is protected; unless `not_deployed_yet`, the operator's word that the hold is to
    wait for a workload of that name to appear (the outcome then says that it does)."""
    if kind not in WorkloadExemption.Kind.values:
        raise ValueError(f"kind: one of {', '.join(WorkloadExemption.Kind.values)}, not {kind!r}")
    name = (name or "").strip()
    if len(name) > 253 or not _WORKLOAD_NAME.fullmatch(name):
        raise ValueError(f"name: a Kubernetes object name (lowercase letters, digits, '-', '.'; at most 253), "
                         f"not {name!r}")
    reason = _hold_reason_clean(reason)
    if until is not None:
        until = planning.snooze_until(now=now, until=until)
    presence = workload_presence(org=org, kind=kind, name=name)
    if presence.found is not True and not not_deployed_yet:
        raise WorkloadMissing(f"{presence.said}: nothing was exempted or snoozed (check the name; to hold a workload "
                              "before it is deployed, say it is not deployed yet)")
    existing = WorkloadExemption.objects.filter(org=org, kind=kind, name=name).first()
    old = {} if existing is None else _hold_state(existing.until is None, existing.until, existing.reason)
    exemption, _ = WorkloadExemption.objects.update_or_create(
        org=org, kind=kind, name=name,
        defaults={"until": until, "reason": reason, "created_at": now,
                  "created_by": actor if getattr(actor, "pk", None) else None})
    hold = exemption.hold()
    subject = f"{kind} {org.namespace}/{name}"
    audit(action="workload_exempt" if until is None else "workload_snooze", actor=actor, org=org,
          old={"workload": subject, **old}, new={"workload": subject, **_hold_state(until is None, until, reason)},
          at=now, cause=f"operator: {hold.describe(now)}")
    applied = None
    if org.wanted == planning.ENABLED:
        applied = org_scale_to_zero_apply(org_id=org.id, now=now, actor=actor, kind=EXEMPTION_CHANGE,
                                          cause=f"operator exempted {subject} ({hold.describe(now)})")
    message = hold.describe(now)
    if presence.found is not True:
        message += f"; {presence.said}: the hold waits for it and applies when it appears"
    return HoldOutcome(subject=subject, message=message, applied=applied, waiting=presence.found is not True)


def workload_hold_clear(*, exemption: WorkloadExemption, actor, now: datetime) -> HoldOutcome:
    """End a workload's exemption or snooze; on a dormant org it scales to zero again now."""
    org = exemption.org
    subject = f"{exemption.kind} {org.namespace}/{exemption.name}"
    old = _hold_state(exemption.until is None, exemption.until, exemption.reason)
    exemption.delete()
    audit(action="workload_exemption_end", actor=actor, org=org, old={"workload": subject, **old},
          new={"workload": subject, "exempt": False, "snoozed_until": None}, at=now, cause="operator")
    applied = None
    org = Org.objects.get(id=org.id)
    if org.wanted == planning.ENABLED:
        applied = org_scale_to_zero_apply(org_id=org.id, now=now, actor=actor, kind=EXEMPTION_CHANGE,
                                          cause=f"operator ended the exemption of {subject}")
    return HoldOutcome(subject=subject, message="exemption or snooze ended", applied=applied)


# --- previews of operator acts on several orgs --------------------------------------------------
@dataclass
class OrgPreview:
    """What an act would do to one org, planned from a fresh read and written nowhere."""

    org: str
    namespace: str
    now: str                    # the org's state now, in words
    after: str                  # its state after the act, in words
    setting: str                # the scale-to-zero setting it would want
    changes: list[str] = field(default_factory=list)     # workloads whose min-scale would change
    kept: list[str] = field(default_factory=list)        # exempt / skipped / holding, and why
    error: str = ""                                      # the cluster could not be read


def _org_state(org: Org, now: datetime) -> str:
    words = "dormant" if org.dormant else "active"
    words += ", scale to zero " + ("allowed" if org.scale_to_zero_allowed else "disallowed")
    hold = org.hold()
    if hold is not None and hold.active(now):
        words += f", {hold.describe(now)}"
    return words


def orgs_preview(*, orgs: list[Org], act: str, now: datetime) -> list[OrgPreview]:
    """For each org, its state after `act` ("allow", "disallow", "mark_active", "sweep",
    "hold", "hold_clear") and the workloads whose min-scale that would change, from the
    scale-to-zero plan on a fresh read of the cluster. Nothing is written to the cluster."""
    acts = {"allow", "disallow", "mark_active", "sweep", "hold", "hold_clear"}
    if act not in acts:
        raise ValueError(f"act: one of {', '.join(sorted(acts))}, not {act!r}")
    chosen: set[str] = set()
    if act == "sweep":
        cutoff = planning.sweep_cutoff(now=now, dormant_after=settings.ORGS_DORMANT_AFTER)
        chosen = set(planning.plan_sweep(orgs=_sweep_candidates_read(cutoff), now=now,
                                         dormant_after=settings.ORGS_DORMANT_AFTER,
                                         budget=settings.ORGS_SWEEP_BUDGET).to_dormant)
        orgs = list(Org.objects.filter(slug__in=chosen).select_related("cluster"))
    previews: list[OrgPreview] = []
    by_cluster: dict[int, list[Org]] = {}
    for org in orgs:
        by_cluster.setdefault(org.cluster_id, []).append(org)
    for group in by_cluster.values():
        cluster = group[0].cluster
        read: ClusterWorkloads | None = None
        error = ""
        try:
            gateway = kube.gateway_for(cluster)
            lever = cluster_knative_lever(gateway=gateway, cluster=cluster, now=now)
            read = workloads_read(gateway, namespace=group[0].namespace if len(group) == 1 else None,
                                  cluster=cluster, now=now)
        except KubeError as exc:
            error = f"cluster {cluster.name} could not be read: {exc}"
        for org in sorted(group, key=lambda o: o.slug):
            dormant, allowed = org.dormant, org.scale_to_zero_allowed
            if act == "allow":
                allowed = True
            elif act == "disallow":
                allowed = False
            elif act in ("mark_active", "hold"):
                dormant = False
            elif act == "sweep":
                dormant = True
            setting = planning.ENABLED if (dormant and allowed) else planning.DISABLED
            after = ("dormant" if dormant else "active") + ", scale to zero " + ("allowed" if allowed else "disallowed")
            if act == "hold":
                after += ", exempt or snoozed as chosen below"
            elif act == "hold_clear":
                after += ", neither exempt nor snoozed (the next sweep may mark it dormant)"
            preview = OrgPreview(org=org.slug, namespace=org.namespace, now=_org_state(org, now), after=after,
                                 setting=setting, error=error)
            if read is not None:
                workloads = read.of(org.namespace)
                held, _ = workload_holds_read(org=org, now=now)
                plan = planning.plan_scale_to_zero(
                    namespace=org.namespace, setting=setting, pynodes=workloads.pynodes,
                    inference_services=workloads.inference_services, knative_services=workloads.knative_services,
                    revisions=workloads.revisions, podautoscalers=workloads.podautoscalers, lever=lever,
                    applied=org.applied, unserved=workloads.unserved,
                    unreadable={k: str(e) for k, e in workloads.unreadable.items()}, held=held,
                    enabled_since=org_enabled_since(org=org))
                preview.changes = [p.describe() for p in plan.patches]
                preview.kept = list(plan.exempt) + list(plan.skipped) + list(plan.incomplete)
            previews.append(preview)
    return sorted(previews, key=lambda p: p.org)
