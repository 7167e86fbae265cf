"""The cluster registry: where each cluster's API and Prometheus are. No secrets here."""
from __future__ import annotations

from django.db import models

from config.records import Retirable


class Cluster(Retirable):
    name = models.SlugField(max_length=63,
                            help_text="Short name every operation uses to name its cluster (unique among the "
                                      "clusters in service; a retired cluster keeps its name).")
    kubeconfig_path = models.CharField(max_length=500, blank=True,
                                       help_text="Path to a kubeconfig file on the control plane's hosts.")
    kube_context = models.CharField(max_length=200, blank=True,
                                    help_text="Context in the kubeconfig; empty = its current context.")
    in_cluster = models.BooleanField(default=False,
                                     help_text="Use the pod's service account instead of a kubeconfig.")
    prometheus_url = models.URLField(blank=True, help_text="Base URL of the cluster's Prometheus.")
    prometheus_token_env = models.CharField(
        max_length=100, blank=True,
        help_text="NAME of the environment variable holding the Prometheus bearer token (never the token).")
    prometheus_verify_tls = models.BooleanField(default=True, help_text="Verify Prometheus' TLS certificate.")
    prometheus_ca_bundle = models.CharField(max_length=500, blank=True,
                                            help_text="Path to a CA bundle for Prometheus' certificate.")
    knative_version = models.CharField(
        max_length=40, blank=True,
        help_text="Knative Serving version last seen (label app.kubernetes.io/version of knative-serving).")
    kserve_version = models.CharField(max_length=40, blank=True,
                                      help_text="KServe version last seen (label of the kserve namespace).")
    versions_seen_at = models.DateTimeField(null=True, blank=True,
                                            help_text="When the versions above were read.")
    api_groups = models.JSONField(
        default=dict, blank=True,
        help_text="The API groups the product acts on that the cluster serves, with their versions "
                  "(discovery GET /apis); a group not listed means no such workloads on this cluster.")
    api_groups_seen_at = models.DateTimeField(null=True, blank=True,
                                              help_text="When discovery was last read successfully.")
    api_groups_error = models.TextField(blank=True, help_text="The last failure reading discovery, if any.")
    knative_lever = models.CharField(
        max_length=40, blank=True,
        help_text="How scale to zero switches models on this cluster: the PodAutoscaler annotation "
                  "(replaces no pod) or the Revision annotation (restarts the model's pods).")
    knative_lever_reason = models.TextField(blank=True, help_text="The evidence the lever was chosen by.")
    from_environment = models.BooleanField(
        default=False, help_text="Managed from the environment (KUBECONFIG…); edits are overwritten.")
    created_at = models.DateTimeField(auto_now_add=True, help_text="When the row was created.")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(
            fields=["name"], condition=models.Q(retired_at__isnull=True), name="clusters_one_in_service_per_name",
            violation_error_message="A cluster in service already has this name.")]

    def __str__(self) -> str:
        return f"{self.name} (retired)" if self.retired else self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if not self.in_cluster and not self.kubeconfig_path:
            raise ValidationError({"kubeconfig_path": "Give a kubeconfig path, or tick in-cluster."})
        if self.in_cluster and self.kubeconfig_path:
            raise ValidationError({"in_cluster": "In-cluster and a kubeconfig path exclude each other."})
