from django.contrib import admin

from clusters.models import Cluster
from config.admin_display import JsonAsTablesMixin
from config.admin_lookups import ListFiltersCheckedMixin


@admin.register(Cluster)
class ClusterAdmin(ListFiltersCheckedMixin, JsonAsTablesMixin, admin.ModelAdmin):
    list_display = ("name", "kubeconfig_path", "kube_context", "in_cluster", "prometheus_url",
                    "knative_version", "knative_lever", "kserve_version", "from_environment")
    readonly_fields = ("knative_version", "knative_lever", "knative_lever_reason", "kserve_version",
                       "versions_seen_at", "served_api_groups", "api_groups_seen_at", "api_groups_error",
                       "from_environment", "created_at")
    exclude = ("api_groups",)

    @admin.display(description="API groups the product acts on")
    def served_api_groups(self, cluster: Cluster) -> str:
        from clusters.discovery import GROUPS

        if cluster.api_groups_seen_at is None:
            return "not read yet"
        served = cluster.api_groups or {}
        return "; ".join(f"{label}: {'served (' + ', '.join(served[g]) + ')' if g in served else 'not served'}"
                         for g, label in GROUPS.items())
    search_fields = ("name",)
