"""Admin for defrag jobs: start (report → confirm), drain (own permission, second
confirmation), abort, and the job page that follows the job live."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import escape
from django.utils.safestring import mark_safe

from audit.selectors import entries_of_subject
from clusters import kube
from clusters.errors import KubeError, NotFound
from clusters.selectors import cluster_find, clusters_all
from config.actors import actor_describe
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin, actor_display, json_table
from config.admin_lookups import ListFiltersCheckedMixin

from capacity.defrag.models import AbortChoice, DefragJob, DefragOrphan, DefragRevision, JobState
from capacity.defrag import services
from capacity.defrag.planning import seconds_text
from capacity.defrag.selectors import defrag_job_live_orphans, defrag_job_return, defrag_jobs_with_return
from capacity.selectors import node_without_gpus


class DefragStartForm(forms.Form):
    """The two numbers an operator may set when confirming; Django's fields refuse NaN and
    infinities, the bounds refuse zero, negatives and absurdly long waits."""
    timeout = forms.IntegerField(label="timeout", min_value=services.TIMEOUT_RANGE[0],
                                 max_value=services.TIMEOUT_RANGE[1], required=False)
    poll_interval = forms.FloatField(label="poll_interval", min_value=services.POLL_RANGE[0],
                                     max_value=services.POLL_RANGE[1], required=False)

    def errors_named(self) -> list[str]:
        return [f"{name}: {error}" for name, errors in self.errors.items() for error in errors]


class ReadOnlyInline(ReadOnlyAdminMixin, admin.TabularInline):
    """A job's rows are written by the job only: shown, never added, edited or deleted here."""
    extra = 0
    can_delete = False


class RevisionInline(ReadOnlyInline):
    model = DefragRevision
    readonly_fields = [f.name for f in DefragRevision._meta.fields]


class OrphanInline(ReadOnlyInline):
    model = DefragOrphan
    readonly_fields = [f.name for f in DefragOrphan._meta.fields if f.name != "owner_references"]
    exclude = ["owner_references"]


def _asked_before(request, *, job: DefragJob, what: str, at, by) -> None:
    """A request the job already holds, asked again (a double click, back and resubmit)."""
    who = by.get_username() if by is not None else "a command"
    messages.warning(request, f"Job #{job.pk}: this {what} was already requested at {at:%Y-%m-%d %H:%M:%S} UTC "
                              f"by {who} and is on its way: nothing new was asked")


@admin.register(DefragJob)
class DefragJobAdmin(ListFiltersCheckedMixin, JsonAsTablesMixin, admin.ModelAdmin):
    list_display = ["id", "cluster", "node_name", "state", "node_returned", "asked_by", "created_at", "safe_at",
                    "finished_at"]
    list_filter = ["state", "cluster"]
    search_fields = ["node_name"]
    readonly_fields = [f.name for f in DefragJob._meta.fields]
    # What an operator reads first is drawn above these by the page (node, state, what to do
    # next, the log); then who and when, and folded, the report and the fields a worker
    # keeps for itself (requests as taken up, lease, write-ahead intents, record-keeping).
    fieldsets = [
        ("The job", {"fields": ["cluster", "node_name", "state", "requested_by", "requested_by_label", "created_at",
                                "started_at", "safe_at", "finished_at"]}),
        ("Discovery report (what was shown before confirmation)", {"classes": ["collapse"], "fields": ["report"]}),
        ("Internals: requests, settings, lease and intents the job keeps for itself", {
            "classes": ["collapse"],
            "fields": [f.name for f in DefragJob._meta.fields if f.name not in {
                "id", "cluster", "node_name", "state", "requested_by", "requested_by_label", "created_at",
                "started_at", "safe_at", "finished_at", "report"}]}),
    ]
    inlines = [RevisionInline, OrphanInline]
    change_form_template = "capacity/defragjob_change_form.html"
    change_list_template = "capacity/defragjob_change_list.html"

    asked_by = actor_display("requested_by", "requested_by_label", "asked by", ordering="requested_by")

    def get_queryset(self, request):
        return defrag_jobs_with_return(super().get_queryset(request))

    @admin.display(description="node returned to service", ordering="returned_at")
    def node_returned(self, obj) -> str:
        """When and by whom the job's node was last returned to service (its audit entry)."""
        if obj.returned_at is None:
            return ""
        by = obj.returned_by_username
        who = f"{by} via {obj.returned_by_label}" if by and obj.returned_by_label else by or obj.returned_by_label
        return f"{obj.returned_at:%Y-%m-%d %H:%M:%S} UTC by {who or '—'}"

    def lookup_allowed(self, lookup, value, request=None):
        # The dashboard names its cluster in its URL and links here by it (?cluster__name=…).
        return lookup == "cluster__name" or super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request):
        return False  # jobs start from the report page ("defrag this node"), never from a blank form

    def has_change_permission(self, request, obj=None):
        return False  # its fields are the job's record; operators act through drain, abort and return

    def has_delete_permission(self, request, obj=None):
        return False  # a job's rows are the only record of the pods it orphaned

    def get_urls(self):
        own = [
            path("start/", self.admin_site.admin_view(self.start_view), name="capacity_defragjob_start"),
            path("<int:pk>/drain/", self.admin_site.admin_view(self.drain_view), name="capacity_defragjob_drain"),
            path("<int:pk>/abort/", self.admin_site.admin_view(self.abort_view), name="capacity_defragjob_abort"),
            path("<int:pk>/return-to-service/", self.admin_site.admin_view(self.return_view),
                 name="capacity_defragjob_return"),
        ]
        return own + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        extra = {"clusters": clusters_all(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Every field is the job's own record: no Save buttons; operators act through
        # the drain and abort pages, each with its confirmation.
        job = self.get_object(request, object_id)
        returned = self._returned(object_id)
        can_drain = request.user.has_perm("capacity.drain_defragjob")
        can_return = request.user.has_perm("capacity.return_to_service_defragjob")
        extra = {"next_step": job and self._next_step(job, can_drain=can_drain, can_return=can_return,
                                                      returned=returned is not None),
                 "can_drain": can_drain, "can_return": can_return,
                 "returnable_states": services.RETURNABLE_STATES, "show_save": False,
                 "show_save_and_continue": False, "show_save_and_add_another": False,
                 "audit_entries": self._audit_rows(object_id), "returned": returned,
                 "recheck_every": seconds_text(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS),
                 **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @staticmethod
    def _next_step(job: DefragJob, *, can_drain: bool, can_return: bool, returned: bool) -> str:
        """What the operator may do next in the job's state, by the buttons above the page."""
        following = "this page follows it"
        if job.state == JobState.ABORTING or (job.abort_pending and job.state != JobState.ABORT_STUCK):
            return f"Nothing to do: the abort is under way and {following}."
        if job.state == JobState.DRAINING or (job.state == JobState.SAFE and job.drain_requested_at):
            return f"Nothing to do: the drain is under way and {following} (Abort… stops it)."
        if job.state in (JobState.CONFIRMED, JobState.RECORDED, JobState.CORDONED, JobState.WAITING):
            return f"Nothing to do yet: a worker is emptying the node and {following} (Abort… stops it)."
        back = " Return to service… uncordons the node and aborts the job." if can_return and not returned else ""
        if job.state == JobState.SAFE:
            drain = "Drain… evicts its orphans (and may delete the Node); " if can_drain else ""
            return f"The node is safe to remove: {drain}Abort… undoes the job.{back}"
        if job.state in (JobState.BLOCKED, JobState.FAILED):
            return f"The node cannot be drained: Abort… undoes the job (its orphans end once replaced).{back}"
        if job.state == JobState.ABORT_STUCK:
            return ("The abort waits for room for its orphans' replacements and checks again on its own: "
                    "Keep or delete the orphans… ends it sooner.")
        if job.state == JobState.DRAINED and can_return and not returned:
            return "Nothing left to drain: the node stays cordoned until Return to service… uncordons it."
        return "Nothing left to do."

    @staticmethod
    def _returned(object_id) -> dict | None:
        """When and by whom the job's node was last returned to service, or None."""
        try:
            entry = defrag_job_return(job_id=int(object_id))
        except (TypeError, ValueError):
            return None
        return entry and {"at": entry.at, "by": actor_describe(entry.actor, entry.actor_label)}

    @staticmethod
    def _audit_rows(object_id) -> list[dict]:
        """The job's entries in the audit trail, oldest first, as the page's read-only table."""
        try:
            job_id = int(object_id)
        except (TypeError, ValueError):
            return []
        # An action's name may break after an underscore ("scales_<wbr>record"), never inside a word.
        return [{"at": e.at, "action": mark_safe(escape(e.action).replace("_", "_<wbr>")),  # noqa: S308 - escaped
                 "target": e.target, "cause": e.cause,
                 "by": actor_describe(e.actor, e.actor_label), "old": json_table(e.old), "new": json_table(e.new)}
                for e in entries_of_subject(subject_type="defrag_job", subject_id=job_id, oldest_first=True)]

    def _job_url(self, job: DefragJob) -> str:
        return reverse("admin:capacity_defragjob_change", args=[job.pk])

    def start_view(self, request):
        """The defrag report as a page: what the node holds and what blocks, then `Proceed with defrag?`."""
        if not request.user.has_perm("capacity.add_defragjob"):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        cluster = cluster_find(name=source.get("cluster", ""))
        if cluster is None:
            raise Http404(f"no cluster named {source.get('cluster', '')!r}")
        node_name = source.get("node", "")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "cluster": cluster,
                   "node": node_name, "title": f"Defrag node {node_name}?"}
        try:
            plan = services.defrag_discover(cluster=cluster, node_name=node_name)
        except (services.DefragError, KubeError) as exc:
            messages.error(request, f"Cannot defrag {node_name!r}: {exc}")
            return HttpResponseRedirect(reverse("admin:capacity_defragjob_changelist"))
        no_gpus = node_without_gpus(cluster=cluster, node_name=node_name)
        if no_gpus:
            messages.error(request, f"Cannot defrag {node_name!r}: {no_gpus}")
            return HttpResponseRedirect(reverse("admin:capacity_defragjob_changelist"))
        shown = request.POST.get("report") if request.method == "POST" else None
        if request.method == "POST" and request.POST.get("confirm") == "yes" and shown != plan.fingerprint:
            # Nothing started: what is confirmed must be what was shown. The page shows the node now.
            messages.warning(request, f"Not started: node {node_name} changed since its report was shown "
                                      f"(pods came, went or changed role). Review the report below and confirm again.")
            context.update(timeout=request.POST.get("timeout"), poll_interval=request.POST.get("poll_interval"))
        elif request.method == "POST" and request.POST.get("confirm") == "yes":
            form = DefragStartForm(request.POST)
            if not form.is_valid():
                # Nothing started: the page comes back with the field named and the values typed.
                context.update(form_errors=form.errors_named(), timeout=request.POST.get("timeout"),
                               poll_interval=request.POST.get("poll_interval"))
                for error in form.errors_named():
                    messages.error(request, f"Not started: {error}")
            else:
                try:
                    job = services.defrag_job_start(cluster=cluster, node_name=node_name, plan=plan,
                                                    actor=request.user, timeout_seconds=form.cleaned_data["timeout"],
                                                    poll_interval_seconds=form.cleaned_data["poll_interval"])
                except services.DefragError as exc:
                    messages.error(request, str(exc))
                else:
                    messages.success(request, f"Defrag job #{job.pk} confirmed on {node_name}: a worker starts it")
                    return HttpResponseRedirect(self._job_url(job))
        context.update(plan=plan, lines=plan.report_lines(), report=plan.fingerprint)
        return TemplateResponse(request, "capacity/defrag_confirm.html", context)

    def drain_view(self, request, pk: int):
        job = get_object_or_404(DefragJob, pk=pk)
        if not request.user.has_perm("capacity.drain_defragjob"):
            raise PermissionDenied("draining needs the 'Can drain (evict and delete) a defragged node' permission")
        if request.method == "POST" and request.POST.get("confirm") == job.node_name:
            try:
                row = services.defrag_job_drain(job=job, actor=request.user,
                                                delete_node=request.POST.get("delete_node") == "on")
            except services.DefragError as exc:
                messages.error(request, str(exc))
            else:
                if job.drain_requested_at is not None and row.drain_requested_at == job.drain_requested_at:
                    _asked_before(request, job=job, what="drain", at=row.drain_requested_at,
                                  by=row.drain_requested_by)
                else:
                    messages.success(request, f"Drain of {job.node_name} requested: a worker evicts its orphans")
            return HttpResponseRedirect(self._job_url(job))
        if request.method == "POST":
            messages.error(request, "Type the node name exactly to confirm the drain.")
        return TemplateResponse(request, "capacity/defrag_drain_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "job": job,
            "retry": f"{services.eviction_retry_seconds(job):g}", "refusal": services.drain_refusal(job),
            "orphans": job.orphans.filter(state="orphaned"), "title": f"Drain node {job.node_name}?"})

    def abort_view(self, request, pk: int):
        job = get_object_or_404(DefragJob, pk=pk)
        if not request.user.has_perm("capacity.change_defragjob"):
            raise PermissionDenied
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            choice = request.POST.get("orphans", AbortChoice.WAIT)
            if choice == AbortChoice.DELETE and request.POST.get("capacity_drops") != "on":
                messages.error(request, "Tick the box that says capacity drops to delete the orphans anyway.")
                return HttpResponseRedirect(reverse("admin:capacity_defragjob_abort", args=[job.pk]))
            try:
                row = services.defrag_job_abort(job=job, actor=request.user, orphans=choice)
            except services.DefragError as exc:
                messages.error(request, str(exc))
            else:
                self._abort_said(request, job=job, row=row, choice=choice)
            return HttpResponseRedirect(self._job_url(job))
        return TemplateResponse(request, "capacity/defrag_abort_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "job": job,
            "stuck": job.state == JobState.ABORT_STUCK,
            "deadline": f"{settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS}s",
            "recheck_every": seconds_text(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS),
            "kept": job.orphans.filter(state="orphaned"),
            "title": f"Abort defrag of {job.node_name}?"})

    @staticmethod
    def _abort_said(request, *, job: DefragJob, row: DefragJob, choice: str) -> None:
        """What the abort page says: what this press asked, or that it asked nothing new
        (`job` as the page read it, `row` as the service left it)."""
        if row.state == JobState.ABORTED:
            messages.warning(request, f"Job #{job.pk} is already aborted: nothing was asked")
        elif job.abort_requested_at is not None and row.abort_requested_at == job.abort_requested_at:
            _asked_before(request, job=job, what="abort", at=row.abort_requested_at, by=row.abort_requested_by)
        else:
            messages.success(request, {
                AbortChoice.KEEP: f"Job #{job.pk}: keeping the orphans requested; a worker stops the abort "
                                  f"as abort-stuck where they are still needed",
                AbortChoice.DELETE: f"Job #{job.pk}: deleting the orphans anyway requested; a worker deletes "
                                    f"them even where their revision is not back to scale",
            }.get(choice, f"Abort of job #{job.pk} requested: a worker uncordons the node if the job cordoned "
                          f"it, and deletes each orphan once its revision is back to scale"))

    def return_view(self, request, pk: int):
        """Return the job's node to service (uncordon), after a page that names the node and
        says what it is now and what will happen to the job."""
        job = get_object_or_404(DefragJob.objects.select_related("cluster"), pk=pk)
        if not request.user.has_perm("capacity.return_to_service_defragjob"):
            raise PermissionDenied("returning a node to service needs the 'Can return a defragged node to "
                                   "service (uncordon it)' permission")
        if request.method == "POST" and request.POST.get("confirm") == job.node_name:
            try:
                done = services.node_return_to_service(cluster=job.cluster, node=job.node_name,
                                                       actor=request.user, job=job)
            except services.ReturnUnconfirmed as exc:
                messages.error(request, f"Not known whether the node was uncordoned: {exc}")
            except (services.DefragError, KubeError) as exc:
                messages.error(request, f"Nothing changed: {exc}")
            else:
                messages.success(request, done.message)
            return HttpResponseRedirect(self._job_url(job))
        try:
            node = kube.gateway_for(job.cluster).get(kube.NODES, job.node_name)
            node_state = "cordoned" if (node.get("spec") or {}).get("unschedulable") else "schedulable"
        except NotFound:
            node_state = "gone"
        except KubeError as exc:
            node_state = f"unknown (cannot read the cluster: {exc})"
        return TemplateResponse(request, "capacity/defrag_return_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "job": job, "node_state": node_state,
            "orphans": defrag_job_live_orphans(job=job), "returned": self._returned(job.pk),
            "ends_by_return": job.state in services.ENDED_BY_RETURN and not services.defrag_job_holding_reason(job),
            "recheck_every": seconds_text(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS),
            "title": f"Return node {job.node_name} to service?"})

