from django.contrib import admin

from clusters.models import Cluster


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "kubeconfig_path", "kube_context", "in_cluster", "prometheus_url",
                    "knative_version", "kserve_version", "from_environment")
    readonly_fields = ("knative_version", "kserve_version", "versions_seen_at", "from_environment", "created_at")
    search_fields = ("name",)
