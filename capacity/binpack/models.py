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
    "untried": "not written, not tried: the cluster had stopped answering",
    "lease-lost": "not written, not tried: the run's lease lapsed while it wrote (taken to be settled as interrupted)",
    # A run's changes are recorded "announced" before its first write; a run whose process
    # died mid-write keeps them so until the next run (or the beat) settles it from the pods.
    "announced": "announced, outcome not known yet: the run is writing (or its process stopped)",
    "settled-written": "written (its run was interrupted; found on the pod and recorded later)",
    "settled-not-written": "not written: its run was interrupted and the pod does not carry the cost",
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

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="binpack_runs",
                                help_text="The cluster whose pods were costed.")
    started_at = models.DateTimeField(db_index=True, help_text="When the snapshot was taken (the injected clock).")
    finished_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the last write returned; for an interrupted run, when it was settled from the cluster.")
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.DONE,
        help_text="writing: announced before its first write, outcome not recorded yet; done: finished and "
                  "audited by its own process; interrupted: its process stopped mid-write and a later run (or the "
                  "beat) recorded what the pods carry.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The operator who asked; empty for the schedule.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who asked when not a panel user: cli:<os user>@<host>; empty for the schedule.")
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
        default=0, help_text="Interrupted runs only: announced changes the pods did not carry when it was settled "
                             "(less any its own process then reported written late).")
    over_budget = models.IntegerField(default=0, help_text="Changes left for the next run by the write budget.")
    plan_seconds = models.FloatField(default=0, help_text="Seconds spent computing the plan.")
    formula = models.CharField(max_length=200, blank=True, help_text="The cost formula the run used.")
    changes = models.JSONField(default=list, blank=True,
                               help_text="Pod, node, old and new cost and why (first 1,000 of the run).")
    errors = models.JSONField(default=list, blank=True, help_text="Kubernetes failures while writing.")
    announced = models.JSONField(
        default=list, blank=True,
        help_text="While writing: every change about to be written (pod, uid, old and new cost), saved before the "
                  "first write so that a run whose process dies can be settled from the pods; emptied once finished. "
                  "An interrupted run keeps it with what the settle found on each pod, until its process (if it was "
                  "only stalled) answers: its writes that landed after the settle are then audited by it, once.")
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
    if run.state == BinpackRun.State.INTERRUPTED:
        return f"{run.written} of {run.written + run.unwritten} announced (interrupted, settled from the cluster)"
    return f"{run.written} of {run.planned}"


def settled_describe(run: "BinpackRun") -> str:
    """What the command and the admin say of an earlier run found interrupted and settled."""
    return (f"run {run.pk} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z}) was interrupted mid-write and settled "
            f"now: {run.written} of {run.written + run.unwritten} announced cost(s) found written and audited, "
            f"{run.unwritten} not written")


class BinpackCluster(Cluster):
    """The cluster registry as the binpack admin shows it: where "run binpack now" lives."""

    class Meta:
        proxy = True
        verbose_name = "cluster (binpack)"
        verbose_name_plural = "clusters (binpack)"
