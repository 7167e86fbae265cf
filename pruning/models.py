"""What each prune run looked at and did, and what a restore needs to undo it."""
from __future__ import annotations

from django.db import models

POD_NAMES_KEPT = 50  # pod names listed on one shared skip row


class PruneRun(models.Model):
    class Mode(models.TextChoices):
        DRY_RUN = "dry-run", "dry run (nothing changed)"
        SCALE_DOWN = "scale-down", "scale down"

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        PARTIAL = "partial", "some actions failed"
        FAILED = "failed", "failed"

    cluster = models.ForeignKey("clusters.Cluster", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="prune_runs", help_text="The cluster this run looked at.")
    actor = models.CharField(max_length=150, blank=True,
                             help_text="Who started the run: a user name, the command's cli:USER@HOST (the OS user and host), or "
                                       "empty for the schedule.")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.DRY_RUN,
                            help_text="Dry run decides and records only; scale down acts on the cluster.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING,
                              help_text="Outcome of the run as a whole.")
    evaluated_at = models.DateTimeField(help_text="The 'now' of the run: the query's evaluation time "
                                                  "and the reference for pod ages.")
    started_at = models.DateTimeField(auto_now_add=True, help_text="Wall-clock start of the run.")
    duration_seconds = models.FloatField(null=True, blank=True, help_text="Wall-clock length of the run.")
    parameters = models.JSONField(default=dict, blank=True,
                                  help_text="Window, threshold, grace, filters, cap, label scheme…")
    query = models.TextField(blank=True, help_text="The PromQL queries the run sent (the candidates and the census, then the follow-up about the candidates).")
    pods_seen = models.PositiveIntegerField(default=0, help_text="GPU pods reporting to Prometheus at the evaluation time, and any idle candidate that no longer does.")
    busy_pods = models.PositiveIntegerField(default=0, help_text="Pods with a GPU at or above the threshold.")
    idle_candidates = models.PositiveIntegerField(
        default=0, help_text="Pods whose GPUs all stayed under the threshold (one decision each).")
    planned = models.PositiveIntegerField(default=0, help_text="Owners the plan chose to scale to zero.")
    acted = models.PositiveIntegerField(default=0, help_text="Owners actually scaled to zero.")
    failed = models.PositiveIntegerField(default=0, help_text="Actions that failed.")
    kube_api_calls = models.PositiveIntegerField(default=0, help_text="Kubernetes API requests this run made.")
    errors = models.JSONField(default=list, blank=True, help_text="Errors met, one text each.")
    notes = models.JSONField(default=list, blank=True,
                             help_text="What the run found that is no error, one text each: e.g. whether the new "
                                       "revision of a Knative Service it sets to min-scale 0 starts a pod, and why "
                                       "(knative-serving/config-autoscaler allows a zero initial scale, does not, or "
                                       "could not be read).")
    skip_counts = models.JSONField(default=dict, blank=True,
                                   help_text="Pods skipped per reason ({reason: pods}); kept after the skip "
                                             "rows themselves expire (PRUNER_SKIP_RETENTION_DAYS).")
    lease_owner = models.CharField(max_length=200, blank=True,
                                   help_text="The worker (host:pid:token) or reconcile that owns the running run.")
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="The owner renews this while it works (at most a minute ahead); a running run whose "
                  "lease has expired lost its worker and is reconciled from the cluster by the beat.")

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"prune run {self.pk} ({self.mode}, {self.evaluated_at:%Y-%m-%d %H:%M})"


class PruneDecision(models.Model):
    class Decision(models.TextChoices):
        PRUNE = "prune", "prune"
        SKIP = "skip", "skip"

    class Result(models.TextChoices):
        NONE = "", "no action (skipped)"
        DRY_RUN = "dry-run", "would act (dry run)"
        ACTING = "acting", "acting (before-state recorded, write sent or about to be)"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"

    class Restore(models.TextChoices):
        NONE = "", "not restored"
        RESTORED = "restored", "restored"
        CHANGED = "changed", "not restored: changed since the prune"
        FAILED = "failed", "restore failed"

    run = models.ForeignKey(PruneRun, on_delete=models.PROTECT, related_name="decisions",
                            help_text="The run that made this decision.")
    namespace = models.CharField(max_length=253, db_index=True, help_text="The pod's namespace.")
    pod = models.CharField(max_length=253, help_text="The pod whose GPUs looked idle (the first one, when the "
                                                     "row stands for several skipped pods).")
    count = models.PositiveIntegerField(default=1, help_text="Pods this row stands for: skipped pods of one run "
                                                             "with the same reason and owner share one row.")
    pods = models.JSONField(default=list, blank=True,
                            help_text=f"Names of the pods a shared skip row stands for (at most {POD_NAMES_KEPT}).")
    owner_kind = models.CharField(max_length=64, blank=True, help_text="Kind of the object acted on.")
    owner_api_version = models.CharField(max_length=128, blank=True, help_text="Its apiVersion.")
    owner_name = models.CharField(max_length=253, blank=True, help_text="Name of the object acted on.")
    owner_uid = models.CharField(max_length=64, blank=True, help_text="Its UID when the run saw it.")
    gpus = models.JSONField(default=list, blank=True, help_text="GPU UUIDs of the pod seen in the data.")
    max_utilization = models.FloatField(null=True, blank=True,
                                        help_text="Highest utilization (0–1) of any of its GPUs in the window.")
    decision = models.CharField(max_length=8, choices=Decision.choices, help_text="Prune or skip.")
    reason = models.CharField(max_length=64, db_index=True,
                              help_text="Why: 'idle', or the rule that kept it (too-young, opted-out…).")
    method = models.CharField(max_length=32, blank=True,
                              help_text="How the owner is scaled to zero: scale, notebook-stop, kserve-stop, "
                                        "kserve-min-replicas, knative-min-scale.")
    effect = models.TextField(blank=True,
                              help_text="What the action does to the owner (in a dry run: would do), as operators "
                                        "read it; for a Knative Service whether its new revision starts a pod, and "
                                        "why. Empty on skips and on rows recorded before it was kept.")
    result = models.CharField(max_length=16, choices=Result.choices, blank=True, default="",
                              help_text="What happened when acting.")
    error = models.TextField(blank=True, help_text="The failure, when the action or its Event failed.")
    event_sent = models.BooleanField(default=False, help_text="A Kubernetes Event was recorded on the owner.")
    restore_state = models.JSONField(null=True, blank=True,
                                     help_text="What the action took away (e.g. replicas, minReplicas, annotations); "
                                               "null = absent. Restore puts exactly this back.")
    applied_state = models.JSONField(null=True, blank=True, help_text="What the action set.")
    acted_at = models.DateTimeField(null=True, blank=True, help_text="When the action succeeded.")
    restore = models.CharField(max_length=16, choices=Restore.choices, blank=True, default="",
                               help_text="Outcome of a restore.")
    restored_at = models.DateTimeField(null=True, blank=True, help_text="When it was restored.")
    restored_by = models.CharField(max_length=150, blank=True, help_text="Who restored it.")

    class Meta:
        ordering = ["run_id", "namespace", "pod"]
        indexes = [models.Index(fields=["owner_kind", "owner_name"])]

    def __str__(self) -> str:
        return f"{self.decision} {self.namespace}/{self.pod}: {self.reason}"

    @property
    def restorable(self) -> bool:
        # An `acting` row may have changed the owner (its worker died after the write):
        # restore first settles it from the cluster, then undoes it if it acted.
        return (self.result in (self.Result.SUCCEEDED, self.Result.ACTING)
                and self.restore != self.Restore.RESTORED)
