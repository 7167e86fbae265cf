from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import transaction

from audit.models import AuditEntry
from audit.services import audit
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin, actor_display
from config.admin_lookups import ListFiltersCheckedMixin
from config.admin_records import DeleteOnlyUnnamedMixin
from config.records import RecordsKept, records_kept_message, records_naming


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


def _user_delete(*, obj, actor, now) -> None:
    """Delete a panel account no record names, audited (by name: the row is gone)."""
    with transaction.atomic():
        kept = records_naming(obj)
        if kept:
            raise RecordsKept(records_kept_message(obj, kept, instead=UserKeptAdmin.instead))
        username, pk = obj.get_username(), obj.pk
        obj.delete()
        audit(app="audit", action="user_deleted", at=now, actor=actor, cause="it named no record",
              target=f"User/{username}", subject=("user", pk), old={"username": username}, new={})


class UserKeptAdmin(DeleteOnlyUnnamedMixin, UserAdmin):
    """Panel accounts: one that records name (what it did, its tokens) is deactivated, never
    deleted, so that every record keeps who acted."""

    delete_service = _user_delete
    instead = "deactivate it instead (untick Active)"


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, UserKeptAdmin)
