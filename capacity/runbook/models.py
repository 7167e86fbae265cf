"""The model-serving runbook: the model registry synced from the cluster,
per-model resource specs, and the audit of every runbook action."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class ServedModel(models.Model):
    class Kind(models.TextChoices):
        INFERENCE_SERVICE = "InferenceService", "KServe InferenceService"
        PYNODE = "pynode", "pynode (Knative Service)"

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="served_models",
                                help_text="The cluster it runs on.")
    namespace = models.CharField(max_length=63, help_text="Kubernetes namespace.")
    name = models.CharField(max_length=253, help_text="InferenceService (or pynode Knative Service) name.")
    kind = models.CharField(max_length=20, choices=Kind.choices, help_text="What serves it.")
    model = models.CharField(max_length=253, db_index=True,
                             help_text="The model this is a version of (label capacity.io/model, else its name); "
                                       "a resource spec applies to every deployed version.")
    framework = models.CharField(max_length=60, blank=True,
                                 help_text="Model format (vllm, pytorch, sklearn…): picks the resource defaults.")
    org = models.ForeignKey("orgs.Org", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            help_text="The org it belongs to (label capacity.io/org of it or its namespace).")
    org_slug = models.CharField(max_length=63, blank=True, help_text="The org label as found on the cluster.")
    knative_service = models.CharField(max_length=253, blank=True, help_text="Its Knative Service.")
    uid = models.CharField(max_length=64, blank=True, help_text="Kubernetes UID; deletes are guarded by it.")
    ready = models.BooleanField(default=False, help_text="Ready condition at the last sync.")
    revisions = models.JSONField(default=list, blank=True,
                                 help_text="Knative revisions at the last sync: name, ready, pods running/pending, "
                                           "GPUs held, pods Pending for lack of GPUs.")
    gpus_held = models.IntegerField(default=0, help_text="GPUs its pods hold, all revisions together.")
    blocked = models.JSONField(default=list, blank=True,
                               help_text="Older revisions holding GPUs while the newest waits for GPUs "
                                         "(candidates for 'delete the old revision').")
    synced_at = models.DateTimeField(null=True, blank=True, help_text="When the registry last saw it.")
    gone = models.BooleanField(default=False, help_text="No longer on the cluster at the last sync.")

    class Meta:
        ordering = ["namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "namespace", "name", "kind"],
                                               name="capacity_one_served_model")]
        permissions = [
            ("redeploy_servedmodel", "Can redeploy a model (new revision, no other change)"),
            ("delete_old_revision", "Can delete an old revision to unblock a Pending one (not graceful)"),
            ("delete_stuck_model", "Can delete a model stuck deploying and what it left behind"),
            ("sync_servedmodel", "Can sync the model registry from the cluster"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ResourceSpec(models.Model):
    """An override of the framework defaults for one model; saving one redeploys every
    deployed version of the model with it (what the runbook calls an OracleDeploymentSpec)."""

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+",
                                help_text="The cluster the model runs on.")
    model = models.CharField(max_length=253, help_text="Model name, as in the registry's 'model' column.")
    gpu_count = models.PositiveIntegerField(null=True, blank=True,
                                            help_text="GPUs per pod (nvidia.com/gpu); empty = framework default.")
    gpu_product = models.CharField(max_length=100, blank=True,
                                   help_text="GPU product node label value, e.g. 'NVIDIA A100-SXM4-80GB'; "
                                             "empty = framework default.")
    cpu_request = models.CharField(max_length=20, blank=True, help_text="CPU request, e.g. '4' or '500m'.")
    cpu_limit = models.CharField(max_length=20, blank=True, help_text="CPU limit.")
    memory_request = models.CharField(max_length=20, blank=True, help_text="Memory request, e.g. '32Gi'.")
    memory_limit = models.CharField(max_length=20, blank=True, help_text="Memory limit.")
    created_at = models.DateTimeField(help_text="When it was saved (the injected clock).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="The operator who saved it.")
    applied = models.JSONField(default=list, blank=True,
                               help_text="The InferenceServices patched with it, and any failure.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"resources of {self.model} ({self.created_at:%Y-%m-%d %H:%M})"

    def override(self) -> dict:
        return {"gpu_count": self.gpu_count, "gpu_product": self.gpu_product, "cpu_request": self.cpu_request,
                "cpu_limit": self.cpu_limit, "memory_request": self.memory_request,
                "memory_limit": self.memory_limit}


class RunbookAction(models.Model):
    """One runbook action on a cluster, announced before it is sent: the row is committed
    `acting` with the target, its before-state and the planned value (the redeploy stamp,
    the revision's uid) before the Kubernetes write, then moved to `done` or `failed` by
    a compare-and-set. A row left `acting` by a worker that died holds a lapsed lease; the
    registry sync settles it from what the cluster really shows. The settled outcome is
    written once to the audit trail (subject "runbook_action")."""

    class State(models.TextChoices):
        ACTING = "acting", "acting (announced; the cluster write may be under way)"
        DONE = "done", "done"
        FAILED = "failed", "failed (not done)"

    at = models.DateTimeField(db_index=True, help_text="When it was asked for and announced (the injected clock).")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+", help_text="The operator who asked.")
    cluster = models.ForeignKey("clusters.Cluster", null=True, on_delete=models.PROTECT, related_name="+",
                                help_text="The cluster acted on.")
    action = models.CharField(max_length=40, help_text="resource_spec_apply, model_redeploy, "
                                                       "revision_delete_old, model_delete_stuck.")
    target = models.CharField(max_length=300, help_text="What it was done to (namespace/name).")
    served_model = models.ForeignKey(ServedModel, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="runbook_actions",
                                     help_text="The registry's model it was done to (shown beside it in the list).")
    old = models.JSONField(default=dict, blank=True, help_text="The values before.")
    new = models.JSONField(default=dict, blank=True,
                           help_text="While acting: the planned value (redeploy stamp, uid to delete). Once done: "
                                     "the values after, or what was deleted.")
    state = models.CharField(max_length=10, choices=State.choices,
                             help_text="acting: announced and maybe under way; done: the cluster shows it; failed: "
                                       "it was not done (see error).")
    error = models.TextField(blank=True, help_text="Why it failed, or how its outcome was learned when the worker "
                                                   "that sent it could not tell (settled from the cluster).")
    acting_owner = models.CharField(max_length=200, blank=True,
                                    help_text="The process carrying it out while acting (host:pid:nonce); "
                                              "empty once settled.")
    acting_expires_at = models.DateTimeField(null=True, blank=True,
                                             help_text="While acting: when its owner's lease lapses and the registry "
                                                       "sync may settle it from the cluster.")
    settled_at = models.DateTimeField(null=True, blank=True, help_text="When it became done or failed.")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.action} {self.target} by {self.actor or 'system'} ({self.state})"
