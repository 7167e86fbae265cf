"""Celery tasks: load rows by id, call one service; retries live here."""
from __future__ import annotations

import logging

from celery import shared_task

from clusters.fanout import cluster_for_task, clusters_fan_out
from clusters.selectors import clusters_with_orgs
from config import clock
from config.retries import RetryTransient
from orgs import services
from orgs.models import Org
from orgs.services import HIGH_PRIORITY, NORMAL_PRIORITY  # noqa: F401 - the apply's priority lanes, re-exported

log = logging.getLogger(__name__)


class ApplyIncomplete(Exception):
    """Some workloads kept the old setting (recorded on the org, its switch and the audit).

    `transient`: a failure a later try may cure (no answer, 5xx, 429) kept them, and the
    task retries; refusals alone fail the task with their reason, and the reconcile and
    the retry beat try again later (an operator may have fixed the permission by then)."""

    def __init__(self, message: str, transient: bool = False):   # unpickles from its message
        super().__init__(message)
        self.transient = transient


@shared_task(base=RetryTransient, retry_backoff=5, retry_backoff_max=300, max_retries=6, acks_late=True)
def org_scale_to_zero_apply(org_id: int, switch_id: int | None = None, cause: str = "") -> dict:
    """`cause`: why it is applied now, when no switch says it (a redeploy that woke a model).
    An org retired (or deleted) after the task was queued is left alone: no act reaches it."""
    try:
        outcome = services.org_scale_to_zero_apply(org_id=org_id, now=clock.now(), switch_id=switch_id, cause=cause)
    except Org.DoesNotExist:
        log.warning("scale-to-zero apply: org %s is no longer in service, nothing applied", org_id)
        return {"org": org_id, "skipped": "no longer in service"}
    if not outcome.complete:
        raise ApplyIncomplete(outcome.summary(), transient=outcome.transient)
    return {"org": outcome.org, "setting": outcome.setting, "patched": outcome.patched}


@shared_task
def dormancy_sweep() -> dict:
    return services.dormancy_sweep(now=clock.now()).as_dict()


@shared_task
def scale_to_zero_reconcile() -> int:
    """Every 10 minutes: one reconcile task per cluster an org runs on (queue `sweep`), so
    one slow cluster's read never delays another's repair. The number of clusters queued."""
    return clusters_fan_out(scale_to_zero_reconcile_cluster,
                            sorted(clusters_with_orgs().values_list("pk", flat=True)))


@shared_task
def scale_to_zero_reconcile_cluster(cluster_id: int) -> dict | None:
    cluster = _cluster(cluster_id)
    if cluster is None:
        return None
    result = services.orgs_reconcile(now=clock.now(), cluster=cluster)
    return {**_summary(result.outcomes), "clusters_failed": result.clusters_failed}


@shared_task
def scale_to_zero_retry() -> int:
    """Every minute: one retry task per cluster holding an org whose wanted setting is not
    the applied one (one query when none is). The number of clusters queued."""
    return clusters_fan_out(scale_to_zero_retry_cluster, services.clusters_with_unapplied_orgs(now=clock.now()))


@shared_task
def scale_to_zero_retry_cluster(cluster_id: int) -> dict | None:
    """Apply again each of the cluster's orgs whose wanted setting is not the applied one.
    Once the cluster gives no answer the rest of its orgs are skipped (listed under
    "skipped") until the next pass: an unreachable cluster costs one org's retries."""
    cluster = _cluster(cluster_id)
    if cluster is None:
        return None
    return _summary(services.orgs_apply_unapplied(now=clock.now(), cluster=cluster))


def _cluster(cluster_id: int):
    return cluster_for_task(cluster_id, job="scale to zero")


def _summary(outcomes: list[services.ApplyOutcome]) -> dict:
    tried = [o for o in outcomes if o.kind != services.SKIPPED]
    return {"orgs": len(tried),
            "first_applied": [o.org for o in tried if o.kind == "first apply" and o.complete],
            "drifted": [o.org for o in tried if o.drift],
            "incomplete": [o.summary() for o in tried if not o.complete],
            "skipped": [o.summary() for o in outcomes if o.kind == services.SKIPPED]}
