"""Admin for rows that records name: a cluster or an org (retired, never deleted with its
history) and a panel account (deactivated).

A row that records name (see `config.records`) has no Delete button (a cluster's or org's
page offers "Retire…" instead), and a delete asked anyway (the delete page's address, the
list's "Delete selected" action) is refused in one line that says what names it, changing
nothing. A row nothing names may still be deleted; retire and delete are audited by the
services each admin names (`retire_service`, `delete_service`)."""
from __future__ import annotations

import functools

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from config import clock
from config.actors import actor_describe
from config.records import RecordsKept, records_kept_message, records_naming


class InServiceFilter(admin.SimpleListFilter):
    """In service by default: a retired row is listed only when asked for."""

    title = "in service or retired"
    parameter_name = "retired"

    def lookups(self, request, model_admin):
        return (("yes", "retired"), ("all", "in service and retired"))

    def choices(self, changelist):
        yield {"selected": self.value() is None, "display": "in service",
               "query_string": changelist.get_query_string(remove=[self.parameter_name])}
        for value, title in self.lookup_choices:
            yield {"selected": self.value() == value, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: value})}

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(retired_at__isnull=False)
        if self.value() == "all":
            return queryset
        return queryset.filter(retired_at__isnull=True)


def _in_service_only(func):
    """An act of the list refused as a whole when a selected row is retired: no act reaches
    what is gone."""

    @functools.wraps(func)
    def act(modeladmin, request, queryset):
        retired = sorted(str(obj) for obj in queryset.filter(retired_at__isnull=False))
        if retired:
            modeladmin.message_user(request, f"{', '.join(retired)}: retired, no act reaches it any more; nothing "
                                             "was changed", messages.ERROR)
            return None
        return func(modeladmin, request, queryset)

    return act


class DeleteOnlyUnnamedMixin:
    """A ModelAdmin whose rows are deleted only when no record names them: otherwise no Delete
    button, and a delete asked anyway (the delete page, "Delete selected") is refused in one
    line that ends with `instead`. Subclasses set `delete_service(obj, actor, now)`, which
    deletes and audits (and raises `RecordsKept`)."""

    delete_service = None
    instead = "retire it instead"

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and records_naming(obj):
            return False
        return super().has_delete_permission(request, obj)

    def _may_delete(self, request) -> bool:
        return super().has_delete_permission(request, None)

    def delete_view(self, request, object_id, extra_context=None):
        obj = self.get_object(request, unquote(object_id))
        if obj is not None and self._may_delete(request):
            kept = records_naming(obj)
            if kept:
                self.message_user(request, records_kept_message(obj, kept, instead=self.instead), messages.ERROR)
                return HttpResponseRedirect(reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change",
                                                    args=[obj.pk]))
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj) -> None:
        try:
            type(self).delete_service(obj=obj, actor=request.user, now=clock.now())
        except RecordsKept as exc:   # a record named it since the page was shown
            self.message_user(request, str(exc), messages.ERROR)

    def delete_queryset(self, request, queryset) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        if "delete_selected" in actions:
            func, name, description = actions["delete_selected"]
            actions["delete_selected"] = (type(self).delete_selected_unnamed, name, description)
        return actions

    def delete_selected_unnamed(self, request, queryset):
        """Django's delete (its confirmation page, then `delete_queryset`), only when no
        selected row is named by a record; otherwise nothing is deleted and each kept row
        is said in one line."""
        refused = [records_kept_message(obj, kept, instead=self.instead)
                   for obj in queryset if (kept := records_naming(obj))]
        if refused:
            for line in refused:
                self.message_user(request, line, messages.ERROR)
            self.message_user(request, "nothing was deleted", messages.ERROR)
            return None
        return delete_selected(self, request, queryset)


class RetireInsteadOfDeleteMixin(DeleteOnlyUnnamedMixin):
    """For a ModelAdmin of a `config.records.Retirable` model. Subclasses set
    `retire_service(obj, actor, now) -> str` (what was done, in words) and
    `delete_service(obj, actor, now)` (raises `RecordsKept`)."""

    retire_service = None
    retired_fields = ("retired_at", "retired", "records")

    # --- what the pages show ------------------------------------------------------------------
    @admin.display(description="retired")
    def retired(self, obj) -> str:
        if obj.retired_at is None:
            return "in service"
        return f"retired {obj.retired_at:%Y-%m-%d %H:%M} UTC by {actor_describe(obj.retired_by, obj.retired_by_label)}"

    @admin.display(description="records naming it")
    def records(self, obj) -> str:
        if obj.pk is None:
            return "—"
        kept = records_naming(obj)
        if not kept:
            return "none: it may be deleted"
        listed = ", ".join(f"{count} {name}" for count, name in kept)
        if obj.retired_at is not None:
            return f"{listed} (kept)"
        url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_retire", args=[obj.pk])
        return format_html('{}: it cannot be deleted without losing them. <a href="{}" id="retire-link">Retire…</a> '
                           "if it is gone.", listed, url)

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *self.retired_fields]

    def get_exclude(self, request, obj=None):
        return [*(super().get_exclude(request, obj) or ()), "retired_by", "retired_by_label"]

    def get_list_filter(self, request):
        return [InServiceFilter, *super().get_list_filter(request)]

    def has_change_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.retired_at is not None:
            return False   # kept as it was when it was retired
        return super().has_change_permission(request, obj)

    # --- delete: only what nothing names; retire instead ----------------------------------------
    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.retired_at is not None:
            return False
        return super().has_delete_permission(request, obj)

    def _may_delete_or_retire(self, request) -> bool:
        return self._may_delete(request)

    def get_actions(self, request):
        actions = {name: (func if name == "delete_selected" else _in_service_only(func), name, description)
                   for name, (func, name, description) in super().get_actions(request).items()}
        if self._may_delete_or_retire(request):
            actions["retire_selected"] = (type(self).retire_selected, "retire_selected",
                                          f"Retire selected {self.model._meta.verbose_name_plural} (gone: kept with "
                                          "their history)…")
        return actions

    # --- retire -----------------------------------------------------------------------------------
    def get_urls(self):
        opts = self.model._meta
        own = [path("<path:object_id>/retire/", self.admin_site.admin_view(self.retire_view),
                    name=f"{opts.app_label}_{opts.model_name}_retire")]
        return own + super().get_urls()

    def _retire(self, request, objs) -> None:
        now = clock.now()
        for obj in objs:
            self.message_user(request, type(self).retire_service(obj=obj, actor=request.user, now=now))

    def _retire_page(self, request, objs, *, action: str = "", also: str = ""):
        opts = self.model._meta
        return TemplateResponse(request, "admin/records/retire_confirm.html", {
            **self.admin_site.each_context(request), "opts": opts, "title": f"Retire {len(objs)} "
            f"{opts.verbose_name if len(objs) == 1 else opts.verbose_name_plural}?",
            "items": [f"{obj}: {', '.join(f'{c} {n}' for c, n in records_naming(obj)) or 'no records'}"
                      for obj in objs],
            "selected": [str(obj.pk) for obj in objs] if action else [], "action": action, "also": also,
            "cancel_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")})

    def retire_also(self, objs) -> str:
        """What else retiring these does, said on the confirmation page."""
        return ""

    def retire_selected(self, request, queryset):
        objs = [obj for obj in queryset if obj.retired_at is None]
        if not objs:
            self.message_user(request, "all selected were already retired: nothing changed", messages.WARNING)
            return None
        if request.POST.get("confirm") != "yes":
            return self._retire_page(request, objs, action="retire_selected", also=self.retire_also(objs))
        self._retire(request, objs)
        return None

    def retire_view(self, request, object_id):
        if not self._may_delete_or_retire(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        opts = self.model._meta
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, opts, object_id)
        change_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
        if obj.retired_at is not None:
            self.message_user(request, f"{obj} is already retired: nothing changed", messages.WARNING)
            return HttpResponseRedirect(change_url)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            self._retire(request, [obj])
            return HttpResponseRedirect(change_url)
        response = self._retire_page(request, [obj], also=self.retire_also([obj]))
        response.context_data["cancel_url"] = change_url
        return response
