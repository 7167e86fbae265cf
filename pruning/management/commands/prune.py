"""`python manage.py prune`: gpu-pruner's command line on the control plane.

Dry run unless `-r scale-down`. `--json` prints one JSON object per decision.
"""
from __future__ import annotations

import json
import time
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError, PrometheusError
from pruning.query import FilterError


class Command(BaseCommand):
    help = "Find pods whose GPUs stayed idle and scale their owners to zero (dry run by default)."

    def add_arguments(self, parser):
        parser.add_argument("-t", "--duration", type=int, default=None, metavar="MIN",
                            help="minutes of no GPU activity before pruning (default 30)")
        parser.add_argument("-d", "--daemon-mode", action="store_true", help="run every --check-interval seconds")
        parser.add_argument("-c", "--check-interval", type=float, default=180.0, metavar="S",
                            help="seconds between runs in daemon mode (default 180)")
        parser.add_argument("-n", "--namespace", default=None, metavar="REGEX",
                            help="namespace filter, a regular expression (fully anchored, as in PromQL)")
        parser.add_argument("-m", "--model-name", default=None, metavar="REGEX",
                            help='GPU model filter, a regular expression, e.g. "NVIDIA A10G"')
        parser.add_argument("-r", "--run-mode", choices=["dry-run", "scale-down"], default="dry-run")
        parser.add_argument("--prometheus-url", default=None, metavar="URL")
        parser.add_argument("--prometheus-token", default=None, metavar="TOKEN",
                            help="bearer token (default: the cluster's token variable, then the "
                                 "service-account token file)")
        parser.add_argument("--insecure-skip-tls-verify", action="store_true",
                            help="do not verify Prometheus' TLS certificate")
        parser.add_argument("--idle-threshold", type=float, default=None, metavar="F",
                            help="utilization fraction under which a GPU counts as idle (default 0.01)")
        parser.add_argument("--grace-period", type=int, default=None, metavar="S",
                            help="seconds added to the window before a pod may be pruned (default 300)")
        parser.add_argument("--label-scheme", choices=["auto", "pod", "exported"], default=None,
                            help="pod/namespace or exported_pod/exported_namespace labels (default: both)")
        parser.add_argument("--max-scale-downs", type=int, default=None, metavar="N",
                            help="cap on owners scaled to zero per run (default 20)")
        parser.add_argument("--cluster", default=None, metavar="NAME", help="cluster name (default: the default)")
        parser.add_argument("--at", default=None, metavar="TIME",
                            help="evaluate as of this ISO 8601 time instead of now")
        parser.add_argument("--runs", type=int, default=0, metavar="N",
                            help="in daemon mode, stop after N runs (default: never)")
        parser.add_argument("--json", action="store_true", help="one JSON object per decision")

    def handle(self, *args, **opts):
        from clusters.kube import gateway_for
        from clusters.selectors import cluster_get
        from clusters.models import Cluster
        from config import clock
        from pruning.services import PruneParams, prometheus_for, prune_run_execute

        try:
            cluster = cluster_get(name=opts["cluster"])
        except Cluster.DoesNotExist as exc:
            raise CommandError(str(exc)) from None
        if opts["check_interval"] < 0:
            raise CommandError("--check-interval must be >= 0 seconds")
        try:
            params = PruneParams.from_settings(
                window_seconds=opts["duration"] * 60 if opts["duration"] else None, namespace=opts["namespace"], model_name=opts["model_name"],
                run_mode=opts["run_mode"], idle_threshold=opts["idle_threshold"],
                grace_seconds=opts["grace_period"], label_scheme=opts["label_scheme"],
                max_scale_downs=opts["max_scale_downs"])
            params.query()  # validates the filters before anything runs
            prometheus = prometheus_for(cluster=cluster, url=opts["prometheus_url"], token=opts["prometheus_token"],
                                        verify_tls=False if opts["insecure_skip_tls_verify"] else None)
            at = datetime.fromisoformat(opts["at"].replace("Z", "+00:00")) if opts["at"] else None
        except (ValueError, FilterError, PrometheusError) as exc:
            raise CommandError(str(exc)) from None
        if at is not None and at.tzinfo is None:
            raise CommandError("--at needs a time zone, e.g. 2026-01-01T12:00:00Z")
        runs = 0
        while True:
            try:
                run = prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=prometheus, params=params,
                                        now=at or clock.now(), cluster=cluster, actor="cli")
            except (PrometheusError, KubeError) as exc:
                if not opts["daemon_mode"]:
                    raise CommandError(str(exc)) from None
                self.stderr.write(f"prune run failed: {exc}")
            else:
                self._report(run, opts["json"])
            runs += 1
            if not opts["daemon_mode"] or (opts["runs"] and runs >= opts["runs"]):
                return
            time.sleep(opts["check_interval"])

    def _report(self, run, as_json: bool) -> None:
        for d in run.decisions.all():
            if as_json:
                self.stdout.write(json.dumps({
                    "run": run.pk, "mode": run.mode, "namespace": d.namespace, "pod": d.pod,
                    "owner": {"apiVersion": d.owner_api_version, "kind": d.owner_kind, "name": d.owner_name}
                    if d.owner_kind else None,
                    "gpus": d.gpus, "max_utilization": d.max_utilization, "decision": d.decision,
                    "reason": d.reason, "method": d.method, "result": d.result, "error": d.error,
                    "event_sent": d.event_sent, "restore_state": d.restore_state}))
            else:
                owner = f"{d.owner_kind}/{d.owner_name}" if d.owner_kind else "-"
                verb = {"dry-run": "would scale to zero", "succeeded": "scaled to zero",
                        "failed": f"FAILED: {d.error}"}.get(d.result, "skip")
                self.stdout.write(f"{d.namespace}/{d.pod} -> {owner}: {verb} ({d.reason})")
        if not as_json:
            self.stdout.write(f"run {run.pk} ({run.mode}): {run.pods_seen} pods with GPU data, {run.busy_pods} busy, "
                              f"{run.idle_candidates} looked idle, {run.planned} planned, {run.acted} acted, "
                              f"{run.failed} failed, {run.kube_api_calls} API calls, {run.duration_seconds:.2f}s")
