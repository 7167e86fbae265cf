from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from clusters.services import cluster_resolve
from config import clock
from config.actors import CliActorMixin
from orgs.services import orgs_sync


class Command(CliActorMixin, BaseCommand):
    help = "Create or update an Org for every namespace labelled capacity.io/org=<slug>."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", help="cluster name (default: the default cluster)")

    def handle(self, *args, cluster=None, **options):
        try:
            target = cluster_resolve(name=cluster)
            result = orgs_sync(cluster=target, now=clock.now())
        except (ObjectDoesNotExist, KubeError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"cluster {target.name}: created {len(result.created)} {result.created}, "
                          f"updated {len(result.updated)} {result.updated}, unchanged {len(result.unchanged)}")
        for error in result.errors:
            self.stderr.write(f"error: {error}")
        if result.errors:
            raise CommandError(f"{len(result.not_synced)} namespace(s) could not be synced "
                               f"({', '.join(result.not_synced)}), see the errors above; the others are synced")
