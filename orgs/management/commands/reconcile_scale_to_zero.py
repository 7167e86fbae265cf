from django.core.management.base import BaseCommand, CommandError

from config import clock
from config.actors import CliActorMixin
from orgs.services import orgs_reconcile


class Command(CliActorMixin, BaseCommand):
    help = ("Check every org's workloads against its scale-to-zero setting: first applies, switches not yet "
            "applied and drift are applied now (exit 1, with the reason, when not all was applied or a cluster "
            "could not be read).")

    def handle(self, *args, **options):
        result = orgs_reconcile(now=clock.now())
        outcomes = result.outcomes
        for outcome in outcomes:
            self.stdout.write(outcome.summary())
            for line in outcome.patched + outcome.errors + outcome.notes:
                self.stdout.write(f"  {line}")
            if outcome.drift:
                self.stdout.write(f"  drift: {len(outcome.drift)} workload(s) had left the setting")
        failures = [f"cluster {name} {why}; the scheduled reconcile tries it again"
                    for name, why in result.clusters_failed.items()]
        incomplete = [o for o in outcomes if not o.complete]
        if incomplete:
            failures.append(f"{len(incomplete)} of {len(outcomes)} org(s) not fully applied (the retry task "
                            f"tries again every minute): {incomplete[0].summary()}")
        if failures:
            raise CommandError("; ".join(failures))
