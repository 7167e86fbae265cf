"""`python manage.py consolidate --pool KEY=VALUE (--free K | --max)`: free whole nodes of a
pool as one campaign, run in this process.

Prints the plan (which nodes, in what order, where their pods go, what is left out and why,
and the lower bound) and asks for confirmation; --dry-run only prints it. Confirmed, it
starts the campaign and follows it until it is done: exit 0 only when every planned node the
campaign did not drop is safe (or drained, with --drain-when-safe); 1 otherwise, as when the
operator answers no. Draining and removing the freed nodes stay the operator's step unless
--drain-when-safe was given.

`--rehearse DUMP` runs the campaign on a copy of the cluster instead: DUMP is the output of
`kubectl get nodes,pods,replicasets,deployments,services.serving.knative.dev,revisions,
podautoscalers,pdb -A -o json`, loaded into a simulated cluster whose clock is
fast-forwarded. It prints the plan over the dump and what the campaign did there (nodes
freed, pods moved, where their replacements landed, time to all safe, anything dropped or
stuck), then the command that would run it for real. Nothing is sent to the cluster, so
nothing is asked; exit 0 when the rehearsal freed every planned node, 1 otherwise.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from clusters.services import cluster_resolve
from config import clock
from config.actors import acting_as, cli_label
from config.prompts import confirmed

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign, CampaignState, NodeRole, NodeState
from capacity.campaigns.planning import CampaignInputError, CampaignPlan, pool_selector_parse, pool_selector_text
from capacity.campaigns.selectors import campaign_plan_read, campaign_progress
from capacity.campaigns.services import (
    CampaignError,
    Rehearsal,
    RehearsalError,
    campaign_lease_acquire,
    campaign_lease_release,
    campaign_rehearse,
    campaign_start,
    campaign_step,
)
from capacity.defrag.models import LIVE_STATES, DefragJob
from capacity.defrag.services import (
    defrag_job_lease_acquire,
    defrag_job_lease_release,
    defrag_job_pause_seconds,
    defrag_job_resting,
    defrag_job_step,
)

EXIT_NOT_FREED = 1
EXIT_REFUSED = 1
# The longest the command sleeps between two looks at the campaign and its jobs (seconds).
FOLLOW_SECONDS = 1.0


def _whole(flag: str, text: str | None, *, low: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{flag} takes a whole number, {low} or more, not {text!r}") from None
    if value < low:
        raise CommandError(f"{flag} takes a whole number, {low} or more, not {value}")
    return value


class Command(BaseCommand):
    help = ("Free whole GPU nodes of a pool as one campaign: every node it frees is cordoned before the first pod "
            "moves, then defrag jobs empty them in order. Prints the plan and asks before starting.")

    def add_arguments(self, parser):
        parser.add_argument("--pool", required=True, metavar="KEY=VALUE[,KEY=VALUE]",
                            help="The pool: node labels, e.g. karpenter.sh/nodepool=h100.")
        goal = parser.add_mutually_exclusive_group(required=True)
        goal.add_argument("--free", metavar="K", help="Free K nodes.")
        goal.add_argument("--max", dest="free_max", action="store_true", help="Free as many nodes as can be.")
        parser.add_argument("--max-in-flight", metavar="N", default="1",
                            help="Nodes emptied at once (default 1; at most CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER).")
        parser.add_argument("--cluster", default=None, help="Cluster name (default: the default cluster).")
        parser.add_argument("--dry-run", action="store_true", help="Print the plan; change nothing.")
        parser.add_argument("--rehearse", metavar="DUMP", default=None,
                            help="Run the campaign on a copy of the cluster loaded from DUMP (kubectl get nodes,pods,"
                                 "replicasets,deployments,services.serving.knative.dev,revisions,podautoscalers,pdb "
                                 "-A -o json), clock fast-forwarded, and report what happened; nothing is sent to "
                                 "the cluster.")
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of lines.")
        parser.add_argument("--drain-when-safe", action="store_true",
                            help="Drain each node once it is safe (evict its orphans); otherwise draining is yours.")
        parser.add_argument("--as", dest="as_user", default=None, metavar="USER",
                            help="Act as this panel user (audited as them, their permissions checked).")

    def handle(self, *args, pool: str, free: str | None, free_max: bool, max_in_flight: str, cluster: str | None,
               dry_run: bool, yes: bool, json: bool, drain_when_safe: bool, as_user: str | None = None,
               rehearse: str | None = None, **_):
        # IMPORTANT: every flag is checked before anything is read or changed.
        if rehearse is not None and dry_run:
            raise CommandError("--rehearse and --dry-run exclude each other: --dry-run prints the plan over the "
                               "cluster, --rehearse runs the campaign on a copy of DUMP; neither changes the cluster")
        if rehearse is not None and yes:
            raise CommandError("--rehearse starts nothing on the cluster, so there is nothing to confirm: "
                               "leave out --yes")
        try:
            selector = pool_selector_parse(pool)
        except CampaignInputError as exc:
            raise CommandError(str(exc)) from None
        goal = _whole("--free", free, low=1)
        in_flight = _whole("--max-in-flight", max_in_flight, low=1)
        limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
        if in_flight > limit:
            raise CommandError(f"--max-in-flight {in_flight} is more than the defrag jobs a cluster may run at once "
                               f"({limit}, CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
        actor = None if dry_run else self._actor(as_user, drain_when_safe)
        self.as_json = json
        if rehearse is not None:
            return self._rehearse(rehearse, selector=selector, goal=goal, in_flight=in_flight, cluster=cluster,
                                  drain_when_safe=drain_when_safe, actor=actor)
        try:
            cluster_row = cluster_resolve(name=cluster)
        except Exception as exc:  # Cluster.DoesNotExist names the known clusters
            raise CommandError(str(exc)) from None
        with acting_as(cli_label()):
            try:
                plan = campaign_plan_read(cluster=cluster_row, selector=selector, goal=goal, now=clock.now())
            except CampaignInputError as exc:
                raise CommandError(str(exc)) from None
            except KubeError as exc:
                raise CommandError(f"cluster {cluster_row.name}: {exc}") from None
            if not json:
                self.stdout.write("\n".join(plan.report_lines()))
            if dry_run:
                if not json:
                    self.stdout.write("Dry run: nothing was changed. To rehearse it on a copy of the cluster first, "
                                      "add --rehearse DUMP (a `kubectl get nodes,pods,replicasets,deployments,"
                                      "services.serving.knative.dev,revisions,podautoscalers,pdb -A -o json` dump); "
                                      "to run it, the same command without --dry-run.")
                return self._result(plan, None)
            if not plan.nodes:
                self._result(plan, None, state="not started")
                raise CommandError("the plan frees no node: no campaign was started")
            if not self._confirm(yes, f"Start the campaign: cordon {plan.freed + len(plan.kept_empty)} node(s) "
                                      f"and empty {plan.freed}?"):
                self.stderr.write("Not confirmed: nothing was done (no node was cordoned and no campaign was "
                                  "created).")
                self._result(plan, None, state="not confirmed")
                sys.exit(EXIT_REFUSED)
            try:
                campaign = campaign_start(cluster=cluster_row, plan=plan, actor=actor, max_in_flight=in_flight,
                                          drain_when_safe=drain_when_safe, enqueue=False, source="cli")
            except (CampaignError, KubeError) as exc:
                raise CommandError(str(exc)) from None
            if not json:
                self.stdout.write(f"Campaign #{campaign.pk} started.")
            campaign = self._follow(campaign)
        freed = campaign.nodes.filter(role=NodeRole.FREED)
        ok = campaign.state == CampaignState.DONE and all(
            n.state in (NodeState.SAFE, NodeState.DRAINED, NodeState.DROPPED) for n in freed)
        code = 0 if ok else EXIT_NOT_FREED
        self._result(plan, campaign)
        if not json:
            counts = {s: freed.filter(state=s).count() for s in (NodeState.SAFE, NodeState.DRAINED, NodeState.DROPPED)}
            if counts["safe"]:
                nodes = [n.node_name for n in freed.filter(state=NodeState.SAFE).order_by("position")]
                self.stdout.write(f"Safe, cordoned, their orphans still serving: {', '.join(nodes)}. Draining and "
                                  f"removing them is your step: `manage.py defrag NODE --drain` for each, or the "
                                  f"campaign's defrag jobs in the panel.")
            self.stdout.write(f"Final state of campaign #{campaign.pk}: {campaign.state} ({counts['safe']} safe, "
                              f"{counts['drained']} drained, {counts['dropped']} dropped); exit {code}")
        if code:
            sys.exit(code)

    def _rehearse(self, dump: str, *, selector: dict, goal: int | None, in_flight: int, cluster: str | None,
                  drain_when_safe: bool, actor) -> None:
        """The campaign run on a copy of DUMP; the cluster named is only recorded (never read)."""
        if cluster is not None:
            try:
                cluster_row = cluster_resolve(name=cluster)
            except Exception as exc:  # Cluster.DoesNotExist names the known clusters
                raise CommandError(str(exc)) from None
        else:
            try:
                cluster_row = cluster_resolve(name=None)
            except Exception:  # no default cluster: the rehearsal names none
                cluster_row = None
        with acting_as(cli_label()):
            try:
                rehearsal = campaign_rehearse(dump=dump, selector=selector, goal=goal, max_in_flight=in_flight,
                                              drain_when_safe=drain_when_safe, actor=actor, cluster=cluster_row)
            except (CampaignInputError, RehearsalError) as exc:
                raise CommandError(str(exc)) from None
        command = self._real_command(rehearsal, cluster_row, selector=selector, goal=goal, in_flight=in_flight,
                                     drain_when_safe=drain_when_safe)
        code = 0 if rehearsal.freed_all else EXIT_NOT_FREED
        if self.as_json:
            self._result(rehearsal.plan, None, state=rehearsal.campaign.state, rehearsal=rehearsal, command=command)
        else:
            self.stdout.write("\n".join(rehearsal.plan.report_lines()))
            self.stdout.write("")
            self.stdout.write("\n".join(rehearsal.report_lines()))
            self.stdout.write(f"Nothing was sent to the cluster. To run it for real: {command}")
        if code:
            sys.exit(code)

    @staticmethod
    def _real_command(rehearsal: Rehearsal, cluster_row, *, selector: dict, goal: int | None, in_flight: int,
                      drain_when_safe: bool) -> str:
        words = ["manage.py", "consolidate"]
        if cluster_row is not None:
            words += ["--cluster", cluster_row.name]
        words += ["--pool", pool_selector_text(selector), *(["--free", str(goal)] if goal else ["--max"])]
        if in_flight != 1:
            words += ["--max-in-flight", str(in_flight)]
        if drain_when_safe:
            words.append("--drain-when-safe")
        return shlex.join(words)

    def _actor(self, username: str | None, drain: bool):
        if username is None:
            return None
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"--as: no active user named {username!r}")
        for perm in ("capacity.add_campaign", *(["capacity.drain_defragjob"] if drain else [])):
            if not user.has_perm(perm):
                raise CommandError(f"--as: user {username!r} lacks the permission {perm}")
        return user

    def _confirm(self, yes: bool, question: str) -> bool:
        return confirmed(question, yes=yes, as_json=self.as_json, stderr=self.stderr)

    def _result(self, plan: CampaignPlan, campaign: Campaign | None, state: str = "planned",
                rehearsal: Rehearsal | None = None, command: str = "") -> None:
        if not self.as_json:
            return
        out = {"campaign": campaign.pk if campaign else None, "state": campaign.state if campaign else state,
               "nodes": list(plan.node_names), "freed": plan.freed, "gpus_freed": plan.gpus_freed,
               "pods_moved": plan.pods_moved, "replacements_on_campaign_nodes": plan.replacements_on_campaign_nodes,
               "lower_bound": plan.lower_bound, "kept_empty": list(plan.kept_empty),
               "left_out": [{"node": o.node, "reason": o.reason, "why": o.why} for o in plan.left_out],
               "moves": [{"pod": m.pod, "gpus": m.gpus, "from": m.source, "to": m.to} for m in plan.moves],
               "summary": plan.summary}
        if campaign is not None:
            out.update({k: v for k, v in campaign_progress(campaign=campaign).items() if k != "campaign"})
        if rehearsal is not None:
            out["rehearsal"] = {"id": rehearsal.record.pk, **rehearsal.outcome.to_dict(),
                                "simulated_seconds": rehearsal.simulated_seconds,
                                "copy_cluster": rehearsal.record.copy_cluster.name,
                                "campaign_on_copy": rehearsal.campaign.pk, "node_states": {
                                    node: {"state": state, "dropped_reason": why}
                                    for node, (state, why) in rehearsal.node_states.items()},
                                "command": command}
        self.stdout.write(json.dumps(out, indent=2, default=str))

    def _follow(self, campaign: Campaign) -> Campaign:
        """Pass over the campaign and step its defrag jobs in this process until it ends,
        printing each node's changes. Whatever a worker holds (a lease) it only follows."""
        owner = f"cli:{socket.gethostname()}:{os.getpid()}"
        said: dict[str, tuple] = {}
        try:
            while True:
                if campaign_lease_acquire(campaign_id=campaign.pk, owner=owner, now=clock.now()):
                    campaign = campaign_step(campaign=campaign, enqueue=False)
                else:
                    campaign.refresh_from_db()
                pauses = [FOLLOW_SECONDS]
                for job in DefragJob.objects.filter(campaign_nodes__campaign=campaign, state__in=LIVE_STATES):
                    if defrag_job_resting(job=job, now=clock.now()):
                        continue
                    if defrag_job_lease_acquire(job_id=job.pk, owner=owner, now=clock.now()):
                        try:
                            job = defrag_job_step(job=job)
                        finally:
                            defrag_job_lease_release(job_id=job.pk, owner=owner)
                    pauses.append(defrag_job_pause_seconds(job=job, now=clock.now()))
                self._print_changes(campaign, said)
                if campaign.state not in LIVE_CAMPAIGN_STATES:
                    return campaign
                time.sleep(max(0.05, min(pauses)))
        finally:
            campaign_lease_release(campaign_id=campaign.pk, owner=owner)

    def _print_changes(self, campaign: Campaign, said: dict[str, tuple]) -> None:
        if self.as_json:
            return
        for row in campaign.nodes.select_related("job").order_by("position"):
            now = (row.state, row.job.state if row.job else None, row.waiting_reason)
            if said.get(row.node_name) == now:
                continue
            said[row.node_name] = now
            job = f" (defrag job #{row.job.pk}: {row.job.state})" if row.job else ""
            why = (f": {row.dropped_reason}" if row.state == NodeState.DROPPED
                   else f"; waiting: {row.waiting_reason}" if row.waiting_reason else "")
            self.stdout.write(f"  {row.node_name}: {row.get_state_display()}{job}{why}")
