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
            "scale-down frees whole nodes (only pods whose cost changes are written; exit 1 when a write "
            "failed, was not tried or its outcome is not known).")

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default=None, metavar="NAME", help="cluster name (default: the default)")
        parser.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
        parser.add_argument("--override-manual", action="store_true",
                            help="also overwrite costs an operator set by hand")
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
        parser.add_argument("--explain", action="append", default=[], metavar="NAMESPACE/POD",
                            help="also say why this pod gets its cost, changed or not (repeatable)")

    def handle(self, *args, **opts):
        from capacity.binpack.planning import COST_ORDER
        from capacity.binpack.services import pod_deletion_costs_apply
        from capacity.binpack.models import WRITE_RESULTS, BinpackRun, settled_describe
        from clusters.services import cluster_resolve

        explain = []
        for value in opts["explain"]:
            namespace, _, name = value.partition("/")
            if not namespace or not name or "/" in name:
                raise CommandError(f"--explain wants NAMESPACE/POD, got {value!r}")
            explain.append((namespace, name))
        try:
            cluster = cluster_resolve(name=opts["cluster"])
        except (ObjectDoesNotExist, KubeError) as exc:
            raise CommandError(str(exc)) from None
        try:
            run, plan = pod_deletion_costs_apply(cluster=cluster, actor=None, trigger=BinpackRun.Trigger.COMMAND,
                                                 dry_run=opts["dry_run"],
                                                 override_manual=opts["override_manual"] or None)
        except KubeError as exc:
            raise CommandError(f"cluster {cluster.name}: {exc}") from None
        settled = [settled_describe(r) for r in getattr(run, "settled", ())]
        if opts["json"]:
            out = plan.as_dict()
            out.update({"run": run.pk, "dry_run": run.dry_run, "written": run.written, "stale": run.stale,
                        "unknown": run.unknown, "errors": run.errors, "plan_seconds": round(run.plan_seconds, 4),
                        "settled": settled,
                        "explained": {f"{ns}/{name}": plan.explain(ns, name) for ns, name in explain},
                        # Asked about, but not in the cluster's reading (their "explained" says so too).
                        "explain_not_found": [f"{ns}/{name}" for ns, name in explain
                                              if not plan.has_pod(ns, name)]})
            for change, result in zip(out["changes"], run.results):
                change["result"] = result
            self.stdout.write(json.dumps(out, indent=2, ensure_ascii=False))
            self._fail_unless_written(cluster, run)
            return
        for line in settled:
            self.stdout.write(line)
        lines = plan.describe()
        if run.dry_run:
            for line in lines[:-1]:
                self.stdout.write("would write " + line)
        else:   # each change as it went: a planned cost is not a written one
            for line, result in zip(lines[:-1], run.results):
                self.stdout.write(("wrote " if result == "written" else f"{WRITE_RESULTS[result]}: ") + line)
        self.stdout.write(lines[-1])
        for namespace, name in explain:
            self.stdout.write(f"why {namespace}/{name}: {plan.explain(namespace, name)}")
        if len(lines) > 1 or explain:
            self.stdout.write(COST_ORDER)
        if not run.dry_run:
            untried, lost = run.results.count("untried"), run.results.count("lease-lost")
            unknown = run.results.count("unknown")
            self.stdout.write(f"written {run.written}, stale {run.stale}, errors {run.results.count('error')}"
                              + (f", outcome unknown {unknown} (settled by the next run)" if unknown else "")
                              + (f", not tried {untried}" if untried else "")
                              + (f", not tried (lease lapsed) {lost}" if lost else "") + f" (run {run.pk})")
        for error in run.errors:
            self.stderr.write(error)
        self._fail_unless_written(cluster, run)

    @staticmethod
    def _fail_unless_written(cluster, run) -> None:
        """Exit 1 when a planned cost was not written for a failure, or is not known to be
        written (its write's answer was lost). A pod changed since the plan is left to whoever
        changed it: no failure."""
        failed = sum(run.results.count(outcome) for outcome in ("error", "untried", "lease-lost"))
        unknown = run.results.count("unknown")
        if failed or unknown:
            said = [f"{failed} of {run.planned} cost(s) not written"] if failed else []
            if unknown:
                said.append(f"{unknown} of {run.planned} cost(s) of unknown outcome (the write's answer was lost; "
                            "the next run on the cluster settles it from the pod)")
            raise CommandError(f"{' and '.join(said)} on cluster {cluster.name} (run {run.pk}): {run.errors[0]}")
