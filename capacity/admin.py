"""Admin for defrag jobs: start (report → confirm), drain (own permission, second
confirmation), abort, and the job page that follows the job live."""
from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from clusters.errors import KubeError
from clusters.models import Cluster

from capacity.models import DefragAudit, DefragJob, DefragOrphan, DefragRevision
from capacity.services import DefragError, defrag_discover, defrag_job_abort, defrag_job_drain, defrag_job_start


class ReadOnlyInline(admin.TabularInline):
    """A job's rows are written by the job only: shown, never added or edited here."""
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class RevisionInline(ReadOnlyInline):
    model = DefragRevision
    readonly_fields = [f.name for f in DefragRevision._meta.fields]


class OrphanInline(ReadOnlyInline):
    model = DefragOrphan
    readonly_fields = [f.name for f in DefragOrphan._meta.fields if f.name != "owner_references"]
    exclude = ["owner_references"]


class AuditInline(ReadOnlyInline):
    model = DefragAudit
    readonly_fields = [f.name for f in DefragAudit._meta.fields]


@admin.register(DefragJob)
class DefragJobAdmin(admin.ModelAdmin):
    list_display = ["id", "cluster", "node_name", "state", "requested_by", "created_at", "safe_at", "finished_at"]
    list_filter = ["state", "cluster"]
    search_fields = ["node_name"]
    readonly_fields = [f.name for f in DefragJob._meta.fields]
    inlines = [RevisionInline, OrphanInline, AuditInline]
    change_form_template = "capacity/defragjob_change_form.html"
    change_list_template = "capacity/defragjob_change_list.html"

    def has_add_permission(self, request):
        return False  # jobs start from the report page ("defrag this node"), never from a blank form

    def has_delete_permission(self, request, obj=None):
        return False  # a job's rows are the only record of the pods it orphaned

    def get_urls(self):
        own = [
            path("start/", self.admin_site.admin_view(self.start_view), name="capacity_defragjob_start"),
            path("<int:pk>/drain/", self.admin_site.admin_view(self.drain_view), name="capacity_defragjob_drain"),
            path("<int:pk>/abort/", self.admin_site.admin_view(self.abort_view), name="capacity_defragjob_abort"),
        ]
        return own + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        extra = {"clusters": Cluster.objects.all(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Every field is the job's own record: no Save buttons; operators act through
        # the drain and abort pages, each with its confirmation.
        extra = {"can_drain": request.user.has_perm("capacity.drain_defragjob"), "show_save": False,
                 "show_save_and_continue": False, "show_save_and_add_another": False, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def _job_url(self, job: DefragJob) -> str:
        return reverse("admin:capacity_defragjob_change", args=[job.pk])

    def start_view(self, request):
        """The seed's step 1 as a page: the discovery report, then `Proceed with defrag?`."""
        if not request.user.has_perm("capacity.add_defragjob"):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        cluster = get_object_or_404(Cluster, name=source.get("cluster", ""))
        node_name = source.get("node", "")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "cluster": cluster,
                   "node": node_name, "title": f"Defrag node {node_name}?"}
        try:
            plan = defrag_discover(cluster=cluster, node_name=node_name)
        except (DefragError, KubeError) as exc:
            messages.error(request, f"Cannot defrag {node_name!r}: {exc}")
            return HttpResponseRedirect(reverse("admin:capacity_defragjob_changelist"))
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                job = defrag_job_start(cluster=cluster, node_name=node_name, plan=plan, actor=request.user,
                                       timeout_seconds=int(request.POST.get("timeout") or 1800),
                                       poll_interval_seconds=float(request.POST.get("poll_interval") or 10))
            except ValueError as exc:
                messages.error(request, f"Bad timeout or poll interval: {exc}")
            except DefragError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"Defrag job #{job.pk} started on {node_name}")
                return HttpResponseRedirect(self._job_url(job))
        context.update(plan=plan, lines=plan.report_lines())
        return TemplateResponse(request, "capacity/defrag_confirm.html", context)

    def drain_view(self, request, pk: int):
        job = get_object_or_404(DefragJob, pk=pk)
        if not request.user.has_perm("capacity.drain_defragjob"):
            raise PermissionDenied("draining needs the 'Can drain (evict and delete) a defragged node' permission")
        if request.method == "POST" and request.POST.get("confirm") == job.node_name:
            try:
                defrag_job_drain(job=job, actor=request.user, delete_node=request.POST.get("delete_node") == "on")
            except DefragError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"Draining {job.node_name}")
            return HttpResponseRedirect(self._job_url(job))
        if request.method == "POST":
            messages.error(request, "Type the node name exactly to confirm the drain.")
        return TemplateResponse(request, "capacity/defrag_drain_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "job": job,
            "orphans": job.orphans.filter(state="orphaned"), "title": f"Drain node {job.node_name}?"})

    def abort_view(self, request, pk: int):
        job = get_object_or_404(DefragJob, pk=pk)
        if not request.user.has_perm("capacity.change_defragjob"):
            raise PermissionDenied
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                defrag_job_abort(job=job, actor=request.user)
            except DefragError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"Aborting job #{job.pk}: the node is uncordoned, orphans end once "
                                          f"their revisions are back to scale")
            return HttpResponseRedirect(self._job_url(job))
        return TemplateResponse(request, "capacity/defrag_abort_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "job": job,
            "title": f"Abort defrag of {job.node_name}?"})

from capacity import admin_binpack, admin_runbook  # noqa: E402,F401  (issue 6: registers their admins)
