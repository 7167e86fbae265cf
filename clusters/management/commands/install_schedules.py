from django.core.management.base import BaseCommand

from clusters.services import schedules_install


class Command(BaseCommand):
    help = "Write the schedules of config/schedule.py into django-celery-beat (kept if already there)."

    def handle(self, *args, **options):
        created = schedules_install()
        self.stdout.write(f"created: {', '.join(created) or 'nothing (all present)'}")
