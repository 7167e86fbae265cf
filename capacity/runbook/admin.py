"""Admin: the model registry and the serving runbook's operations, each behind its own
permission, with a confirmation page before anything that is not graceful, and an audit record."""
from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from capacity.runbook.models import ResourceSpec, RunbookAudit, ServedModel
from capacity.runbook import services
from clusters.errors import KubeError
from config import clock

NOT_GRACEFUL = ("This is NOT graceful: the old revision's pods stop at once, with the requests they are "
                "serving, so the Pending revision can get their GPUs. It is the easiest way to update a "
                "deployment in resource-constrained conditions, not a rollout.")


def _confirm(modeladmin, request, *, title, items, button, action=None, selected=(), warning=None):
    return TemplateResponse(request, "capacity/runbook_confirm.html", {
        **modeladmin.admin_site.each_context(request), "opts": modeladmin.model._meta, "title": title,
        "items": items, "button": button, "action": action, "selected": [str(pk) for pk in selected],
        "warning": warning, "cancel_url": reverse("admin:capacity_servedmodel_changelist")})


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("__str__", "kind", "model", "org_slug", "framework", "ready", "revision_summary", "gpus_held",
                    "blocked_links", "gone", "synced_at")
    list_filter = ("cluster", "kind", "ready", "gone", "framework")
    search_fields = ("name", "namespace", "model", "org_slug")
    readonly_fields = [f.name for f in ServedModel._meta.fields]
    actions = ["sync_registry", "redeploy", "delete_stuck"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False   # deleting the row would not delete the model: use "delete a model stuck deploying"

    def has_sync_servedmodel_permission(self, request):
        return request.user.has_perm("capacity.sync_servedmodel")

    def has_redeploy_servedmodel_permission(self, request):
        return request.user.has_perm("capacity.redeploy_servedmodel")

    def has_delete_stuck_model_permission(self, request):
        return request.user.has_perm("capacity.delete_stuck_model")

    @admin.display(description="revisions (ready / running / pending)")
    def revision_summary(self, obj):
        return ", ".join(f"{r['name']}: {'ready' if r['ready'] else 'not ready'}, {r['pods_running']} running, "
                         f"{r['pods_pending']} pending" for r in obj.revisions) or "-"

    @admin.display(description="pending for GPUs: unblock")
    def blocked_links(self, obj):
        if not obj.blocked:
            return "-"
        return format_html_join(", ", '<a href="{}">delete the old revision {} ({} GPU)</a>', (
            (reverse("admin:capacity_servedmodel_unblock", args=[obj.pk, b["old_revision"]]), b["old_revision"],
             b["gpus_held"]) for b in obj.blocked))

    def get_urls(self):
        return [path("<int:pk>/unblock/<str:revision>/", self.admin_site.admin_view(self.unblock_view),
                     name="capacity_servedmodel_unblock")] + super().get_urls()

    # --- actions ---------------------------------------------------------------------------------
    @admin.action(description="Sync the registry from these models' clusters", permissions=["sync_servedmodel"])
    def sync_registry(self, request, queryset):
        for cluster in {m.cluster for m in queryset}:
            try:
                rows = services.registry_sync(cluster=cluster)
            except KubeError as exc:
                self.message_user(request, f"{cluster}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{cluster}: {len(rows)} model(s) synced")

    @admin.action(description="Redeploy (new revision, no other change)", permissions=["redeploy_servedmodel"])
    def redeploy(self, request, queryset):
        models = [m for m in queryset if not m.gone]
        if request.POST.get("confirm") != "yes":
            return _confirm(self, request, title="Redeploy these models?", button="Redeploy",
                            items=[f"{m} ({m.kind}): a new revision rolls out, then the old one is retired"
                                   for m in models], action="redeploy", selected=[m.pk for m in models])
        for model in models:
            try:
                services.model_redeploy(model=model, actor=request.user)
            except KubeError as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{model}: redeploy started")

    @admin.action(description="Delete a model stuck deploying (and what it left behind)",
                  permissions=["delete_stuck_model"])
    def delete_stuck(self, request, queryset):
        stuck = [m for m in queryset if not m.gone and not m.ready and m.kind == ServedModel.Kind.INFERENCE_SERVICE]
        refused = [m for m in queryset if m not in stuck]
        for model in refused:
            self.message_user(request, f"{model}: not an InferenceService stuck deploying; left alone",
                              messages.WARNING)
        if not stuck:
            return None
        if request.POST.get("confirm") != "yes":
            return _confirm(self, request, title="Delete these models stuck deploying?", button="Delete",
                            items=[f"{m}: InferenceService, its Knative Service, Configuration and Revisions"
                                   for m in stuck], action="delete_stuck", selected=[m.pk for m in stuck],
                            warning=f"You ({request.user}) will be recorded as the operator who deleted them.")
        for model in stuck:
            try:
                deleted = services.model_delete_stuck(model=model, actor=request.user)
            except (KubeError, services.RunbookRefused) as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{model}: deleted {', '.join(deleted) or 'nothing left'}")

    # --- unblock a Pending deployment ----------------------------------------------------------------
    def unblock_view(self, request, pk: int, revision: str):
        if not request.user.has_perm("capacity.delete_old_revision"):
            raise PermissionDenied("deleting an old revision needs the 'delete old revision' permission")
        model = get_object_or_404(ServedModel, pk=pk)
        blocked = next((b for b in model.blocked if b["old_revision"] == revision), None)
        changelist = reverse("admin:capacity_servedmodel_changelist")
        if blocked is None:
            self.message_user(request, f"{revision} is not blocking a Pending revision of {model}", messages.ERROR)
            return HttpResponseRedirect(changelist)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                done = services.revision_delete_old(model=model, revision=revision, actor=request.user)
            except (KubeError, services.RunbookRefused) as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"deleted {revision}: {done.pending_revision} can now get its GPUs")
                services.registry_sync(cluster=model.cluster)
            return HttpResponseRedirect(changelist)
        return _confirm(self, request, title=f"Delete the old revision {revision} of {model}?",
                        items=[blocked["reason"]], button=f"Delete {revision}", warning=NOT_GRACEFUL)


@admin.register(ResourceSpec)
class ResourceSpecAdmin(admin.ModelAdmin):
    """Adding a spec redeploys every deployed version of the model with it."""

    list_display = ("model", "cluster", "gpu_count", "gpu_product", "cpu_request", "cpu_limit", "memory_request",
                    "memory_limit", "created_by", "created_at", "applied_summary")
    list_filter = ("cluster",)
    search_fields = ("model",)
    fields = ("cluster", "model", "gpu_count", "gpu_product", "cpu_request", "cpu_limit", "memory_request",
              "memory_limit")

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)  # a new spec, never an edit

    def has_delete_permission(self, request, obj=None):
        return False   # the record of what was deployed stays

    @admin.display(description="applied to")
    def applied_summary(self, obj):
        return "; ".join(a["target"] + (f" (failed: {a['error']})" if "error" in a else "") for a in obj.applied)

    def save_model(self, request, obj, form, change):
        obj.created_at = clock.now()
        obj.created_by = request.user
        super().save_model(request, obj, form, change)
        try:
            applied = services.resource_spec_apply(spec=obj, actor=request.user)
        except services.RunbookRefused as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return
        failed = [a for a in applied if "error" in a]
        self.message_user(request, f"redeploying {len(applied) - len(failed)} version(s) of {obj.model}"
                                   + (f"; {len(failed)} failed" if failed else ""),
                          messages.WARNING if failed else messages.SUCCESS)


@admin.register(RunbookAudit)
class RunbookAuditAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "target", "cluster")
    list_filter = ("action", "cluster")
    readonly_fields = [f.name for f in RunbookAudit._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
