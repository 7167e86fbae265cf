from django.core.management.base import BaseCommand

from config import clock
from orgs.services import orgs_reconcile


class Command(BaseCommand):
    help = "Check every org's workloads against its scale-to-zero setting and repair drift."

    def handle(self, *args, **options):
        for outcome in orgs_reconcile(now=clock.now()):
            state = "failed" if outcome.errors else ("repaired" if outcome.patched else "holding")
            self.stdout.write(f"{outcome.org}: scale to zero {outcome.setting}, {state}")
            for line in outcome.patched + outcome.errors:
                self.stdout.write(f"  {line}")
