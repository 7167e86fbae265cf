"""The beat schedules as `migrate` installs them: an upgrade moves a schedule still at an
interval an earlier release installed, and leaves one an operator tuned."""
from __future__ import annotations

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from clusters.services import schedules_install
from config.schedule import SCHEDULES

pytestmark = pytest.mark.django_db


def _row(task: str) -> PeriodicTask:
    return PeriodicTask.objects.select_related("interval").get(task=task)


def _set_every(task: str, seconds: int) -> None:
    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.filter(task=task).update(interval=interval)


def test_an_upgrade_moves_untuned_lease_beats_to_the_new_interval_and_keeps_tuned_ones():
    schedules_install()
    resume, reconcile = "capacity.tasks.defrag_jobs_resume", "pruning.tasks.prune_runs_reconcile"
    assert _row(resume).interval.every == 10 and _row(reconcile).interval.every == 10
    _set_every(resume, 60)          # as an earlier release installed it
    _set_every(reconcile, 45)       # as an operator tuned it
    PeriodicTask.objects.filter(task=resume).update(enabled=False)

    assert schedules_install() == []
    assert _row(resume).interval.every == 10
    assert "10 s of its 30 s lease" in _row(resume).description
    assert not _row(resume).enabled, "the operator's enabled flag is kept"
    assert _row(reconcile).interval.every == 45


def test_every_lease_beat_runs_well_inside_a_minute():
    from capacity.defrag.services import LEASE_SECONDS as DEFRAG_LEASE
    from pruning.services import LEASE_SECONDS as PRUNE_LEASE

    every = {p.task: p.every_seconds for p in SCHEDULES}
    # A killed worker's job or run is picked up within lease + beat: under a minute.
    assert DEFRAG_LEASE + every["capacity.tasks.defrag_jobs_resume"] <= 45
    assert PRUNE_LEASE + every["pruning.tasks.prune_runs_reconcile"] <= 45
