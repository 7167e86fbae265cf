"""The Celery app. Tasks are discovered in each app's `tasks.py`."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Task durations for /metrics, and the worker's own metrics port (config/observability.py).
from config.observability import connect_celery_signals  # noqa: E402 - after the app exists

connect_celery_signals()
