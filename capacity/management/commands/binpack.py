"""`python manage.py binpack [--cluster NAME] [--dry-run] [--json]`: plan pod-deletion
costs for binpacked scale-down and write the ones that change."""
from __future__ import annotations

import json

from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from config.actors import CliActorMixin


class Command(CliActorMixin, BaseCommand):
    help = ("Write controller.kubernetes.io/pod-deletion-cost on model pods of GPU nodes so that "
            "scale-down frees whole nodes (only pods whose cost changes are written).")

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default=None, metavar="NAME", help="cluster name (default: the default)")
        parser.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
        parser.add_argument("--override-manual", action="store_true",
                            help="also overwrite costs an operator set by hand")
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")

    def handle(self, *args, **opts):
        from capacity.binpack.services import pod_deletion_costs_apply
        from capacity.binpack.models import BinpackRun
        from clusters.selectors import cluster_get

        try:
            cluster = cluster_get(name=opts["cluster"])
        except ObjectDoesNotExist as exc:
            raise CommandError(str(exc)) from None
        try:
            run, plan = pod_deletion_costs_apply(cluster=cluster, actor=None, trigger=BinpackRun.Trigger.COMMAND,
                                                 dry_run=opts["dry_run"],
                                                 override_manual=opts["override_manual"] or None)
        except KubeError as exc:
            raise CommandError(f"cluster {cluster.name}: {exc}") from None
        if opts["json"]:
            out = plan.as_dict()
            out.update({"run": run.pk, "dry_run": run.dry_run, "written": run.written, "stale": run.stale,
                        "errors": run.errors, "plan_seconds": round(run.plan_seconds, 4)})
            self.stdout.write(json.dumps(out, indent=2))
            return
        prefix = "would write " if run.dry_run else ""
        for line in plan.describe()[:-1]:
            self.stdout.write(prefix + line)
        self.stdout.write(plan.describe()[-1])
        if not run.dry_run:
            self.stdout.write(f"written {run.written}, stale {run.stale}, errors {len(run.errors)} (run {run.pk})")
        for error in run.errors:
            self.stderr.write(error)
