"""`python manage.py defrag NODE`: the seed's script as a command, run in this process.

Exit code 0 only when the node is safe (or, with --drain / --abort, drained / aborted).
"""
from __future__ import annotations

import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from clusters.selectors import cluster_get
from config import clock

from capacity.models import RESTING_STATES, DefragJob, JobState
from capacity.selectors import defrag_job_live_for_node, defrag_job_progress
from capacity.services import (
    DefragError,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_start,
    defrag_job_step,
)

EXIT_NOT_SAFE = 1
EXIT_REFUSED = 2


class Command(BaseCommand):
    help = ("Safely empty a GPU node (seed 000): report, confirm, cordon, orphan its model pods and wait until "
            "their revisions are over-provisioned enough. --drain and --abort act on the node's live job.")

    def add_arguments(self, parser):
        parser.add_argument("node", help="Node name.")
        parser.add_argument("--cluster", default=None, help="Cluster name (default: the default cluster).")
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")
        parser.add_argument("--timeout", type=int, default=None, help="Time limit in seconds (default 1800).")
        parser.add_argument("--poll-interval", type=float, default=None, help="Seconds between checks (default 10).")
        parser.add_argument("--json", action="store_true", help="Print one JSON document instead of progress lines.")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--drain", action="store_true", help="Evict the orphans of the node's safe job.")
        action.add_argument("--abort", action="store_true", help="Abort the node's live job.")
        parser.add_argument("--delete-node", action="store_true", help="With --drain: then delete the Node.")

    def handle(self, *args, node: str, cluster: str | None, yes: bool, timeout: int | None,
               poll_interval: float | None, json: bool, drain: bool, abort: bool, delete_node: bool, **_):
        if timeout is not None and timeout <= 0:
            raise CommandError(f"--timeout must be > 0 seconds, got {timeout}")
        if poll_interval is not None and poll_interval <= 0:
            raise CommandError(f"--poll-interval must be > 0 seconds, got {poll_interval}")
        if delete_node and not drain:
            raise CommandError("--delete-node only goes with --drain")
        self.as_json = json
        self.printed = 0
        try:
            cluster_row = cluster_get(name=cluster)
        except Exception as exc:  # Cluster.DoesNotExist names the known clusters
            raise CommandError(str(exc)) from None
        try:
            if drain or abort:
                job = defrag_job_live_for_node(cluster=cluster_row, node_name=node)
                if job is None:
                    raise CommandError(f"node {node!r} has no live defrag job on cluster {cluster_row.name!r}")
                if drain:
                    self.printed = len(job.log)
                    if not self._confirm(yes, f"Drain node {node}: evict {job.orphans.filter(state='orphaned').count()}"
                                              f" orphaned pod(s){' and delete the Node' if delete_node else ''}?"):
                        return self._exit(job, EXIT_REFUSED)
                    job = defrag_job_drain(job=job, actor=None, delete_node=delete_node, enqueue=False)
                    wanted = JobState.DRAINED
                else:
                    self.printed = len(job.log)
                    job = defrag_job_abort(job=job, actor=None, enqueue=False)
                    wanted = JobState.ABORTED
            else:
                plan = defrag_discover(cluster=cluster_row, node_name=node)
                if not self.as_json:
                    self.stdout.write("\n".join(plan.report_lines()) + "\n")
                if not self._confirm(yes, "Proceed with defrag?"):
                    return self._exit(None, EXIT_REFUSED)
                job = defrag_job_start(cluster=cluster_row, node_name=node, plan=plan, actor=None,
                                       timeout_seconds=timeout, poll_interval_seconds=poll_interval, enqueue=False)
                self.printed = len(job.log)
                wanted = JobState.SAFE
        except (DefragError, KubeError) as exc:
            raise CommandError(str(exc)) from None
        job = self._run(job)
        return self._exit(job, 0 if job.state == wanted else EXIT_NOT_SAFE)

    def _confirm(self, yes: bool, question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty() and self.as_json:
            raise CommandError("--json without --yes needs a terminal to confirm")
        answer = input(f"{question} (y/n): ").strip().lower()
        return answer in ("y", "yes")

    def _run(self, job: DefragJob) -> DefragJob:
        """Step the job in this process until it rests, printing the new log lines."""
        while True:
            job = defrag_job_step(job=job, now=clock.now())
            self._print_new(job)
            if job.state in RESTING_STATES:
                return job
            if job.next_check_at:
                time.sleep(max(0.0, (job.next_check_at - clock.now()).total_seconds()))
            job.refresh_from_db()

    def _print_new(self, job: DefragJob) -> None:
        if self.as_json:
            return
        for line in job.log[self.printed:]:
            self.stdout.write(line)
        self.printed = len(job.log)

    def _exit(self, job: DefragJob | None, code: int):
        if self.as_json:
            self.stdout.write(json.dumps(defrag_job_progress(job=job) if job else {"state": "not confirmed"},
                                         indent=2, default=str))
        if code:
            sys.exit(code)
