"""The Celery app. Tasks are discovered in each app's `tasks.py`."""
import os

from celery import Celery

from config.observability import connect_celery_signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Task durations for /metrics, and the worker's own metrics port (config/observability.py).
connect_celery_signals()


def task_send(name: str, *, args: tuple | list = (), kwargs: dict | None = None, **options):
    """Queue the task registered as `name` exactly as its `.apply_async(args, kwargs,
    **options)` would (its own options and priority lane; run in place when tasks are
    eager), for a caller that must not import the task's module: a service, whose tasks
    import it."""
    task = app.tasks.get(name)
    if task is None:  # this process (the web server, a command) has not imported the task modules yet
        app.loader.import_default_modules()
        task = app.tasks[name]  # still missing: NotRegistered names it
    return task.apply_async(args=args, kwargs=kwargs, **options)
