from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ClustersConfig(AppConfig):
    name = "clusters"
    verbose_name = "Clusters"

    def ready(self) -> None:
        # Every migrate brings django-celery-beat in line with config/schedule.py.
        post_migrate.connect(_install_schedules, sender=self, dispatch_uid="clusters.install_schedules")


def _install_schedules(sender, using="default", **kwargs) -> None:
    from clusters.services import schedules_install

    schedules_install(using=using)
