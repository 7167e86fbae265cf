"""Prune runs and restores: query, plan, act, record.

One run = one PromQL query + a fixed handful of Kubernetes LISTs (`selectors.cluster_view`)
+ for each owner acted on: one GET (re-read), one write, one Event.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime

from django.conf import settings as dj_settings
from django.db import transaction

from clusters import kube
from clusters.errors import KubeError, PrometheusError
from clusters.prometheus import PrometheusGateway

from . import actions, planning, selectors
from .models import PruneDecision, PruneRun
from .query import IdleQuery, parse_result

log = logging.getLogger(__name__)
EVENT_COMPONENT = "gpu-capacity-pruner"


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

    def __post_init__(self):
        if self.run_mode not in PruneRun.Mode.values:
            raise ValueError(f"run mode must be one of {', '.join(PruneRun.Mode.values)}, got {self.run_mode!r}")
        if not isinstance(self.window_seconds, int) or self.window_seconds < self.step_seconds:
            raise ValueError(f"the idle window must be whole seconds >= {self.step_seconds}, "
                             f"got {self.window_seconds!r}")
        if not 0 < self.idle_threshold <= 1:
            raise ValueError(f"idle threshold is a fraction in (0, 1], got {self.idle_threshold!r}")
        if self.grace_seconds < 0:
            raise ValueError(f"grace period must be >= 0 seconds, got {self.grace_seconds!r}")
        if self.max_scale_downs < 0:
            raise ValueError(f"cap on scale-downs must be >= 0, got {self.max_scale_downs!r}")
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
        )
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def query(self) -> IdleQuery:
        return IdleQuery(window_seconds=self.window_seconds, namespace=self.namespace,
                         model_name=self.model_name, label_scheme=self.label_scheme,
                         step_seconds=self.step_seconds, max_gap_seconds=self.max_gap_seconds)


def _event_message(d: PruneDecision, run: PruneRun, params: PruneParams) -> str:
    peak = "no" if d.max_utilization is None else f"{d.max_utilization:.3f}"
    return (f"GPUs of pod {d.namespace}/{d.pod} stayed under {params.idle_threshold:g} utilization "
            f"(max {peak}) for {params.window_seconds // 60} min: scaled to zero ({d.method}) by prune run "
            f"{run.pk}. Restore from the capacity admin, or scale it back up.")


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
                   verify_tls: bool | None = None) -> PrometheusGateway:
    """The Prometheus gateway of a run: explicit flags win over the cluster row and settings."""
    url = url or (cluster.prometheus_url if cluster else "") or dj_settings.PROMETHEUS_URL
    if not url:
        raise PrometheusError("no Prometheus URL: pass --prometheus-url, set it on the cluster, "
                              "or set PROMETHEUS_URL")
    env_name = (cluster.prometheus_token_env if cluster else "") or dj_settings.PROMETHEUS_TOKEN_ENV
    verify = verify_tls if verify_tls is not None else (cluster.prometheus_verify_tls if cluster else True)
    return PrometheusGateway(url, token=prometheus_token(explicit=token, env_name=env_name),
                             ca_bundle=(cluster.prometheus_ca_bundle if cluster else "") or None,
                             verify_tls=verify)


def prune_run_execute(*, kube_gateway: kube.KubeGateway, prometheus: PrometheusGateway,
                      params: PruneParams, now: datetime, cluster=None, actor: str = "") -> PruneRun:
    """One pass: query, plan, record and — in scale-down mode — act. Returns the run."""
    started = time.perf_counter()
    calls_before = kube_gateway.calls_total()
    query = params.query()
    promql = query.promql()
    run = PruneRun.objects.create(cluster=cluster, actor=actor, mode=params.run_mode, evaluated_at=now,
                                  parameters=asdict(params), query=promql)
    try:
        series = parse_result(prometheus.query(promql, at=now), label_scheme=query.label_scheme)
        idle_pods = _pods_under_threshold(series, params.idle_threshold)
        view = selectors.cluster_view(kube_gateway, pods_of_interest=idle_pods)
        plan = planning.plan_prune(series=series, view=view, now=now, settings=planning.PruneSettings(
            window_seconds=params.window_seconds, grace_seconds=params.grace_seconds,
            idle_threshold=params.idle_threshold,
            protected_namespaces=frozenset(params.protected_namespaces),
            org_blocked_namespaces=selectors.org_blocked_namespaces(
                cluster=cluster, namespaces={ns for ns, _ in idle_pods}),
            max_scale_downs=params.max_scale_downs))
    except (PrometheusError, KubeError) as exc:
        run.status, run.errors = PruneRun.Status.FAILED, [str(exc)]
        _finish(run, started, kube_gateway, calls_before)
        raise
    with transaction.atomic():  # one commit for all rows, not one per insert batch
        decisions = PruneDecision.objects.bulk_create([_record(run, d, params) for d in plan.decisions],
                                                      batch_size=500)
    run.pods_seen, run.busy_pods = plan.pods_seen, plan.busy
    run.idle_candidates, run.planned = len(plan.decisions), len(plan.to_prune)
    if params.run_mode == PruneRun.Mode.SCALE_DOWN:
        for record in decisions:
            if record.decision == PruneDecision.Decision.PRUNE:
                _act(kube_gateway, run, record, params, now)
    run.acted = sum(1 for d in decisions if d.result == PruneDecision.Result.SUCCEEDED)
    run.failed = sum(1 for d in decisions if d.result == PruneDecision.Result.FAILED)
    run.errors = [f"{d.owner_kind} {d.namespace}/{d.owner_name}: {d.error}" for d in decisions if d.error]
    run.status = PruneRun.Status.PARTIAL if run.failed else PruneRun.Status.SUCCEEDED
    _finish(run, started, kube_gateway, calls_before)
    return run


def _pods_under_threshold(series, threshold: float) -> set[tuple[str, str]]:
    busy = {(g.namespace, g.pod) for g in series
            if g.max_utilization is not None and g.max_utilization >= threshold}
    return {(g.namespace, g.pod) for g in series} - busy


def _finish(run: PruneRun, started: float, gateway: kube.KubeGateway, calls_before: int) -> None:
    run.duration_seconds = time.perf_counter() - started
    run.kube_api_calls = gateway.calls_total() - calls_before
    run.save()


def _record(run: PruneRun, d: planning.Decision, params: PruneParams) -> PruneDecision:
    prune = d.decision == planning.PRUNE
    return PruneDecision(
        run=run, namespace=d.namespace, pod=d.pod, gpus=list(d.gpus), max_utilization=d.max_utilization,
        decision=d.decision, reason=d.reason, method=d.method,
        owner_kind=d.owner.kind if d.owner else "", owner_name=d.owner.name if d.owner else "",
        owner_api_version=d.owner.api_version if d.owner else "", owner_uid=d.owner.uid if d.owner else "",
        result=PruneDecision.Result.DRY_RUN if prune and params.run_mode == PruneRun.Mode.DRY_RUN else "")


def _act(gateway: kube.KubeGateway, run: PruneRun, d: PruneDecision, params: PruneParams,
         now: datetime) -> None:
    try:
        owner, before, after = actions.scale_to_zero(gateway, kind=d.owner_kind, namespace=d.namespace,
                                                      name=d.owner_name, method=d.method, now=now)
    except actions.NothingToDo as exc:
        d.decision, d.reason, d.error = PruneDecision.Decision.SKIP, "changed-before-action", str(exc)
        d.save()
        return
    except KubeError as exc:
        # IMPORTANT: a failed action is recorded, never announced (gpu-pruner sent its
        # Event before the patch and so announced failures).
        d.result, d.error = PruneDecision.Result.FAILED, str(exc)
        d.save()
        log.warning("prune of %s %s/%s failed: %s", d.owner_kind, d.namespace, d.owner_name, exc)
        return
    d.result, d.restore_state, d.applied_state, d.acted_at = PruneDecision.Result.SUCCEEDED, before, after, now
    try:
        gateway.create_event(owner, reason="GPUIdleScaledToZero", message=_event_message(d, run, params),
                             component=EVENT_COMPONENT, now=now)
        d.event_sent = True
    except KubeError as exc:
        d.error = f"scaled to zero, but the Event failed: {exc}"
    d.save()


def prune_decision_restore(*, kube_gateway: kube.KubeGateway, decision: PruneDecision, actor: str,
                           now: datetime) -> PruneDecision:
    """Put back exactly what the prune took away. Idempotent: a restored decision is left alone."""
    if decision.restore == PruneDecision.Restore.RESTORED:
        return decision
    if decision.result != PruneDecision.Result.SUCCEEDED:
        raise ValueError(f"decision {decision.pk} ({decision.namespace}/{decision.pod}) was not acted on "
                         f"(result {decision.result or 'none'!r}): nothing to restore")
    try:
        owner, restored = actions.restore(
            kube_gateway, kind=decision.owner_kind, namespace=decision.namespace, name=decision.owner_name,
            method=decision.method, restore_state=decision.restore_state, applied_state=decision.applied_state)
    except KubeError as exc:
        decision.restore, decision.error = PruneDecision.Restore.FAILED, f"restore failed: {exc}"
        decision.save(update_fields=["restore", "error"])
        return decision
    decision.restored_by, decision.restored_at = actor, now
    decision.restore = PruneDecision.Restore.RESTORED if restored else PruneDecision.Restore.CHANGED
    if restored:
        try:
            kube_gateway.create_event(owner, reason="GPUIdleRestored", component=EVENT_COMPONENT, now=now,
                                      message=f"restored to {decision.restore_state} by {actor or 'the schedule'} "
                                              f"(prune run {decision.run_id})")
        except KubeError as exc:
            decision.error = f"restored, but the Event failed: {exc}"
    decision.save(update_fields=["restore", "restored_by", "restored_at", "error"])
    return decision
