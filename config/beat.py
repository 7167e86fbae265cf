"""django-celery-beat's database scheduler, reading time from `config.clock`.

The schedules live in the database (editable in the admin); only the clock differs, so
a test can move beat forward without waiting an hour.

Two things must hold for beat to fire on the injected clock:
- every "now" beat compares against is `clock.now()`: the schedule's `nowfun` (is it
  due? how long until it is? where does it sit in beat's heap?) and the entry's
  `_default_now` (the `last_run_at` it records);
- beat wakes often enough to notice the clock moved: it sleeps until the next entry is
  due *by its own reckoning*, capped by `max_interval`. Celery's setting for that cap is
  `beat_max_loop_interval`; our `CELERY_BEAT_MAX_INTERVAL` is not a Celery setting name
  (Celery ignores it), so it is applied here.
"""
from __future__ import annotations

from django.conf import settings
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not kwargs.get("max_interval"):  # `celery beat --max-interval N` still wins
            self.max_interval = float(getattr(settings, "CELERY_BEAT_MAX_INTERVAL", self.max_interval))
