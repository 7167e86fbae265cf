"""Admin menu: "Savings per cluster", each row linking to the cluster's savings page."""
from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from config.admin_display import ReadOnlyAdminMixin
from config.admin_lookups import ListFiltersCheckedMixin
from savings.models import SavingsCluster
from savings.views import CLUSTER_CONTENTS_PERMISSION


@admin.register(SavingsCluster)
class SavingsClusterAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "savings_page", "savings_csv")
    list_display_links = None

    def _allowed(self, request) -> bool:
        return request.user.is_active and request.user.has_perm(CLUSTER_CONTENTS_PERMISSION)

    def has_module_permission(self, request):
        return self._allowed(request)

    def has_view_permission(self, request, obj=None):
        return self._allowed(request)

    @admin.display(description="savings")
    def savings_page(self, cluster):
        return format_html('<a href="{}">GPU-hours saved (last 14 days)</a>', reverse("savings:savings",
                                                                                        args=[cluster.name]))

    @admin.display(description="export")
    def savings_csv(self, cluster):
        return format_html('<a href="{}">CSV</a>', reverse("savings:savings_csv", args=[cluster.name]))
