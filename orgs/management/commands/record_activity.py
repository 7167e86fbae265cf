from django.core.management.base import BaseCommand, CommandError

from config import clock
from orgs.models import DormancySwitch, Org
from orgs.services import org_mark_active


class Command(BaseCommand):
    help = "Record activity for an org now (not throttled); a dormant org wakes up."

    def add_arguments(self, parser):
        parser.add_argument("org", help="the org's slug")

    def handle(self, *args, org, **options):
        try:
            woke = org_mark_active(org_slug=org, cause=DormancySwitch.Cause.ACTIVITY, at=clock.now())
        except Org.DoesNotExist as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{org}: activity recorded" + ("; it was dormant and is waking up" if woke else ""))
