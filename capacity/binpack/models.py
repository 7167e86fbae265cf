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
}


class BinpackRun(models.Model):
    class Trigger(models.TextChoices):
        SCHEDULE = "schedule", "beat schedule"
        ADMIN = "admin", "admin action"
        COMMAND = "command", "management command"

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="binpack_runs",
                                help_text="The cluster whose pods were costed.")
    started_at = models.DateTimeField(db_index=True, help_text="When the snapshot was taken (the injected clock).")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When the last write returned.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The operator who asked; empty for the schedule.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who asked when not a panel user: cli:<os user>@<host>; empty for the schedule.")
    trigger = models.CharField(max_length=10, choices=Trigger.choices, help_text="What started the run.")
    dry_run = models.BooleanField(default=False, help_text="Planned only: nothing was written to the cluster.")
    planned = models.IntegerField(default=0, help_text="Pods whose cost the plan changes (or removes).")
    written = models.IntegerField(default=0, help_text="Pods actually patched.")
    unchanged = models.IntegerField(default=0, help_text="Pods that already carried the planned cost.")
    skipped = models.IntegerField(default=0, help_text="Pods left alone (opted out, or cost set by hand).")
    stale = models.IntegerField(default=0,
                                help_text="Pods changed or gone between the snapshot and the write: not written.")
    over_budget = models.IntegerField(default=0, help_text="Changes left for the next run by the write budget.")
    plan_seconds = models.FloatField(default=0, help_text="Seconds spent computing the plan.")
    formula = models.CharField(max_length=200, blank=True, help_text="The cost formula the run used.")
    changes = models.JSONField(default=list, blank=True,
                               help_text="Pod, node, old and new cost and why (first 1,000 of the run).")
    errors = models.JSONField(default=list, blank=True, help_text="Kubernetes failures while writing.")

    class Meta:
        ordering = ["-started_at", "-id"]
        permissions = [("run_binpack", "Can run binpack (write pod-deletion costs) on a cluster")]

    def __str__(self) -> str:
        kind = "dry run" if self.dry_run else "run"
        return f"binpack {kind} on {self.cluster} at {self.started_at:%Y-%m-%d %H:%M}: {self.written}/{self.planned}"


class BinpackCluster(Cluster):
    """The cluster registry as the binpack admin shows it: where "run binpack now" lives."""

    class Meta:
        proxy = True
        verbose_name = "cluster (binpack)"
        verbose_name_plural = "clusters (binpack)"
