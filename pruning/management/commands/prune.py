"""`python manage.py prune`: gpu-pruner's command line on the control plane.

Dry run unless `-r scale-down`. `--json` prints one JSON object per decision.
"""
from __future__ import annotations

import json
import math
import time
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError, PrometheusError
from config.actors import CliActorMixin, actor_label_current
from pruning.planning import EFFECT
from pruning.query import FilterError


# Each run parameter's flag, to name it in an error.
FLAGS = {"window_seconds": "--duration", "idle_threshold": "--idle-threshold", "grace_seconds": "--grace-period",
         "max_scale_downs": "--max-scale-downs", "namespace": "--namespace", "model_name": "--model-name",
         "run_mode": "--run-mode", "label_scheme": "--label-scheme", "power_threshold_watts": "--power-threshold",
         "owner_kinds": "--owner-kinds"}
MAX_CHECK_INTERVAL = 86_400.0   # seconds: one run a day is the slowest daemon that makes sense
MAX_RUNS = 1_000_000


def _minutes_to_seconds(minutes: int | None) -> int | None:
    if minutes is None:
        return None
    if not 1 <= minutes <= MAX_WINDOW_MINUTES:
        raise CommandError(f"--duration: minutes of idleness must be between 1 and {MAX_WINDOW_MINUTES}, "
                           f"got {minutes}")
    return minutes * 60


MAX_WINDOW_MINUTES = 7 * 24 * 60


def _check_flags(opts: dict) -> None:
    """Values argparse lets through but no run can use: refused before anything starts."""
    interval = opts["check_interval"]
    if not math.isfinite(interval) or not 0 <= interval <= MAX_CHECK_INTERVAL:
        raise CommandError(f"--check-interval: seconds between runs must be between 0 and "
                           f"{MAX_CHECK_INTERVAL:g}, got {interval}")
    if not 0 <= opts["runs"] <= MAX_RUNS:
        raise CommandError(f"--runs: must be between 0 (no limit) and {MAX_RUNS}, got {opts['runs']}")
    for flag in ("cluster", "namespace", "model_name", "prometheus_url", "prometheus_token", "prometheus_ca_file",
                 "owner_kinds", "at"):
        value = opts[flag]
        name = "--" + flag.replace("_", "-")
        if value is not None and not value.strip():
            raise CommandError(f"{name}: is empty; leave the flag out to use the default")
        if value is not None and not _utf8(value):
            # Python keeps undecodable bytes of an argument as lone surrogates, which no
            # database, header or query can carry. (The token is never quoted.)
            raise CommandError(f"{name}: is not UTF-8 text (it holds a byte no UTF-8 text has)")
    if opts["prometheus_ca_file"] and opts["insecure_skip_tls_verify"]:
        raise CommandError("--prometheus-ca-file and --insecure-skip-tls-verify exclude each other: "
                           "a CA file is for verifying the certificate")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Command(CliActorMixin, BaseCommand):
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
        parser.add_argument("--prometheus-ca-file", default=None, metavar="PATH",
                            help="PEM file of the CA(s) that signed Prometheus' certificate (default: the "
                                 "cluster's CA bundle, else the system's trusted CAs)")
        parser.add_argument("--power-threshold", type=float, default=None, metavar="WATTS",
                            help="a GPU that drew more than this (DCGM_FI_DEV_POWER_USAGE) is not idle whatever "
                                 "its utilization; a GPU without power data is then never idle (default: off)")
        parser.add_argument("--owner-kinds", default=None, metavar="KINDS",
                            help="act only on owners of these kinds, comma-separated: Deployment, ReplicaSet, "
                                 "StatefulSet, Notebook, InferenceService, KnativeService (default: all)")
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
        from django.core.exceptions import ObjectDoesNotExist

        from clusters.services import cluster_resolve
        from config import clock
        from pruning.services import PruneParamError, PruneParams, prometheus_for, prune_run_execute

        _check_flags(opts)
        try:
            cluster = cluster_resolve(name=opts["cluster"])
        except (ObjectDoesNotExist, KubeError) as exc:
            raise CommandError(str(exc)) from None
        try:
            params = PruneParams.from_settings(
                window_seconds=_minutes_to_seconds(opts["duration"]), namespace=opts["namespace"],
                model_name=opts["model_name"], run_mode=opts["run_mode"], idle_threshold=opts["idle_threshold"],
                grace_seconds=opts["grace_period"], label_scheme=opts["label_scheme"],
                max_scale_downs=opts["max_scale_downs"], power_threshold_watts=opts["power_threshold"],
                owner_kinds=opts["owner_kinds"])
            try:
                prometheus = prometheus_for(cluster=cluster, url=opts["prometheus_url"],
                                            token=opts["prometheus_token"], ca_file=opts["prometheus_ca_file"],
                                            verify_tls=False if opts["insecure_skip_tls_verify"] else None)
            except PrometheusError as exc:
                raise CommandError(f"--prometheus-ca-file: {exc}" if opts["prometheus_ca_file"]
                                   and "CA file" in str(exc) else str(exc)) from None
            at = datetime.fromisoformat(opts["at"].replace("Z", "+00:00")) if opts["at"] else None
        except PruneParamError as exc:
            flag = FLAGS.get(exc.field)
            raise CommandError(f"{flag}: {exc}" if flag and not exc.setting else str(exc)) from None
        except FilterError as exc:
            raise CommandError(str(exc)) from None
        except (ValueError, PrometheusError) as exc:
            raise CommandError(f"--at: {exc}" if opts["at"] and "isoformat" in str(exc) else str(exc)) from None
        if at is not None and at.tzinfo is None:
            raise CommandError("--at needs a time zone, e.g. 2026-01-01T12:00:00Z")
        if at is not None and params.run_mode != "dry-run":
            # The data would be of then, the workloads acted on of now.
            raise CommandError("--at: only a dry run may be evaluated as of another time; a scale-down acts on "
                               "the workloads as they are now, by the GPU data of now (leave out --at, or use "
                               "-r dry-run)")
        runs = 0
        while True:
            try:
                # The shell account and host the command runs under (cli:<user>@<host>), as the
                # audit rows written meanwhile record it.
                run = prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=prometheus, params=params,
                                        now=at or clock.now(), cluster=cluster, actor=actor_label_current())
            except (PrometheusError, KubeError) as exc:
                message = str(exc)
                field = getattr(exc, "field", "")
                if field in FLAGS:
                    message = f"{FLAGS[field]}: {message}"
                if not opts["daemon_mode"]:
                    raise CommandError(message) from None
                self.stderr.write(f"prune run failed: {message}")
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
                    "run": run.pk, "mode": run.mode, "namespace": d.namespace, "pod": d.pod, "count": d.count,
                    "pods": d.pods,
                    "owner": {"apiVersion": d.owner_api_version, "kind": d.owner_kind, "name": d.owner_name}
                    if d.owner_kind else None,
                    "gpus": d.gpus, "max_utilization": d.max_utilization, "decision": d.decision,
                    "reason": d.reason, "method": d.method, "result": d.result, "error": d.error,
                    "event_sent": d.event_sent, "restore_state": d.restore_state, "effect": d.effect}))
            else:
                owner = f"{d.owner_kind}/{d.owner_name}" if d.owner_kind else "-"
                # What this row's write does (a Knative Service: whether its new revision starts a
                # pod, and why); rows recorded before it was kept: the method's description.
                effect = d.effect or EFFECT.get(d.method, "scaled to zero")
                would = "would scale to zero" if effect == "scaled to zero" else f"would be {effect}"
                verb = {"dry-run": would, "succeeded": effect,
                        "acting": f"outcome not yet known: {d.error}",
                        "failed": f"FAILED: {d.error}"}.get(d.result, "skip")
                more = f" (+{d.count - 1} more)" if d.count > 1 else ""
                self.stdout.write(f"{d.namespace}/{d.pod}{more} -> {owner}: {verb} ({d.reason})")
        if not as_json:
            for note in run.notes or ():
                self.stdout.write(f"note: {note}")
            self.stdout.write(f"run {run.pk} ({run.mode}): {run.pods_seen} GPU pods seen, {run.busy_pods} busy, "
                              f"{run.idle_candidates} looked idle, {run.planned} planned, {run.acted} acted, "
                              f"{run.failed} failed, {run.kube_api_calls} API calls, {run.duration_seconds:.2f}s")
