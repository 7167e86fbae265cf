import json

from django.core.management.base import BaseCommand

from config import clock
from orgs.services import dormancy_sweep


class Command(BaseCommand):
    help = "Mark orgs without activity for the dormancy period as dormant (and enable scale to zero)."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="only show which orgs would turn dormant")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args, dry_run=False, **options):
        result = dormancy_sweep(now=clock.now(), dry_run=dry_run)
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
            return
        verb = "would turn" if dry_run else "turned"
        self.stdout.write(f"{len(result.switched)} org(s) {verb} dormant (no activity since "
                          f"{result.cutoff:%Y-%m-%d %H:%M} UTC)")
        for line in result.lines:
            self.stdout.write(f"  {line}")



