from django import forms
from django.contrib import admin

from clusters import services
from clusters.models import Cluster
from config.admin_display import JsonAsTablesMixin
from config.admin_lookups import ListFiltersCheckedMixin
from config.admin_records import RetireInsteadOfDeleteMixin


class ClusterForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = "__all__"

    def clean_name(self):
        # The uniqueness among clusters in service is a conditional constraint on a column the
        # form does not show (retired_at), which Django's form validation skips: checked here.
        name = self.cleaned_data["name"]
        if Cluster.objects.filter(name=name).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError("A cluster in service already has this name.")
        return name


def _cluster_retire(*, obj: Cluster, actor, now) -> str:
    orgs = services.cluster_retire(cluster=obj, actor=actor, now=now)
    return f"{obj.name}: retired" + (f", with its org(s) {', '.join(orgs)}" if orgs else "") + \
        " (kept with its history; no periodic job or list that acts reaches it any more)"


def _cluster_delete(*, obj: Cluster, actor, now) -> None:
    services.cluster_delete(cluster=obj, actor=actor, now=now)


@admin.register(Cluster)
class ClusterAdmin(RetireInsteadOfDeleteMixin, ListFiltersCheckedMixin, JsonAsTablesMixin, admin.ModelAdmin):
    """Clusters in service; one that is gone is retired (kept with its history), and only a
    cluster no record names may be deleted."""

    form = ClusterForm
    retire_service = _cluster_retire
    delete_service = _cluster_delete
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

    def retire_also(self, objs) -> str:
        return ("Their orgs in service are retired with them, and a defrag job still open on them is no longer "
                "stepped.")
