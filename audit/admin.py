from django.contrib import admin

from audit.models import AuditEntry
from config.actors import actor_describe
from config.admin_display import JsonAsTablesMixin


@admin.register(AuditEntry)
class AuditEntryAdmin(JsonAsTablesMixin, admin.ModelAdmin):
    """The audit trail, read only: nothing here is added, changed or deleted by hand."""

    list_display = ("at", "app", "action", "target", "cause", "by", "cluster", "org")
    list_filter = ("app", "action", "cluster")
    search_fields = ("target", "action", "cause", "actor_label", "org__slug")
    list_select_related = ("actor", "cluster", "org")
    readonly_fields = ("at", "app", "action", "target", "cause", "actor", "actor_label", "cluster", "org",
                       "subject_type", "subject_id", "old", "new")

    @admin.display(description="by", ordering="actor")
    def by(self, entry: AuditEntry) -> str:
        return actor_describe(entry.actor, entry.actor_label)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
