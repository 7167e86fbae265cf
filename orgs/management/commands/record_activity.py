from django.core.management.base import BaseCommand, CommandError

from config import clock
from config.actors import CliActorMixin
from orgs.models import DormancySwitch, Org
from orgs.services import org_mark_active, org_scale_to_zero_apply


class Command(CliActorMixin, BaseCommand):
    help = ("Record activity for an org now (not throttled); a dormant org wakes up and its scale to zero is "
            "disabled here and now (exit 1, with the reason, when not all of it was applied).")

    def add_arguments(self, parser):
        parser.add_argument("org", help="the org's slug")
        parser.add_argument("--queue", action="store_true",
                            help="leave the wake's cluster work to the workers (as the activity API does)")

    def handle(self, *args, org, queue=False, **options):
        now = clock.now()
        try:
            result = org_mark_active(org_slug=org, cause=DormancySwitch.Cause.ACTIVITY, at=now, enqueue=queue)
        except Org.DoesNotExist as exc:
            raise CommandError(str(exc)) from None
        if not result.woke or queue:
            if result.queued is False:
                raise CommandError(result.describe())
            self.stdout.write(result.describe())
            return
        target = Org.objects.get(slug=org)
        switch = target.switches.filter(direction=DormancySwitch.Direction.TO_ACTIVE).first()
        outcome = org_scale_to_zero_apply(org_id=target.id, switch_id=switch and switch.id, now=now)
        if not outcome.complete:
            raise CommandError(f"{org}: activity recorded and the org is marked active, but {outcome.summary()}; "
                               "the retry task tries again every minute")
        applied = outcome.summary().removeprefix(f"{org}: ")   # the line names the org once
        self.stdout.write(f"{org}: activity recorded; it was dormant and is awake: {applied}")
