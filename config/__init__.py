"""Project configuration: settings, URLs, the Celery app and the one beat schedule."""
from config.celery import app as celery_app

__all__ = ["celery_app"]
