"""Binpack runs: every time deletion costs were planned (and, unless a dry run, written)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from clusters.models import Cluster
from config.actors import actor_label_current


# What became of each planned change of a run that writes (`changes[i]["result"]`), as the
# command and the run page say it: only "written" means the pod carries the planned cost.
WRITE_RESULTS = {
    "written": "written",
    "stale": "not written, the pod changed or went away since the plan",
    "error": "not written, the write failed",
    # No answer, or a server error, after the write was sent (or after an earlier try of it
    # went unanswered): the API server may have applied it. Kept announced on its run, which
    # the next run on the cluster (or the beat) settles from the pod before it plans.
    "unknown": "outcome not known: the write was sent and its answer was lost (the cluster stopped answering); "
               "the next run on the cluster settles it from the pod",
    "untried": "not written, not tried: the cluster had stopped answering",
    "lease-lost": "not written, not tried: the run's lease lapsed while it wrote (taken to be settled as interrupted)",
    # A run's changes are recorded "announced" before its first write; a run whose process
    # died mid-write keeps them so until the next run (or the beat) settles it from the pods.
    "announced": "announced, outcome not known yet: the run is writing (or its process stopped)",
    # Settled from the pod by a later run: the write's run was interrupted, or its answer was
    # lost (the run's errors say which).
    "settled-written": "written (not known when its run recorded it: the run was interrupted or the write's answer "
                       "was lost; found on the pod and recorded later)",
    "settled-not-written": "not written (not known when its run recorded it: the run was interrupted or the write's "
                           "answer was lost; the pod did not carry the cost when settled)",
    # A write in flight when its stalled run was settled, landed after the settle read the pod.
    "written-late": "written (its run was settled as interrupted before this write answered; recorded then by "
                    "the run's process)",
}


class BinpackRun(models.Model):
    class Trigger(models.TextChoices):
        SCHEDULE = "schedule", "beat schedule"
        ADMIN = "admin", "admin action"
        COMMAND = "command", "management command"

    class State(models.TextChoices):
        WRITING = "writing", "writing (announced; its writes may be under way)"
        DONE = "done", "done"
        INTERRUPTED = "interrupted", "interrupted (its process stopped mid-write; settled later from the cluster)"

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="binpack_runs",
                                help_text="The cluster whose pods were costed.")
    started_at = models.DateTimeField(db_index=True, help_text="When the snapshot was taken (the injected clock).")
    finished_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the last write returned; for an interrupted run, when it was settled from the cluster.")
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.DONE,
        help_text="writing: announced before its first write, outcome not recorded yet; done: finished and "
                  "audited by its own process (while `unknown` is above 0, some writes' outcomes are not known yet "
                  "and wait for the next run to settle them); interrupted: its process stopped mid-write and a "
                  "later run (or the beat) recorded what the pods carry.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The operator who asked; empty for the schedule.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who asked when not a panel user: cli:USER@HOST (the OS user and host); empty for the schedule.")
    trigger = models.CharField(max_length=10, choices=Trigger.choices, help_text="What started the run.")
    dry_run = models.BooleanField(default=False, help_text="Planned only: nothing was written to the cluster.")
    planned = models.IntegerField(default=0, help_text="Pods whose cost the plan changes (or removes).")
    written = models.IntegerField(
        default=0, help_text="Pods actually patched; not counted yet while the run is writing (the lists say so).")
    unchanged = models.IntegerField(default=0, help_text="Pods that already carried the planned cost.")
    skipped = models.IntegerField(default=0, help_text="Pods left alone (opted out, or cost set by hand).")
    stale = models.IntegerField(default=0,
                                help_text="Pods changed or gone between the snapshot and the write: not written.")
    unwritten = models.IntegerField(
        default=0, help_text="Announced changes the pods did not carry when the run was settled from the cluster: "
                             "all of an interrupted run's (less any its own process then reported written late), "
                             "and writes whose answer was lost.")
    unknown = models.IntegerField(
        default=0, help_text="Writes whose outcome is not known yet: sent, and their answer lost (no answer or a "
                             "server error), so they may have been applied. They stay announced until the next run "
                             "on the cluster (or the beat) settles them from the pods; 0 once settled.")
    over_budget = models.IntegerField(default=0, help_text="Changes left for the next run by the write budget.")
    plan_seconds = models.FloatField(default=0, help_text="Seconds spent computing the plan.")
    formula = models.CharField(max_length=200, blank=True, help_text="The cost formula the run used.")
    changes = models.JSONField(default=list, blank=True,
                               help_text="Pod, node, old and new cost and why (first 1,000 of the run).")
    errors = models.JSONField(default=list, blank=True, help_text="Kubernetes failures while writing.")
    announced = models.JSONField(
        default=list, blank=True,
        help_text="While writing: every change about to be written (pod, uid, old and new cost), saved before the "
                  "first write so that a run whose process dies can be settled from the pods; once finished, only "
                  "the writes whose outcome is not known (until settled). An interrupted run keeps it with what the "
                  "settle found on each pod, until its process (if it was only stalled) answers: its writes that "
                  "landed after the settle are then audited by it, once.")
    marked = models.JSONField(
        default=list, blank=True,
        help_text="The GPU nodes this run marked to be emptied first (capacity/binpack/freed.py says when): each "
                  "node's allocatable GPUs, GPU model, the workloads of its GPU pods and why. Empty for a dry run "
                  "and for a run whose process stopped mid-write. The savings page counts a marked node that "
                  "was then seen free (see binpack node frees).")
    lease_owner = models.CharField(max_length=200, blank=True,
                                   help_text="While writing: the process writing (host:pid:token) or settling it.")
    lease_expires_at = models.DateTimeField(
        null=True, blank=True,
        help_text="While writing: when the writer's lease lapses (renewed while its writes are in flight); past it "
                  "the next run on the cluster, or the beat, settles the run from the pods.")

    class Meta:
        ordering = ["-started_at", "-id"]
        permissions = [("run_binpack", "Can run binpack (write pod-deletion costs) on a cluster")]

    def __str__(self) -> str:
        kind = "dry run" if self.dry_run else "run" if self.state == self.State.DONE else f"{self.state} run"
        return f"binpack {kind} on {self.cluster} at {self.started_at:%Y-%m-%d %H:%M}: {written_describe(self)}"


def written_describe(run: "BinpackRun") -> str:
    """How many of a run's costs were written, as far as is known: while it writes its counts
    are not kept yet (its row says only what it announced)."""
    if run.dry_run:
        return f"none (dry run of {run.planned})"
    if run.state == BinpackRun.State.WRITING:
        return f"writing: {run.planned} change(s) announced, counts not final"
    pending = f", {run.unknown} outcome(s) unknown (to be settled by the next run)" if run.unknown else ""
    if run.state == BinpackRun.State.INTERRUPTED:
        return (f"{run.written} of {run.written + run.unwritten + run.unknown} announced (interrupted, settled from "
                f"the cluster){pending}")
    return f"{run.written} of {run.planned}{pending}"


def settled_describe(run: "BinpackRun") -> str:
    """What the command and the admin say of an earlier run they settled: interrupted, or
    with writes whose answer was lost (`lost_answers_settled`, set by the settle: how many
    of them it found written, and of how many)."""
    started = f"run {run.pk} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z})"
    lost = getattr(run, "lost_answers_settled", None)
    if lost is not None:
        found, of = lost
        return (f"{started} had {of} write(s) whose answer was lost, settled now from the pods: {found} found "
                f"written and audited, {of - found} not written")
    return (f"{started} was interrupted mid-write and settled now: {run.written} of {run.written + run.unwritten} "
            f"announced cost(s) found written and audited, {run.unwritten} not written")


class BinpackNodeFreed(models.Model):
    """A GPU node a binpack run marked to be emptied first, seen free afterwards: with no
    live pod asking for GPUs, or gone from the cluster. Written by the periodic check
    (`binpack_freed_nodes_check`) from one reading of the cluster at a time; the savings
    page counts its GPUs from `freed_at` until `ended_at` (or now) under binpack."""

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="binpack_nodes_freed",
                                help_text="The cluster of the node.")
    run = models.ForeignKey(BinpackRun, on_delete=models.PROTECT, related_name="nodes_freed",
                            help_text="The run (one that wrote) whose mark of the node was its latest before it "
                                      "was seen free.")
    node = models.CharField(max_length=253, help_text="The node's name.")
    marked_at = models.DateTimeField(help_text="When the run read the cluster and marked the node.")
    gpus = models.IntegerField(help_text="The node's allocatable GPUs when marked: what its freedom counts.")
    gpu_model = models.CharField(max_length=63, blank=True,
                                 help_text="The node's label nvidia.com/gpu.product when marked (empty: unlabelled).")
    workloads = models.JSONField(default=list, blank=True,
                                 help_text="The workloads of its GPU pods when marked. Each must still run pods for "
                                           "the node's freedom to be binpack's.")
    freed_at = models.DateTimeField(db_index=True,
                                    help_text="The first reading that showed the node free (no GPU pod, or gone).")
    removed_at = models.DateTimeField(null=True, blank=True,
                                      help_text="The first reading that showed the node gone from the cluster.")
    last_seen_free_at = models.DateTimeField(help_text="The latest reading that showed the node free.")
    ended_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="Where its count stops: the last reading that showed it free, before one showed it holding a GPU "
                  "pod again or a workload that held it gone to zero pods. Empty: free now.")
    end_reason = models.CharField(max_length=500, blank=True, help_text="Why its count stopped.")

    class Meta:
        ordering = ["-freed_at", "-id"]
        verbose_name = "binpack node freed"
        verbose_name_plural = "binpack nodes freed"
        constraints = [models.UniqueConstraint(fields=["run", "node"], name="binpack_node_freed_once_per_mark")]

    def __str__(self) -> str:
        until = f"until {self.ended_at:%Y-%m-%d %H:%M}" if self.ended_at else "free now"
        return f"{self.node} ({self.gpus} GPUs) freed after binpack run #{self.run_id}, {self.freed_at:%Y-%m-%d %H:%M} {until}"


class BinpackCluster(Cluster):
    """The cluster registry as the binpack admin shows it: where "run binpack now" lives."""

    class Meta:
        proxy = True
        verbose_name = "cluster (binpack)"
        verbose_name_plural = "clusters (binpack)"
