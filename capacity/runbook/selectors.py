"""Reads for the runbook that are not the cluster's: the schedules as installed."""
from __future__ import annotations

from django_celery_beat.models import IntervalSchedule, PeriodicTask

from capacity.runbook.planning import Schedule
from config.schedule import SCHEDULES

SCALE_TO_ZERO_RECONCILE_TASK = "orgs.tasks.scale_to_zero_reconcile"

_SECONDS = {IntervalSchedule.DAYS: 86400, IntervalSchedule.HOURS: 3600, IntervalSchedule.MINUTES: 60,
            IntervalSchedule.SECONDS: 1}


def schedule_installed(*, task: str) -> Schedule:
    """The periodic schedule of `task` as django-celery-beat holds it (operators retune or
    disable it in the admin, so config/schedule.py's interval may not be the one in force).
    Not installed, disabled, or not an interval: no interval (`every_seconds` None)."""
    name = next(p.name for p in SCHEDULES if p.task == task)
    row = PeriodicTask.objects.filter(name=name).select_related("interval").first()
    if row is None or not row.enabled or row.interval is None or row.interval.period not in _SECONDS:
        return Schedule(name=name, every_seconds=None)
    return Schedule(name=name, every_seconds=row.interval.every * _SECONDS[row.interval.period])


def scale_to_zero_reconcile_schedule() -> Schedule:
    """The orgs' scale-to-zero reconcile: what returns a woken workload of a dormant org to zero."""
    return schedule_installed(task=SCALE_TO_ZERO_RECONCILE_TASK)
