from django.contrib import admin

from audit.models import AuditEntry
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin, actor_display
from config.admin_lookups import ListFiltersCheckedMixin


@admin.register(AuditEntry)
class AuditEntryAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, JsonAsTablesMixin, admin.ModelAdmin):
    """The audit trail, read only: nothing here is added, changed or deleted by hand."""

    list_display = ("at", "app", "action", "target", "cause", "by", "cluster", "org")
    list_filter = ("app", "action", "cluster")
    search_fields = ("target", "action", "cause", "actor_label", "org__slug")
    list_select_related = ("actor", "cluster", "org")
    readonly_fields = ("at", "app", "action", "target", "cause", "actor", "actor_label", "cluster", "org",
                       "subject_type", "subject_id", "old", "new")

    by = actor_display("actor", "actor_label", "by", ordering="actor")
