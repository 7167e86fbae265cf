"""django-celery-beat's database scheduler, reading time from `config.clock`.

The schedules live in the database (editable in the admin); only the clock differs, so
a test can move beat forward without waiting an hour.
"""
from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry

from config import clock


class ClockedModelEntry(ModelEntry):
    def __init__(self, model, app=None):
        super().__init__(model, app=app)
        schedule = getattr(self, "schedule", None)
        if schedule is not None and hasattr(schedule, "nowfun"):
            schedule.nowfun = lambda: clock.now().astimezone(self.app.timezone)

    def _default_now(self):
        return clock.now().astimezone(self.app.timezone)


class ClockedDatabaseScheduler(DatabaseScheduler):
    Entry = ClockedModelEntry
