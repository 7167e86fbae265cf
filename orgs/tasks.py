"""Celery tasks: load rows by id, call one service; retries live here."""
from __future__ import annotations

from celery import shared_task

from clusters.errors import KubeError
from config import clock
from orgs import services

# Redis serves priority 0 first (see CELERY_BROKER_TRANSPORT_OPTIONS): waking an org
# must not wait behind a sweep's worth of scale-to-zero enables.
HIGH_PRIORITY = 0
NORMAL_PRIORITY = 6


class ApplyIncomplete(Exception):
    """Some workloads kept the old setting; the task retries, the reconcile repairs."""


@shared_task(bind=True, autoretry_for=(ApplyIncomplete, KubeError), retry_backoff=5, retry_backoff_max=300,
             retry_jitter=True, max_retries=6, acks_late=True)
def org_scale_to_zero_apply(self, org_id: int, switch_id: int | None = None) -> dict:
    outcome = services.org_scale_to_zero_apply(org_id=org_id, now=clock.now(), switch_id=switch_id)
    if outcome.errors:
        raise ApplyIncomplete("; ".join(outcome.errors))
    return {"org": outcome.org, "setting": outcome.setting, "patched": outcome.patched}


@shared_task
def dormancy_sweep() -> dict:
    return services.dormancy_sweep(now=clock.now()).as_dict()


@shared_task
def scale_to_zero_reconcile() -> dict:
    outcomes = services.orgs_reconcile(now=clock.now())
    return {"orgs": len(outcomes), "drifted": [o.org for o in outcomes if o.drift],
            "failed": [o.org for o in outcomes if o.errors]}
