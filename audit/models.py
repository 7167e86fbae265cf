"""The one audit trail: every change the product makes to a customer's workload, an org or
a node, with who asked (actor), why (cause), what it was done to (target) and the values
before and after. Each app writes it through `audit.services.audit`; the rows name the
app's own record they belong to by `subject_type` + `subject_id` (e.g. "defrag_job", 7),
so this app imports no other app's models."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from config.actors import actor_label_current


class AuditEntry(models.Model):
    at = models.DateTimeField(db_index=True, help_text="When it was done (the injected clock).")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The panel user who asked; empty for a command, a "
                                                          "token, a worker or the schedule.")
    actor_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Who asked when not a panel user: cli:USER@HOST (the OS user and host), or token:CALLER; empty for a worker "
                  "or the schedule.")
    app = models.CharField(max_length=30, db_index=True, help_text="The part of the product that acted: orgs, "
                                                                    "defrag, runbook, pruning, binpack.")
    action = models.CharField(max_length=60, db_index=True, help_text="What was done, e.g. node_cordon, "
                                                                       "scale_to_zero_applied.")
    cause = models.CharField(max_length=200, blank=True, default="", db_default="",
                             help_text="Why it was done, where the action alone does not say.")
    target = models.CharField(max_length=300, blank=True, default="", db_default="",
                              help_text="What it was done to (Node/name, Pod ns/name, Org/slug).")
    cluster = models.ForeignKey("clusters.Cluster", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="+", help_text="The cluster acted on, if one.")
    org = models.ForeignKey("orgs.Org", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                            help_text="The org it was done to, if one.")
    subject_type = models.CharField(max_length=40, blank=True, default="", db_default="",
                                    help_text="The kind of record the entry belongs to (defrag_job, runbook_action…).")
    subject_id = models.BigIntegerField(null=True, blank=True, help_text="That record's id.")
    old = models.JSONField(default=dict, blank=True, help_text="The values before.")
    new = models.JSONField(default=dict, blank=True, help_text="The values after.")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["subject_type", "subject_id"], name="audit_entry_subject")]

    def __str__(self) -> str:
        by = self.actor or self.actor_label or "system"
        return f"{self.action} {self.target} by {by} at {self.at:%Y-%m-%d %H:%M %Z}".replace("  ", " ")
