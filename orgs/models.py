"""Orgs, their dormancy switches and holds, and the activity API's callers (their audit entries live in the audit app)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from config import clock
from config.records import Retirable
from config.actors import actor_label_current
from orgs.planning import Hold


class ScaleToZero(models.TextChoices):
    ENABLED = "enabled", "enabled (min-scale 0)"
    DISABLED = "disabled", "disabled (min-scale ≥ 1)"


class Org(Retirable):
    slug = models.SlugField(max_length=63, help_text="The org's short name, as in capacity.io/org=SLUG (unique "
                                                     "among the orgs in service; a retired org keeps its slug).")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="orgs",
                                help_text="The cluster the org's namespace lives in.")
    namespace = models.CharField(max_length=63, help_text="Kubernetes namespace of the org's pynodes and models.")
    # An org is registered active (not dormant at birth), however it is created: the sweep
    # reads only orgs with a time, so one without would never turn dormant.
    last_activity_at = models.DateTimeField(null=True, blank=True, db_index=True, default=clock.now,
                                            help_text="Latest recorded activity (throttled: ±1 window); "
                                                      "the registration time until the first.")
    scale_to_zero_allowed = models.BooleanField(
        default=True, help_text="May the org's workloads scale to zero when dormant? Off for protected orgs.")
    dormant = models.BooleanField(default=False, help_text="No activity for the dormancy period.")
    dormant_since = models.DateTimeField(null=True, blank=True, help_text="When the org last turned dormant.")
    applied = models.CharField(max_length=10, choices=ScaleToZero.choices, blank=True,
                               help_text="The scale-to-zero setting last seen holding on every workload.")
    drift = models.JSONField(default=list, blank=True,
                             help_text="Workloads found not holding the wanted setting at the last reconcile.")
    pending = models.JSONField(
        default=list, db_default=[], blank=True,
        help_text="What did not take the wanted setting at the last apply (a partial apply), and why; "
                  "retried every minute until empty.")
    pending_since = models.DateTimeField(
        null=True, blank=True,
        help_text="When the apply that left `pending` non-empty was made (the first of a run of partial applies); "
                  "empty once an apply completes.")
    last_error = models.TextField(blank=True, help_text="The last Kubernetes failure while applying the setting.")
    reconciled_at = models.DateTimeField(null=True, blank=True, help_text="When the setting was last checked.")
    mechanism = models.CharField(max_length=120, blank=True,
                                 help_text="How models are switched on this cluster (by Knative version; "
                                           "the cluster page says why).")
    exempt = models.BooleanField(
        default=False, db_default=False,
        help_text="Exempt from dormancy and pruning until an operator ends it: the sweep never marks the org "
                  "dormant and the pruner skips its workloads.")
    snoozed_until = models.DateTimeField(
        null=True, blank=True,
        help_text="Dormancy and pruning snoozed until this time: until then the org is treated as exempt; "
                  "afterwards the snooze simply stops applying.")
    exemption_reason = models.CharField(max_length=200, blank=True, db_default="",
                                        help_text="Why the org is exempt or snoozed (the operator's words).")
    created_at = models.DateTimeField(auto_now_add=True, help_text="When the org was registered.")

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "namespace"], condition=models.Q(retired_at__isnull=True),
                                    name="orgs_org_one_org_per_namespace",
                                    violation_error_message="An org in service already has this namespace on this "
                                                            "cluster."),
            models.UniqueConstraint(fields=["slug"], condition=models.Q(retired_at__isnull=True),
                                    name="orgs_org_one_in_service_per_slug",
                                    violation_error_message="An org in service already has this slug."),
        ]
        indexes = [models.Index(fields=["dormant", "scale_to_zero_allowed", "last_activity_at"],
                                name="orgs_org_sweep")]
        permissions = [
            ("disallow_scale_to_zero", "Can disallow scale to zero for an org (and revert it now)"),
            ("allow_scale_to_zero", "Can allow scale to zero for an org"),
            ("mark_active", "Can mark an org active now"),
            ("run_dormancy_sweep", "Can run the dormancy sweep now"),
            ("record_activity", "Can record activity through the API"),
            ("exempt", "Can exempt or snooze an org or one of its workloads from dormancy and pruning"),
        ]

    def __str__(self) -> str:
        return f"{self.slug} (retired)" if self.retired else self.slug

    @property
    def wanted(self) -> str:
        """The setting the org's workloads should hold: enabled only when dormant and allowed."""
        return ScaleToZero.ENABLED if (self.dormant and self.scale_to_zero_allowed) else ScaleToZero.DISABLED

    def hold(self) -> Hold | None:
        """The org's own exemption or snooze as a planning value (None: neither was set)."""
        if self.exempt:
            return Hold(until=None, reason=self.exemption_reason)
        if self.snoozed_until is not None:
            return Hold(until=self.snoozed_until, reason=self.exemption_reason)
        return None


class WorkloadExemption(models.Model):
    """One model or pynode of an org kept out of dormancy's scale to zero and out of the
    pruner: for good (no `until`) or snoozed until a time, after which it simply stops applying."""

    class Kind(models.TextChoices):
        MODEL = "inferenceservice", "model (InferenceService)"
        PYNODE = "pynode", "pynode (Knative Service)"

    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="exemptions",
                            help_text="The org whose namespace holds the workload.")
    kind = models.CharField(max_length=20, choices=Kind.choices, help_text="Which kind of workload.")
    name = models.CharField(max_length=253, help_text="The workload's name in the org's namespace.")
    until = models.DateTimeField(null=True, blank=True,
                                 help_text="Snoozed until this time; empty: exempt until an operator removes it.")
    reason = models.CharField(max_length=200, help_text="Why (the operator's words).")
    created_at = models.DateTimeField(help_text="When it was set.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="The operator who set it.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who set it when not a panel user: cli:USER@HOST (the OS user and host).")

    class Meta:
        ordering = ["org__slug", "kind", "name"]
        constraints = [models.UniqueConstraint(fields=["org", "kind", "name"], name="orgs_one_exemption_per_workload")]

    def __str__(self) -> str:
        return f"{self.org}/{self.name} ({self.kind})"

    def hold(self) -> Hold:
        return Hold(until=self.until, reason=self.reason)


class DormancySwitch(models.Model):
    class Direction(models.TextChoices):
        TO_DORMANT = "dormant", "became dormant"
        TO_ACTIVE = "active", "became active"

    class Cause(models.TextChoices):
        SWEEP = "sweep", "dormancy sweep"
        ACTIVITY = "activity", "activity"
        ADMIN = "admin", "operator"

    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="switches", help_text="The org that switched.")
    at = models.DateTimeField(db_index=True, help_text="When the switch happened.")
    direction = models.CharField(max_length=8, choices=Direction.choices, help_text="Which way it switched.")
    cause = models.CharField(max_length=8, choices=Cause.choices, help_text="What made it switch.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The operator, or empty for the schedule/product.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who made it switch when not a panel user: cli:USER@HOST (the OS user and host), or token:CALLER for the "
                  "activity API; empty for the schedule.")
    patched = models.JSONField(default=list, blank=True,
                               help_text="Workloads patched to apply the switch (kind/namespace/name: old → new).")
    errors = models.JSONField(default=list, blank=True, help_text="Kubernetes failures while applying it.")
    applied_at = models.DateTimeField(null=True, blank=True, help_text="When the cluster held the new setting.")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "dormancy switches"

    def __str__(self) -> str:
        return f"{self.org} {self.direction} at {self.at:%Y-%m-%d %H:%M %Z}"


class ActivityToken(models.Model):
    """A bearer token for one caller of the activity API. Only its SHA-256 is stored."""

    caller = models.CharField(max_length=100, unique=True, help_text="Who uses the token (a service name).")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token, hex.")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                             help_text="The account the caller acts as; needs 'record activity' permission.")
    active = models.BooleanField(default=True, help_text="Revoked tokens are refused with 401.")
    created_at = models.DateTimeField(auto_now_add=True, help_text="When the token was issued.")

    def __str__(self) -> str:
        return self.caller
