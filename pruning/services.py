"""Prune runs and restores: query, plan, act, record.

One run = three PromQL queries (the first two sent at once) + reads of the pods that look
idle (while the third is evaluated) and their owners, by GETs, namespace LISTs or
cluster-wide LISTs, whichever costs least (`reads`) + for each owner acted on: one GET
(re-read), one write, one Event.

A run is owned by its worker through a lease on its row (renewed before every step, at
most `LEASE_SECONDS` ahead). Every scale-down is written ahead: the decision row holds
the before-state and `acting` before the Kubernetes write, `succeeded` or `failed` after
it. A run whose lease lapsed lost its worker: `prune_runs_reconcile` completes it from
the cluster's real state, so whatever a dead worker took away can still be restored.
"""
from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings as dj_settings
from django.db import transaction

from audit.services import audit
from clusters import kube
from clusters.errors import Conflict, KubeError, NotFound, PrometheusError, describe_failure, is_transient
from clusters.knative import INITIAL_SCALE_UNKNOWN, InitialScale
from clusters.prometheus import PrometheusGateway
from clusters.selectors import knative_initial_scale_read
from config import clock
from config.actors import actor_label_current
from config.leases import lease_holder, lease_renew
from orgs import selectors as org_selectors

from . import actions, planning, reads, selectors
from .models import POD_NAMES_KEPT, PruneDecision, PruneRun
from .query import IdleQuery

log = logging.getLogger(__name__)
EVENT_COMPONENT = "gpu-capacity-pruner"

# A run's lease reaches at most this far ahead of its last renewal (seconds; renewed before
# every write): a dead worker's run is completed by the 10 s reconcile beat within 40 s.
LEASE_SECONDS = 30
CONFLICT_ATTEMPTS = 3         # re-read and retry a write refused with 409 this many times in all
RECONCILE_GIVE_UP = timedelta(hours=1)  # a run whose owners cannot be read is marked failed after this
R_INTERRUPTED = "run-interrupted"  # a planned scale-down its run's worker never reached

# Bounds of the run parameters: beyond them a value is a typo, not a wish.
MAX_WINDOW_SECONDS = 7 * 24 * 3600
MAX_GRACE_SECONDS = 7 * 24 * 3600
MAX_SCALE_DOWNS = 10_000
# Watts. The largest data-centre GPUs draw about 1,200 W; a threshold beyond this is a typo.
MAX_POWER_THRESHOLD_WATTS = 10_000.0


class PruneParamError(ValueError):
    """A run parameter out of range; `field` names it (the CLI maps it to its flag)."""

    def __init__(self, field: str, message: str, *, setting: str = ""):
        super().__init__(message)
        self.field = field
        self.setting = setting   # the setting the bad value came from, when it came from one


def _whole(value, field: str, what: str, *, low: int, high: int, unit: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PruneParamError(field, f"{what} must be a whole number{unit}, got {value!r}")
    if not low <= value <= high:
        raise PruneParamError(field, f"{what} must be between {low} and {high}{unit}, got {value!r}")


@dataclass(frozen=True)
class PruneParams:
    """A run's parameters; the CLI flags and the schedule map onto these."""
    window_seconds: int = 1800          # gpu-pruner's --duration, in seconds here
    namespace: str | None = None
    model_name: str | None = None
    run_mode: str = PruneRun.Mode.DRY_RUN
    idle_threshold: float = 0.01
    grace_seconds: int = 300
    label_scheme: str = "auto"
    max_scale_downs: int = 20
    protected_namespaces: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
    step_seconds: int = 60
    max_gap_seconds: int = 120
    # gpu-pruner's power flag: a GPU drawing more watts than this is busy, and one without
    # power data is never idle. None: power is not looked at.
    power_threshold_watts: float | None = None
    # Only owners of these kinds (planning.OWNER_KINDS names) are acted on; None: all.
    owner_kinds: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.run_mode not in PruneRun.Mode.values:
            raise PruneParamError("run_mode", f"run mode must be one of {', '.join(PruneRun.Mode.values)}, "
                                              f"got {self.run_mode!r}")
        if isinstance(self.window_seconds, int) and not isinstance(self.window_seconds, bool) \
                and self.window_seconds < self.step_seconds:
            raise PruneParamError("window_seconds", f"the idle window must be whole seconds >= "
                                                    f"{self.step_seconds}, got {self.window_seconds!r}")
        _whole(self.window_seconds, "window_seconds", "the idle window", low=self.step_seconds,
               high=MAX_WINDOW_SECONDS, unit=" seconds")
        threshold = self.idle_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not math.isfinite(threshold) or not 0 < threshold <= 1:
            raise PruneParamError("idle_threshold", f"idle threshold is a fraction in (0, 1], got {threshold!r}")
        if isinstance(self.grace_seconds, int) and not isinstance(self.grace_seconds, bool) \
                and self.grace_seconds < 0:
            raise PruneParamError("grace_seconds", f"grace period must be >= 0 seconds, got {self.grace_seconds!r}")
        _whole(self.grace_seconds, "grace_seconds", "the grace period", low=0, high=MAX_GRACE_SECONDS,
               unit=" seconds")
        # Zero would plan and then act on nothing: a dry run says that more plainly.
        _whole(self.max_scale_downs, "max_scale_downs", "the cap on scale-downs per run", low=1,
               high=MAX_SCALE_DOWNS)
        watts = self.power_threshold_watts
        if watts is not None and (isinstance(watts, bool) or not isinstance(watts, (int, float))
                                  or not math.isfinite(watts) or not 0 < watts <= MAX_POWER_THRESHOLD_WATTS):
            raise PruneParamError("power_threshold_watts", f"the power threshold is a number of watts in "
                                  f"(0, {MAX_POWER_THRESHOLD_WATTS:g}], got {watts!r}")
        if self.owner_kinds is not None:
            object.__setattr__(self, "owner_kinds", owner_kinds_parse(self.owner_kinds))
        for name in ("namespace", "model_name"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise PruneParamError(name, f"the {name.replace('_', ' ')} filter is empty: leave it out "
                                            "to match everything")
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:   # an undecodable byte of a command-line argument
                    raise PruneParamError(name, f"the {name.replace('_', ' ')} filter {value!r} is not UTF-8 "
                                                "text") from None
        self.query()  # filters, label scheme and gap resolution fail here, before any run is recorded

    @classmethod
    def from_settings(cls, **overrides) -> "PruneParams":
        base = dict(
            window_seconds=getattr(dj_settings, "PRUNER_DURATION_MINUTES", 30) * 60,
            idle_threshold=getattr(dj_settings, "PRUNER_IDLE_THRESHOLD", 0.01),
            grace_seconds=getattr(dj_settings, "PRUNER_GRACE_SECONDS", 300),
            max_scale_downs=getattr(dj_settings, "PRUNER_MAX_SCALE_DOWNS", 20),
            protected_namespaces=tuple(getattr(dj_settings, "PRUNER_PROTECTED_NAMESPACES",
                                               cls.protected_namespaces)),
            label_scheme=getattr(dj_settings, "PRUNER_LABEL_SCHEME", "auto"),
            power_threshold_watts=getattr(dj_settings, "PRUNER_POWER_THRESHOLD_WATTS", None),
            owner_kinds=getattr(dj_settings, "PRUNER_OWNER_KINDS", None) or None,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        base.update(given)
        try:
            return cls(**base)
        except PruneParamError as exc:
            if exc.field in given or exc.field not in SETTING_OF:
                raise
            # A value from the settings: name the setting an operator has to fix.
            raise PruneParamError(exc.field, f"{SETTING_OF[exc.field]}: {exc}",
                                  setting=SETTING_OF[exc.field]) from None

    def query(self) -> IdleQuery:
        return IdleQuery(window_seconds=self.window_seconds, namespace=self.namespace,
                         model_name=self.model_name, label_scheme=self.label_scheme,
                         step_seconds=self.step_seconds, max_gap_seconds=self.max_gap_seconds,
                         idle_threshold=self.idle_threshold, power_threshold_watts=self.power_threshold_watts)

    def settings(self, **more) -> planning.PruneSettings:
        kinds = frozenset(planning.OWNER_KINDS[k] for k in self.owner_kinds) if self.owner_kinds else None
        return planning.PruneSettings(
            window_seconds=self.window_seconds, grace_seconds=self.grace_seconds,
            idle_threshold=self.idle_threshold, protected_namespaces=frozenset(self.protected_namespaces),
            max_scale_downs=self.max_scale_downs, power_threshold_watts=self.power_threshold_watts,
            owner_kinds=kinds, **more)


def owner_kinds_parse(value) -> tuple[str, ...]:
    """Owner kinds from a list or a comma-separated text, by their OWNER_KINDS names
    (any case; "Service" and "ksvc" name the Knative Service). Unknown or none: refused."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = {k.lower(): k for k in planning.OWNER_KINDS} | {"service": "KnativeService", "ksvc": "KnativeService"}
    out = []
    for item in items:
        text = str(item).strip()
        if text.lower() not in names:
            raise PruneParamError("owner_kinds", f"unknown owner kind {text!r}; the pruner acts on "
                                                 f"{', '.join(planning.OWNER_KINDS)}")
        if names[text.lower()] not in out:
            out.append(names[text.lower()])
    if not out:
        raise PruneParamError("owner_kinds", "the owner kinds filter is empty: leave it out to act on every kind")
    return tuple(out)


SETTING_OF = {"window_seconds": "PRUNER_DURATION_MINUTES", "idle_threshold": "PRUNER_IDLE_THRESHOLD",
              "grace_seconds": "PRUNER_GRACE_SECONDS", "max_scale_downs": "PRUNER_MAX_SCALE_DOWNS",
              "label_scheme": "PRUNER_LABEL_SCHEME", "power_threshold_watts": "PRUNER_POWER_THRESHOLD_WATTS",
              "owner_kinds": "PRUNER_OWNER_KINDS"}


SA_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def prometheus_token(*, explicit: str | None, env_name: str | None, sa_token_file: str = SA_TOKEN_FILE) -> str | None:
    """The bearer token: the flag, else the named environment variable, else the pod's
    service-account token (what gpu-pruner used in-cluster), else none."""
    if explicit:
        return explicit
    if env_name and os.environ.get(env_name):
        return os.environ[env_name]
    try:
        with open(sa_token_file, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def prometheus_for(*, cluster=None, url: str | None = None, token: str | None = None,
                   verify_tls: bool | None = None, ca_file: str | None = None) -> PrometheusGateway:
    """The Prometheus gateway of a run: explicit flags win over the cluster row and settings."""
    url = url or (cluster.prometheus_url if cluster else "") or dj_settings.PROMETHEUS_URL
    if not url:
        raise PrometheusError("no Prometheus URL: pass --prometheus-url, set it on the cluster, "
                              "or set PROMETHEUS_URL")
    env_name = (cluster.prometheus_token_env if cluster else "") or dj_settings.PROMETHEUS_TOKEN_ENV
    verify = verify_tls if verify_tls is not None else (cluster.prometheus_verify_tls if cluster else True)
    return PrometheusGateway(url, token=prometheus_token(explicit=token, env_name=env_name),
                             ca_bundle=ca_file or (cluster.prometheus_ca_bundle if cluster else "") or None,
                             verify_tls=verify)


@dataclass
class _Lease:
    """The running run's lease, held by this process; every renewal is one conditional UPDATE."""
    run: PruneRun
    wall_clock: Callable[[], datetime]

    def renew(self, **fields) -> bool:
        """Push the expiry a lease ahead (and save `fields` with it). False when the lease
        was lost: the run was reconciled meanwhile and this process must stop acting."""
        expires = self.wall_clock() + timedelta(seconds=LEASE_SECONDS)
        held = lease_renew(PruneRun.objects.filter(pk=self.run.pk, status=PruneRun.Status.RUNNING),
                           holder=self.run.lease_owner, until=expires, **fields)
        if held:
            self.run.lease_expires_at = expires
        return bool(held)


def prune_run_execute(*, kube_gateway: kube.KubeGateway, prometheus: PrometheusGateway,
                      params: PruneParams, now: datetime, cluster=None, actor: str = "",
                      wall_clock: Callable[[], datetime] | None = None) -> PruneRun:
    """One pass: query, plan, record and — in scale-down mode — act. Returns the run.

    `now` is the run's evaluation time; `wall_clock` (default the product clock) times its lease."""
    wall_clock = wall_clock or clock.now
    started = time.perf_counter()
    calls_before = kube_gateway.calls_total()
    query = params.query()
    run = PruneRun.objects.create(cluster=cluster, actor=actor, mode=params.run_mode, evaluated_at=now,
                                  parameters=asdict(params), query=query.candidates_promql(),
                                  lease_owner=lease_holder("worker"),
                                  lease_expires_at=wall_clock() + timedelta(seconds=LEASE_SECONDS))
    lease = _Lease(run, wall_clock)
    try:
        got = reads.pass_read(prometheus, kube_gateway, query, params.settings(), at=now)
        answer, view = got.answer, got.view
        run.query = "\n\n".join(got.sent)
        namespaces = {ns for ns, _ in got.look_up}
        # What the orgs say of these namespaces: scale to zero turned off, and the
        # exemptions and snoozes operators set on an org or one of its workloads.
        holds = org_selectors.prune_holds(cluster=cluster, namespaces=namespaces, now=now)
        plan = planning.plan_prune(series=list(answer.series), view=view, now=now, pods_seen=answer.pods_seen,
                                   settings=params.settings(
                                       org_blocked_namespaces=org_selectors.namespaces_not_scaling_to_zero(
                                           cluster=cluster, namespaces=namespaces),
                                       held_namespaces=holds.namespaces, held_owners=holds.owners))
        # Once per pass, and only when a Knative Service is to be set to min-scale 0: whether
        # its write may carry initial-scale "0". Unreadable reads as "not allowed", never fails the pass.
        initial = (knative_initial_scale_read(kube_gateway)
                   if any(d.method == planning.M_KNATIVE_MIN_SCALE for d in plan.to_prune) else INITIAL_SCALE_UNKNOWN)
    except (PrometheusError, KubeError) as exc:
        blamed = _filter_refused(exc, params)
        # Missing data is neither a refusal nor worth a retry of this pass: it says what it is.
        why = str(exc) if isinstance(exc, reads.NoSamples) else describe_failure(blamed or exc)
        run.status, run.errors = PruneRun.Status.FAILED, [why]
        _finish(run, started, kube_gateway, calls_before)
        if blamed is not None:
            raise blamed from None
        raise
    except Exception as exc:
        # Nothing was written to the cluster yet: the run says it failed, and why, rather
        # than staying `running` until the reconcile blames a dead worker.
        run.status, run.errors = PruneRun.Status.FAILED, [f"refused: {type(exc).__name__}: {exc}"]
        _finish(run, started, kube_gateway, calls_before)
        raise
    run.pods_seen, run.busy_pods = plan.pods_seen, plan.busy
    run.idle_candidates, run.planned = len(plan.decisions), len(plan.to_prune)
    run.skip_counts = dict(Counter(d.reason for d in plan.decisions if d.decision == planning.SKIP))
    run.notes = [note for note in (planning.knative_initial_scale_note(initial),) if note]
    counts = {f: getattr(run, f) for f in ("pods_seen", "busy_pods", "idle_candidates", "planned", "skip_counts",
                                           "query", "notes")}
    if not lease.renew(**counts):
        return _lease_lost(run)
    with transaction.atomic():  # one commit for all rows, not one per insert batch
        decisions = PruneDecision.objects.bulk_create(_records(run, plan.decisions, params, view, initial),
                                                      batch_size=500)
    if params.run_mode == PruneRun.Mode.SCALE_DOWN:
        for record in decisions:
            if record.decision != PruneDecision.Decision.PRUNE:
                continue
            # IMPORTANT: renew before each write, never after: a worker that lost its run to
            # the reconcile must not touch the cluster again for it.
            if not lease.renew():
                return _lease_lost(run)
            _act(kube_gateway, run, record, params, now, initial)
        _count(run)
        # A scale-down whose outcome could not be read back is no success: the beat settles it.
        unsettled = run.decisions.filter(result=PruneDecision.Result.ACTING).exists()
    else:   # a dry run's rows stay as they were written: counted without reading them back
        _count(run, decisions)
        unsettled = False
    run.status = PruneRun.Status.PARTIAL if run.failed or unsettled else PruneRun.Status.SUCCEEDED
    _finish(run, started, kube_gateway, calls_before)
    return run


@dataclass(frozen=True)
class DryRunStarted:
    """A dry run an operator started from the panel: its run (None when none was recorded,
    e.g. no Prometheus to ask) and, when it failed, why."""
    run: PruneRun | None
    error: str = ""

    def summary(self) -> str:
        """What it found, in the words the panel shows."""
        run = self.run
        if run is None:
            return f"Dry run not started: {self.error}"
        if self.error:
            return f"Dry run #{run.pk} on {run.cluster.name} failed: {self.error}"
        would = list(run.decisions.filter(decision=PruneDecision.Decision.PRUNE)
                     .values_list("namespace", "pod", "owner_kind", "owner_name"))
        named = "; ".join(f"{ns}/{pod} → {kind} {name}" for ns, pod, kind, name in would[:5]) \
            + (f"; … and {len(would) - 5} more" if len(would) > 5 else "")
        return (f"Dry run #{run.pk} on {run.cluster.name}: {run.pods_seen} GPU pod(s) seen, {run.busy_pods} busy, "
                f"{run.idle_candidates} looked idle over {run.parameters['window_seconds'] // 60} min (each pod "
                f"looked at once it ran {run.parameters['window_seconds'] // 60} min + "
                f"{run.parameters['grace_seconds']} s of grace), {len(would)} would be scaled to zero"
                + (f": {named}" if would else "") + ". Nothing was changed.")


def prune_dry_run_start(*, cluster, actor, now: datetime, window_minutes: int | None = None,
                        grace_seconds: int | None = None) -> DryRunStarted:
    """A dry run of the pruner on `cluster` now, started by `actor` (a panel user): the
    settings' parameters, a window and grace given by the operator instead. It changes no
    workload; the audit records who asked and what it found. Bad parameters raise
    PruneParamError before anything is recorded."""
    params = PruneParams.from_settings(run_mode=PruneRun.Mode.DRY_RUN,
                                       window_seconds=None if window_minutes is None else window_minutes * 60,
                                       grace_seconds=grace_seconds)
    label = actor.get_username()
    run, error = None, ""
    try:
        prometheus = prometheus_for(cluster=cluster)
        run = prune_run_execute(kube_gateway=kube.gateway_for(cluster), prometheus=prometheus, params=params,
                                now=now, cluster=cluster, actor=label)
    except (PrometheusError, KubeError) as exc:
        error = str(exc)
        # The run, when one was recorded before the failure, says the same on its page.
        run = PruneRun.objects.filter(cluster=cluster, actor=label, evaluated_at=now).order_by("-pk").first()
    started = DryRunStarted(run=run, error=error)
    audit(app="pruning", action="prune_dry_run", at=now, actor=actor, cause="operator, from the panel",
          target=f"Cluster/{cluster.name}", cluster=cluster, subject=("prune_run", run.pk) if run else None,
          new={"window_minutes": params.window_seconds // 60, "grace_seconds": params.grace_seconds,
               "outcome": started.summary()})
    return started


class FilterRefused(PrometheusError):
    """Prometheus refused a run's query over one of its regular-expression filters;
    `field` names the run parameter (the CLI maps it to its flag)."""

    def __init__(self, message: str, *, field: str):
        super().__init__(message, status=400)
        self.field = field


_REGEXP_REFUSED = re.compile(r"(?:regexp|regular expression)[^`]*`([^`]*)`")


def _filter_refused(exc: Exception, params: PruneParams) -> FilterRefused | None:
    """A 400 over a regular expression names the filter it came from. The filters are
    checked before a run with Python's `re`, which is not Prometheus' RE2: some patterns
    only Prometheus refuses."""
    if not isinstance(exc, PrometheusError) or exc.status != 400 or not _REGEXP_REFUSED.search(str(exc)):
        return None
    fragment = _REGEXP_REFUSED.search(str(exc)).group(1)
    given = [(f, getattr(params, f)) for f in ("namespace", "model_name") if getattr(params, f) is not None]
    named = [(f, v) for f, v in given if fragment and fragment in v] or given
    if not named:
        return None
    field, value = named[0]
    what = {"namespace": "namespace", "model_name": "GPU model"}[field]
    also = f" (or the GPU model filter {named[1][1]!r})" if len(named) > 1 else ""
    return FilterRefused(f"Prometheus refused the {what} filter {value!r}{also} as a regular expression (it reads "
                         f"them as RE2, which has no lookaround, backreferences, \\Z or repeats over 1000): {exc}",
                         field=field)


def _count(run: PruneRun, rows: list[PruneDecision] | None = None) -> None:
    """The run's totals from its decision rows, as the database holds them now (or `rows`)."""
    rows = list(run.decisions.all()) if rows is None else rows
    run.acted = sum(1 for d in rows if d.result == PruneDecision.Result.SUCCEEDED)
    run.failed = sum(1 for d in rows if d.result == PruneDecision.Result.FAILED)
    run.errors = (list(run.errors or []) +
                  [f"{d.owner_kind} {d.namespace}/{d.owner_name}: {d.error}"
                   for d in rows if d.error and d.reason != R_INTERRUPTED])


def _finish(run: PruneRun, started: float, gateway: kube.KubeGateway, calls_before: int) -> None:
    """Record the outcome and release the lease, unless the reconcile took the run over."""
    # Milliseconds are all a run's length says; the panel shows the number as it is kept.
    run.duration_seconds = round(time.perf_counter() - started, 3)
    run.kube_api_calls = gateway.calls_total() - calls_before
    fields = {f: getattr(run, f) for f in ("status", "errors", "duration_seconds", "kube_api_calls", "pods_seen",
                                           "busy_pods", "idle_candidates", "planned", "acted", "failed",
                                           "skip_counts")}
    done = PruneRun.objects.filter(pk=run.pk, status=PruneRun.Status.RUNNING,
                                   lease_owner=run.lease_owner).update(lease_expires_at=None, **fields)
    if done:
        run.lease_expires_at = None
    else:
        _lease_lost(run)


def _lease_lost(run: PruneRun) -> PruneRun:
    log.warning("prune run %s: lease lost to the reconcile; this worker stops acting on it", run.pk)
    run.refresh_from_db()
    return run


def _records(run: PruneRun, decisions, params: PruneParams, view: planning.ClusterView,
             initial: InitialScale) -> list[PruneDecision]:
    """One row per planned scale-down; skipped pods of one reason and owner share a row
    with their count (a beat of dry runs would otherwise repeat every vanished pod)."""
    rows: list[PruneDecision] = []
    shared: dict[tuple, PruneDecision] = {}
    for d in decisions:
        if d.decision == planning.SKIP:
            key = (d.reason, d.owner.key if d.owner else None)
            row = shared.get(key)
            if row is not None:
                row.count += 1
                if len(row.pods) < POD_NAMES_KEPT:
                    row.pods.append(f"{d.namespace}/{d.pod}")
                if d.max_utilization is not None:
                    row.max_utilization = max(row.max_utilization or 0.0, d.max_utilization)
                continue
        row = _record(run, d, params, _planned_effect(d, view, initial))
        if d.decision == planning.SKIP:
            shared[key] = row
        rows.append(row)
    return rows


def _planned_effect(d: planning.Decision, view: planning.ClusterView, initial: InitialScale) -> str:
    """What acting on a planned decision does, as the plan saw its owner ("" for a skip)."""
    if d.decision != planning.PRUNE:
        return ""
    if d.method != planning.M_KNATIVE_MIN_SCALE:
        return _method_effect(d.method)
    obj = view.objects.get(d.owner.key) if d.owner else None
    return planning.knative_min_scale_effect(initial, zero_initial=initial.zero_allowed,
                                             template=obj.template_annotations if obj else None)


def _effect(d: PruneDecision) -> str:
    """What a decision's action does, as its row says it (rows recorded before `effect`
    was kept: its method's description, which is what those runs wrote)."""
    return d.effect or _method_effect(d.method)


def _method_effect(method: str) -> str:
    return planning.EFFECT.get(method, "scaled to zero")


def _record(run: PruneRun, d: planning.Decision, params: PruneParams, effect: str = "") -> PruneDecision:
    prune = d.decision == planning.PRUNE
    return PruneDecision(
        run=run, namespace=d.namespace, pod=d.pod, pods=[f"{d.namespace}/{d.pod}"], count=1, gpus=list(d.gpus),
        max_utilization=d.max_utilization, decision=d.decision, reason=d.reason, method=d.method,
        owner_kind=d.owner.kind if d.owner else "", owner_name=d.owner.name if d.owner else "",
        owner_api_version=d.owner.api_version if d.owner else "", owner_uid=d.owner.uid if d.owner else "",
        result=PruneDecision.Result.DRY_RUN if prune and params.run_mode == PruneRun.Mode.DRY_RUN else "",
        effect=effect)


def _save_outcome(d: PruneDecision, *, run: PruneRun | None = None, **fields) -> bool:
    """Move an `acting` decision to its outcome: one conditional UPDATE, so a worker and
    the reconcile never both decide it. A worker that saw its own write succeed may
    correct a `failed` the reconcile wrote while the write was still on its way. The
    scale-down that took effect is audited in the same transaction, so once."""
    allowed = [PruneDecision.Result.ACTING]
    succeeded = fields.get("result") == PruneDecision.Result.SUCCEEDED
    if succeeded:
        allowed.append(PruneDecision.Result.FAILED)
    with transaction.atomic():
        done = PruneDecision.objects.filter(pk=d.pk, result__in=allowed).update(**fields)
        d.refresh_from_db()
        if done and succeeded:
            _scale_down_audit(d, run or d.run)
    return bool(done)


def _workload(d: PruneDecision) -> str:
    return f"{d.owner_kind} {d.namespace}/{d.owner_name}"


def _scale_down_audit(d: PruneDecision, run: PruneRun) -> None:
    # max_utilization is a fraction (0–1); shown as a percentage.
    util = "" if d.max_utilization is None else f", at most {d.max_utilization * 100:.3g}% used"
    by = actor_label_current() or run.actor
    # A run no one started is the beat's (`PruneRun.actor` empty): with no actor to name,
    # the cause says so.
    audit(app="pruning", action="workload_scale_to_zero", at=d.acted_at or clock.now(), actor_label=by,
          cause=f"idle GPUs ({d.reason or 'idle'}{util}); prune run #{run.pk}{'' if by else ' of the beat schedule'}",
          target=_workload(d),
          cluster_id=run.cluster_id, subject=("prune_decision", d.pk), old=d.restore_state or {},
          new=d.applied_state or {})


def _act(gateway: kube.KubeGateway, run: PruneRun, d: PruneDecision, params: PruneParams,
         now: datetime, initial: InitialScale = INITIAL_SCALE_UNKNOWN) -> None:
    last_conflict: Conflict | None = None
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            owner, before, target = actions.scale_to_zero_intent(
                gateway, kind=d.owner_kind, namespace=d.namespace, name=d.owner_name, method=d.method, now=now,
                uid=d.owner_uid, zero_initial_scale=initial.zero_allowed)
        except actions.NothingToDo as exc:
            d.decision, d.reason, d.error = PruneDecision.Decision.SKIP, "changed-before-action", str(exc)
            d.result, d.restore_state, d.applied_state, d.effect = "", None, None, ""
            d.save(update_fields=["decision", "reason", "error", "result", "restore_state", "applied_state",
                                  "effect"])
            return
        except KubeError as exc:
            d.result, d.error = PruneDecision.Result.FAILED, f"could not re-read it ({describe_failure(exc)})"
            d.save(update_fields=["result", "error"])
            log.warning("prune of %s %s/%s failed: %s", d.owner_kind, d.namespace, d.owner_name, exc)
            return
        # IMPORTANT: the before-state and `acting` are committed before the write. A worker
        # that dies after the write leaves a row the reconcile completes and restore undoes.
        d.result, d.restore_state, d.applied_state, d.error = PruneDecision.Result.ACTING, before, target, ""
        if d.method == planning.M_KNATIVE_MIN_SCALE:
            # Said of the write about to be sent and of the owner as just read, not of the plan's view.
            d.effect = planning.knative_min_scale_effect(
                initial, zero_initial=actions.sets_initial_scale(target),
                template=actions.template_annotations(owner))
        d.save(update_fields=["result", "restore_state", "applied_state", "error", "effect"])
        try:
            # Only onto the owner as just read: a change in between is a 409, read again.
            actions.write(gateway, kind=d.owner_kind, namespace=d.namespace, name=d.owner_name,
                          method=d.method, state=target,
                          resource_version=(owner.get("metadata") or {}).get("resourceVersion") or "")
        except Conflict as exc:
            last_conflict = exc   # changed under us, nothing written: re-read and decide again
            continue
        except KubeError as exc:
            if is_transient(exc):
                # The write may have landed before the answer was lost: the owner says.
                decision_settle(gateway, d, run=run, now=now,
                                cause=f"the write failed ({describe_failure(exc)}) after retries")
            else:
                # IMPORTANT: a failed action is recorded, never announced (gpu-pruner sent its
                # Event before the patch and so announced failures).
                _save_outcome(d, result=PruneDecision.Result.FAILED, restore_state=None,
                              error=f"the write was {describe_failure(exc)}; nothing was changed")
            log.warning("prune of %s %s/%s: %s", d.owner_kind, d.namespace, d.owner_name, d.error or exc)
            return
        # Announced once: unless the reconcile, taking over a slow write, already did.
        if _save_outcome(d, run=run, result=PruneDecision.Result.SUCCEEDED, acted_at=now) and not d.event_sent:
            _announce(gateway, run, d, params, owner, now)
        return
    _save_outcome(d, result=PruneDecision.Result.FAILED, restore_state=None,
                  error=f"refused: the owner kept changing under the write ({CONFLICT_ATTEMPTS} re-reads): "
                        f"{last_conflict}; nothing was changed")


def _announce(gateway: kube.KubeGateway, run: PruneRun, d: PruneDecision, params: PruneParams | None,
              owner: dict, now: datetime, note: str = "") -> None:
    try:
        gateway.create_event(owner, reason="GPUIdleScaledToZero", message=_event_message(d, run, params) + note,
                             component=EVENT_COMPONENT, now=now)
        d.event_sent = True
    except KubeError as exc:
        d.error = f"scaled to zero, but the Event failed: {exc}"
    d.save(update_fields=["event_sent", "error"])


def decision_settle(gateway: kube.KubeGateway, d: PruneDecision, *, run: PruneRun, now: datetime,
                    cause: str) -> bool:
    """Settle an `acting` decision from its owner's real state. False when the owner
    could not be read: the decision stays `acting` (the beat tries again)."""
    try:
        owner, outcome, state = actions.settle(gateway, kind=d.owner_kind, namespace=d.namespace,
                                               name=d.owner_name, method=d.method,
                                               restore_state=d.restore_state, applied_state=d.applied_state,
                                               uid=d.owner_uid)
    except NotFound:
        return _save_outcome(d, result=PruneDecision.Result.FAILED, restore_state=None,
                             error=f"{cause}; the {d.owner_kind} no longer exists: nothing to restore") or True
    except KubeError as exc:
        PruneDecision.objects.filter(pk=d.pk, result=PruneDecision.Result.ACTING).update(
            error=f"{cause}; outcome not yet known, the owner could not be read ({describe_failure(exc)})")
        d.refresh_from_db()
        return False
    if outcome == actions.APPLIED:
        if _save_outcome(d, run=run, result=PruneDecision.Result.SUCCEEDED, acted_at=now, error=""):
            params = PruneParams(**_params_fields(run.parameters)) if run.parameters else None
            _announce(gateway, run, d, params, owner, now, note=f" (confirmed from the cluster: {cause})")
        return True
    if outcome == actions.NOT_APPLIED:
        _save_outcome(d, result=PruneDecision.Result.FAILED, restore_state=None,
                      error=f"{cause}; the owner still holds {actions.state_text(state)}: nothing was changed")
        return True
    _save_outcome(d, result=PruneDecision.Result.FAILED,
                  error=f"{cause}; the owner now holds {actions.state_text(state)}, neither what it had "
                        f"({actions.state_text(d.restore_state)}) nor what the prune set "
                        f"({actions.state_text(d.applied_state)}): left as found")
    return True


def _params_fields(parameters: dict) -> dict:
    names = {f for f in PruneParams.__dataclass_fields__}
    out = {k: v for k, v in parameters.items() if k in names}
    for name in ("protected_namespaces", "owner_kinds"):
        if out.get(name) is not None:
            out[name] = tuple(out[name])
    return out


def _event_message(d: PruneDecision, run: PruneRun, params: PruneParams | None) -> str:
    peak = "no" if d.max_utilization is None else f"{d.max_utilization:.3f}"
    effect = _effect(d)
    if params is None:
        return f"Pod {d.namespace}/{d.pod} looked idle: {effect} ({d.method}) by prune run {run.pk}."
    return (f"GPUs of pod {d.namespace}/{d.pod} stayed under {params.idle_threshold:g} utilization "
            f"(max {peak}) for {params.window_seconds // 60} min: {effect} ({d.method}) by prune run "
            f"{run.pk}. Restore from the capacity admin, or scale it back up.")


@dataclass
class ReconcileReport:
    runs_completed: list[int] = field(default_factory=list)
    runs_failed: list[int] = field(default_factory=list)
    runs_pending: list[int] = field(default_factory=list)   # owners unreadable: tried again next beat
    decisions_settled: int = 0


def prune_runs_reconcile(*, now: datetime, gateway_of: Callable | None = None,
                         give_up_after: timedelta = RECONCILE_GIVE_UP) -> ReconcileReport:
    """Complete every run left `running` by a worker whose lease lapsed, from the cluster's
    real state, and settle `acting` decisions whose run has ended. Idempotent."""
    gateway_of = gateway_of or kube.gateway_for
    report = ReconcileReport()
    stale = PruneRun.objects.filter(status=PruneRun.Status.RUNNING, lease_expires_at__lt=now) | \
        PruneRun.objects.filter(status=PruneRun.Status.RUNNING, lease_expires_at__isnull=True)
    for run in stale.select_related("cluster").order_by("pk"):
        lapsed_at = run.lease_expires_at
        holder = lease_holder("reconcile")
        # Claim it with one conditional UPDATE: two beats never reconcile one run together.
        claimed = PruneRun.objects.filter(pk=run.pk, status=PruneRun.Status.RUNNING, lease_owner=run.lease_owner,
                                          lease_expires_at=lapsed_at).update(
            lease_owner=holder, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS))
        if not claimed:
            continue
        run.refresh_from_db()
        _run_reconcile(run, now=now, lapsed_at=lapsed_at, gateway_of=gateway_of,
                       give_up_after=give_up_after, report=report)
    leftover = (PruneDecision.objects.filter(result=PruneDecision.Result.ACTING)
                .exclude(run__status=PruneRun.Status.RUNNING).select_related("run__cluster"))
    for d in leftover:
        if d.run.cluster is not None and decision_settle(gateway_of(d.run.cluster), d, run=d.run, now=now,
                                                         cause="re-checked after its run ended"):
            report.decisions_settled += 1
    return report


def _run_reconcile(run: PruneRun, *, now: datetime, lapsed_at, gateway_of, give_up_after: timedelta,
                   report: ReconcileReport) -> None:
    when = f"{lapsed_at:%Y-%m-%d %H:%M:%S %Z}" if lapsed_at else "an unknown time"
    cause = f"the run's worker stopped (its lease lapsed at {when})"
    unresolved = 0
    for d in run.decisions.filter(result=PruneDecision.Result.ACTING):
        if run.cluster is None:
            _save_outcome(d, result=PruneDecision.Result.FAILED,
                          error=f"{cause}; outcome unknown: the run names no registered cluster to read")
            continue
        if decision_settle(gateway_of(run.cluster), d, run=run, now=now, cause=cause):
            report.decisions_settled += 1
        else:
            unresolved += 1
    not_reached = run.decisions.filter(decision=PruneDecision.Decision.PRUNE, result="") \
        if run.mode == PruneRun.Mode.SCALE_DOWN else run.decisions.none()
    interrupted = not_reached.update(decision=PruneDecision.Decision.SKIP, reason=R_INTERRUPTED,
                                     error=f"{cause} before acting on it; nothing was changed, the next run "
                                           "decides again")
    if unresolved and now - run.started_at < give_up_after:
        # Leave it to the next beat: the lease stays lapsed so any reconcile may take it.
        PruneRun.objects.filter(pk=run.pk, lease_owner=run.lease_owner).update(lease_expires_at=now)
        report.runs_pending.append(run.pk)
        return
    _count(run)
    decided = run.decisions.exists()
    # A run that saw pods but found none idle had nothing to record; any other run without
    # rows stopped before it recorded its decisions (nothing was changed then).
    nothing_to_record = run.pods_seen > 0 and run.idle_candidates == 0
    note = f"{cause}; reconciled from the cluster at {now:%Y-%m-%d %H:%M:%S %Z}"
    if unresolved:
        note += (f": {unresolved} scale-down(s) could not be confirmed (the cluster could not be read); the beat "
                 "keeps checking them and restore re-checks each owner first")
    elif interrupted:
        note += f": {interrupted} planned scale-down(s) were never started"
    elif not decided and not nothing_to_record:
        note += ": it stopped before recording any decision; nothing was changed"
    run.errors.insert(0, note)
    if unresolved or interrupted or (not decided and not nothing_to_record):
        run.status = PruneRun.Status.FAILED
    else:
        run.status = PruneRun.Status.PARTIAL if run.failed else PruneRun.Status.SUCCEEDED
    PruneRun.objects.filter(pk=run.pk, lease_owner=run.lease_owner).update(
        status=run.status, errors=run.errors, acted=run.acted, failed=run.failed, lease_expires_at=None)
    (report.runs_failed if run.status == PruneRun.Status.FAILED else report.runs_completed).append(run.pk)
    log.warning("prune run %s reconciled: %s", run.pk, note)


def prune_skip_rows_expire(*, now: datetime, retention: timedelta) -> int:
    """Delete skip rows of runs older than `retention` (their counts stay on the run)."""
    deleted, _ = PruneDecision.objects.filter(decision=PruneDecision.Decision.SKIP,
                                              run__started_at__lt=now - retention).delete()
    return deleted


def prune_decision_restore(*, kube_gateway: kube.KubeGateway, decision: PruneDecision, actor: str,
                           now: datetime) -> PruneDecision:
    """Put back exactly what the prune took away. Idempotent: a restored decision is left alone.

    A decision still `acting` (its worker died around the write) is first settled from
    the owner's real state: undone when it took effect, refused when it did not.

    A pynode or model its org's dormancy keeps at zero is not woken (`actions.restore`): a
    pynode's owner values go to the org's record and come back when the org wakes; a
    model is left as it is and the decision stays restorable, saying why."""
    if decision.restore == PruneDecision.Restore.RESTORED:
        return decision
    if decision.result == PruneDecision.Result.ACTING:
        if not decision_settle(kube_gateway, decision, run=decision.run, now=now,
                               cause="settled before a restore"):
            raise KubeError(f"decision {decision.pk}: whether the prune took effect is not known yet "
                            f"({decision.error}); try again", code=0)
    if decision.result != PruneDecision.Result.SUCCEEDED:
        raise ValueError(f"decision {decision.pk} ({decision.namespace}/{decision.pod}) was not acted on "
                         f"(result {decision.result or 'none'!r}): nothing to restore")
    cluster = decision.run.cluster
    try:
        owner, restored, why_not, asleep = actions.restore(
            kube_gateway, kind=decision.owner_kind, namespace=decision.namespace, name=decision.owner_name,
            method=decision.method, restore_state=decision.restore_state, applied_state=decision.applied_state,
            uid=decision.owner_uid,
            kept_asleep=lambda obj: org_selectors.org_keeps_at_zero(cluster=cluster, workload=obj, now=now))
    except KubeError as exc:
        decision.restore, decision.error = PruneDecision.Restore.FAILED, f"restore failed ({describe_failure(exc)})"
        decision.save(update_fields=["restore", "error"])
        return decision
    if asleep and not restored:
        # Its org's dormancy keeps it asleep too: nothing was taken back, nothing is spent;
        # the decision stays restorable once the org is awake.
        decision.error = f"not restored, nothing was written: {why_not}"
        decision.save(update_fields=["error"])
        return decision
    decision.restored_by, decision.restored_at = actor, now
    decision.restore = PruneDecision.Restore.RESTORED if restored else PruneDecision.Restore.CHANGED
    decision.error = "" if restored else f"not restored, nothing was written: {why_not}"
    # A pynode its org keeps asleep keeps its "0": the owner's values went to the org's record.
    record = actions.owner_record(decision.restore_state) if asleep else None
    done = (f"the pruner's min-scale 0 is withdrawn, but {asleep}: the owner's values "
            f"({actions.state_text({'annotations': record})}) are recorded for that wake" if asleep
            else f"restored to {actions.state_text(decision.restore_state)}")
    if restored:
        try:
            kube_gateway.create_event(owner, reason="GPUIdleRestored", component=EVENT_COMPONENT, now=now,
                                      message=f"{done} by {actor or 'the schedule'} (prune run {decision.run_id})")
        except KubeError as exc:
            decision.error = f"restored, but the Event failed: {exc}"
    with transaction.atomic():
        decision.save(update_fields=["restore", "restored_by", "restored_at", "error"])
        if restored:
            cause = f"restore of what prune run #{decision.run_id} scaled to zero"
            audit(app="pruning", action="workload_restore", at=now, actor_label=actor_label_current() or actor,
                  cause=f"{cause}, into the org's record: {asleep}" if asleep else cause, target=_workload(decision),
                  cluster_id=decision.run.cluster_id, subject=("prune_decision", decision.pk),
                  old=decision.applied_state or {},
                  new={**decision.applied_state, "annotations": record} if asleep else decision.restore_state or {})
    return decision
