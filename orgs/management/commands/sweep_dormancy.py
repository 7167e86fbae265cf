import json

from django.core.management.base import BaseCommand, CommandError

from config import clock
from config.actors import CliActorMixin
from orgs.services import dormancy_sweep, org_scale_to_zero_apply


class Command(CliActorMixin, BaseCommand):
    help = ("Mark orgs without activity for the dormancy period as dormant and enable scale to zero on "
            "their workloads now (exit 1, with the reason, when not all of it was applied).")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="only show which orgs would turn dormant")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument("--queue", action="store_true",
                            help="leave the cluster work to the workers instead of applying it here")

    def handle(self, *args, dry_run=False, queue=False, **options):
        now = clock.now()
        result = dormancy_sweep(now=now, dry_run=dry_run, enqueue=queue)
        outcomes = [] if dry_run or queue else [
            org_scale_to_zero_apply(org_id=org_id, switch_id=switch_id, now=now) for org_id, switch_id in result.switches]
        incomplete = [o for o in outcomes if not o.complete]
        if options["json"]:
            body = result.as_dict()
            if outcomes:
                body["applied"] = [o.summary() for o in outcomes]
            self.stdout.write(json.dumps(body, indent=2))
        else:
            verb = "would turn" if dry_run else "turned"
            self.stdout.write(f"{len(result.switched)} org(s) {verb} dormant (no activity since "
                              f"{result.cutoff:%Y-%m-%d %H:%M} UTC)")
            for line in result.lines:
                self.stdout.write(f"  {line}")
            if result.queued:
                self.stdout.write("  scale to zero queued for the workers")
            for outcome in outcomes:
                self.stdout.write(f"  {outcome.summary()}")
                for note in outcome.notes:
                    self.stdout.write(f"    {note}")
        if result.queued is False:
            raise CommandError(result.queue_failure())
        if incomplete:
            raise CommandError(f"{len(incomplete)} of {len(outcomes)} dormant org(s) not fully scaled to zero "
                               f"(the retry task tries again every minute): {incomplete[0].summary()}")
