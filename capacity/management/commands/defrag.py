"""`python manage.py defrag NODE`: the whole defrag of one node, run in this process.

Exit code 0 only when the node is safe (or, with --drain / --abort, drained / aborted;
with --return-to-service, uncordoned or already schedulable, and the abort it asks of a
safe, blocked or failed job carried out).
The command follows the job's numbered log (it never misses the end, however long the
job ran), folds repeated lines ("… ×464") and always ends with the job's final state.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from clusters.services import cluster_resolve
from config import clock
from config.actors import acting_as, cli_label
from config.prompts import confirmed

from capacity.defrag.models import AbortChoice, DefragJob, JobState
from capacity.defrag.planning import LogFolder, interval_validate
from capacity.defrag.selectors import defrag_job_log_after
from capacity.selectors import defrag_job_live_for_node, defrag_job_progress, node_without_gpus
from capacity.defrag.services import (
    POLL_RANGE,
    TIMEOUT_RANGE,
    DefragError,
    ReturnUnconfirmed,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_lease_acquire,
    defrag_job_lease_release,
    defrag_job_pause_seconds,
    defrag_job_resting,
    defrag_job_start,
    defrag_job_step,
    node_return_to_service,
)

EXIT_NOT_SAFE = 1
# Not confirmed (answered no, or no answer): 1, as every other command of the product exits
# when it refuses (a CommandError), after saying that nothing was done.
EXIT_REFUSED = 1
# What a user named with --as must be allowed to do for each action (the panel asks the same).
PERMISSIONS = {"start": "capacity.add_defragjob", "drain": "capacity.drain_defragjob",
               "abort": "capacity.change_defragjob", "return": "capacity.return_to_service_defragjob"}


def _number(text: str) -> float:
    """argparse type: any float, even nan/inf; `handle` says which flag is wrong and why."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(text) from None


class Command(BaseCommand):
    help = ("Safely empty a GPU node: report, confirm, cordon, orphan its model pods and wait until "
            "their revisions are over-provisioned enough. --drain and --abort act on the node's live job; "
            "--return-to-service uncordons the node once its job rests.")

    def add_arguments(self, parser):
        parser.add_argument("node", help="Node name.")
        parser.add_argument("--cluster", default=None, help="Cluster name (default: the default cluster).")
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")
        parser.add_argument("--timeout", type=_number, default=None,
                            help=f"Time limit in whole seconds, {TIMEOUT_RANGE[0]}..{TIMEOUT_RANGE[1]} (default 1800).")
        parser.add_argument("--poll-interval", type=_number, default=None,
                            help=f"Seconds between checks, {POLL_RANGE[0]:g}..{POLL_RANGE[1]:g} (default 10).")
        parser.add_argument("--json", action="store_true", help="Print one JSON document instead of progress lines.")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--drain", action="store_true", help="Evict the orphans of the node's safe job.")
        action.add_argument("--abort", action="store_true", help="Abort the node's live job.")
        action.add_argument("--return-to-service", action="store_true",
                            help="Uncordon the node once its defrag job rests (safe, blocked, failed, drained, "
                                 "aborted, abort-stuck); a safe, blocked or failed job is aborted as well.")
        parser.add_argument("--as", dest="as_user", default=None, metavar="USER",
                            help="Act as this panel user (audited as them, their permissions checked); without "
                                 "it the audit names cli:<os user>@<host>.")
        parser.add_argument("--delete-node", action="store_true", help="With --drain: then delete the Node.")
        orphans = parser.add_mutually_exclusive_group()
        orphans.add_argument("--keep-orphans", action="store_true",
                             help="With --abort: orphans whose replacements have no room keep serving; the job "
                                  "stops as abort-stuck at once instead of waiting for the deadline.")
        orphans.add_argument("--delete-orphans", action="store_true",
                             help="With --abort: delete the orphans even if their revision is not back to scale "
                                  "(capacity drops).")

    def handle(self, *args, node: str, cluster: str | None, yes: bool, timeout: float | None,
               poll_interval: float | None, json: bool, drain: bool, abort: bool, delete_node: bool,
               keep_orphans: bool, delete_orphans: bool, return_to_service: bool = False, as_user: str | None = None,
               **_):
        # IMPORTANT: every flag is checked before anything is read or changed.
        if timeout is not None:
            error = interval_validate(timeout, field="--timeout", minimum=TIMEOUT_RANGE[0],
                                      maximum=TIMEOUT_RANGE[1], whole=True)
            if error:
                raise CommandError(error)
            timeout = int(timeout)
        if poll_interval is not None:
            error = interval_validate(poll_interval, field="--poll-interval", minimum=POLL_RANGE[0],
                                      maximum=POLL_RANGE[1])
            if error:
                raise CommandError(error)
        if delete_node and not drain:
            raise CommandError("--delete-node only goes with --drain")
        if (keep_orphans or delete_orphans) and not abort:
            raise CommandError("--keep-orphans and --delete-orphans only go with --abort")
        action = "drain" if drain else "abort" if abort else "return" if return_to_service else "start"
        actor = self._actor(as_user, action)
        self.as_json = json
        self.seq, self.last_line = 0, None
        self.folder = LogFolder()
        try:
            cluster_row = cluster_resolve(name=cluster)
        except Exception as exc:  # Cluster.DoesNotExist names the known clusters
            raise CommandError(str(exc)) from None
        with acting_as(cli_label()):
            if return_to_service:
                return self._return_to_service(cluster_row, node, actor, yes)
            return self._act(cluster_row, node, actor, yes, timeout, poll_interval, drain, abort, delete_node,
                             keep_orphans, delete_orphans)

    def _actor(self, username: str | None, action: str):
        if username is None:
            return None
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"--as: no active user named {username!r}")
        if not user.has_perm(PERMISSIONS[action]):
            raise CommandError(f"--as: user {username!r} lacks the permission {PERMISSIONS[action]}")
        return user

    def _return_to_service(self, cluster_row, node: str, actor, yes: bool):
        if not self._confirm(yes, f"Return node {node} to service (uncordon it)?"):
            self._declined(f"node {node} stays cordoned")
            sys.exit(EXIT_REFUSED)
        try:
            done = node_return_to_service(cluster=cluster_row, node=node, actor=actor, enqueue=False)
        except ReturnUnconfirmed as exc:
            raise CommandError(f"not known whether the node was uncordoned: {exc}") from None
        except (DefragError, KubeError) as exc:
            raise CommandError(f"nothing changed: {exc}") from None
        result = {"node": done.node, "job": done.job_id, "uncordoned": done.uncordoned,
                  "abort_requested": done.abort_requested, "message": done.message}
        if not self.as_json:
            self.stdout.write(done.message)
        code = 0
        if done.abort_requested:
            # The job's abort is carried out here, as --abort does: the command ends when it rests.
            job = DefragJob.objects.get(pk=done.job_id)
            self.seq = job.log_seq
            job = self._run(job)
            code = 0 if job.state == JobState.ABORTED else EXIT_NOT_SAFE
            if not self.as_json:
                return self._exit(job, code)
            result["job_progress"] = defrag_job_progress(job=job)
        if self.as_json:
            self.stdout.write(json.dumps(result, indent=2, default=str))
        if code:
            sys.exit(code)

    def _act(self, cluster_row, node, actor, yes, timeout, poll_interval, drain, abort, delete_node, keep_orphans,
             delete_orphans):
        try:
            if drain or abort:
                job = defrag_job_live_for_node(cluster=cluster_row, node_name=node)
                if job is None:
                    raise CommandError(f"node {node!r} has no live defrag job on cluster {cluster_row.name!r}")
                self.seq = job.log_seq
                if drain:
                    if not self._confirm(yes, f"Drain node {node}: evict {job.orphans.filter(state='orphaned').count()}"
                                              f" orphaned pod(s){' and delete the Node' if delete_node else ''}?"):
                        self._declined(f"no pod of node {node} was evicted; defrag job #{job.pk} is unchanged")
                        return self._exit(job, EXIT_REFUSED)
                    job = defrag_job_drain(job=job, actor=actor, delete_node=delete_node, enqueue=False)
                    wanted = JobState.DRAINED
                else:
                    choice = (AbortChoice.KEEP if keep_orphans else AbortChoice.DELETE if delete_orphans
                              else AbortChoice.WAIT)
                    if delete_orphans and not self._confirm(
                            yes, f"Delete the orphans of node {node} even where their revision is not back to "
                                 f"scale (capacity drops)?"):
                        self._declined(f"defrag job #{job.pk} of node {node} is not aborted and no orphan deleted")
                        return self._exit(job, EXIT_REFUSED)
                    job = defrag_job_abort(job=job, actor=actor, orphans=choice, poll_interval_seconds=poll_interval,
                                           enqueue=False)
                    wanted = JobState.ABORTED
            else:
                plan = defrag_discover(cluster=cluster_row, node_name=node)
                no_gpus = node_without_gpus(cluster=cluster_row, node_name=node)
                if no_gpus:
                    raise CommandError(no_gpus)
                if not self.as_json:
                    self.stdout.write("\n".join(plan.report_lines()) + "\n")
                if not self._confirm(yes, "Proceed with defrag?"):
                    self._declined(f"node {node} was not cordoned and no defrag job was created")
                    return self._exit(None, EXIT_REFUSED)
                job = defrag_job_start(cluster=cluster_row, node_name=node, plan=plan, actor=actor,
                                       timeout_seconds=timeout, poll_interval_seconds=poll_interval, enqueue=False)
                self.seq = job.log_seq
                wanted = JobState.SAFE
        except (DefragError, KubeError) as exc:
            raise CommandError(str(exc)) from None
        job = self._run(job)
        return self._exit(job, 0 if job.state == wanted else EXIT_NOT_SAFE)

    def _confirm(self, yes: bool, question: str) -> bool:
        return confirmed(question, yes=yes, as_json=self.as_json, stderr=self.stderr)

    def _declined(self, what: str) -> None:
        """Says that nothing was done, and what stays as it was (on stderr: --json keeps stdout)."""
        self.stderr.write(f"Not confirmed: nothing was done ({what}).")

    def _run(self, job: DefragJob) -> DefragJob:
        """Step the job in this process until it rests, printing the new log lines.

        The command holds the job's lease like a worker does; while a worker holds it (the
        job was started from the panel), the command only follows the log."""
        owner = f"cli:{socket.gethostname()}:{os.getpid()}"
        try:
            while True:
                if defrag_job_lease_acquire(job_id=job.pk, owner=owner, now=clock.now()):
                    job = defrag_job_step(job=job, now=clock.now())
                else:
                    job.refresh_from_db()
                self._print_new(job)
                if defrag_job_resting(job=job, now=clock.now()):
                    return job
                pause = defrag_job_pause_seconds(job=job, now=clock.now())
                time.sleep(pause if job.lease_owner in ("", owner) else max(0.5, min(pause, 2.0)))
        finally:
            defrag_job_lease_release(job_id=job.pk, owner=owner)

    def _print_new(self, job: DefragJob) -> None:
        """Lines after the last one printed, by number: a gap (lines the job no longer
        keeps) is said, never silently skipped."""
        for seq, line in defrag_job_log_after(job=job, seq=self.seq):
            if seq > self.seq + 1:
                self._write([f"… {seq - self.seq - 1} line(s) not kept …"])
            self._write(self.folder.feed(line))
            self.seq, self.last_line = seq, line

    def _write(self, lines: list[str]) -> None:
        if not self.as_json:
            for line in lines:
                self.stdout.write(line)

    def _exit(self, job: DefragJob | None, code: int):
        if self.as_json:
            self.stdout.write(json.dumps(defrag_job_progress(job=job) if job else {"state": "not confirmed"},
                                         indent=2, default=str))
        elif job is not None:
            self._write(self.folder.flush())
            job.refresh_from_db()
            if job.error and job.error != self.last_line:
                self.stdout.write(job.error)  # why it rests there, unless the last line said it already
            self.stdout.write(f"Final state of defrag job #{job.pk}: {job.state}; exit {code}")
        if code:
            sys.exit(code)
