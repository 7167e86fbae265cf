"""Admin: binpack runs (read-only record) and "run binpack now" on clusters."""
from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from capacity.binpack.planning import COST_ORDER, FORMULA
from capacity.binpack.models import (WRITE_RESULTS, BinpackCluster, BinpackNodeFreed, BinpackRun, settled_describe,
                                     written_describe)
from clusters.errors import KubeError
from config.admin_display import ReadOnlyAdminMixin, actor_display, json_table_display
from config.admin_lookups import ListFiltersCheckedMixin


@admin.register(BinpackRun)
class BinpackRunAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The record of what each run wrote: read only for everyone, never deleted here."""

    # A run still writing has recorded what it announced, not what it wrote: its counts are
    # shown as not final rather than as zeros.
    list_display = ("id", "cluster", "trigger", "by", "mode", "state", "started_at", "planned", "written_shown",
                    "unchanged", "skipped", "stale_shown", "unwritten_shown", "unknown_shown", "over_budget",
                    "plan_seconds")
    list_filter = ("cluster", "trigger", "dry_run", "state")
    date_hierarchy = "started_at"
    # The changes are shown as a table with each pod's reason, not as raw JSON.
    # The write-ahead list is the settler's working copy (emptied once finished), not a record.
    fields = [*(f.name for f in BinpackRun._meta.fields if f.name not in ("changes", "errors", "announced", "marked")),
              "marked_shown", "changes_explained", "errors_shown"]
    readonly_fields = [*fields, "written_shown"]
    errors_shown = json_table_display("errors", "errors")
    marked_shown = json_table_display("marked", "nodes marked to be emptied first")

    by = actor_display("actor", "actor_label", "by", ordering="actor")

    @admin.display(description="mode", ordering="dry_run")
    def mode(self, run: BinpackRun) -> str:
        # Words, not the boolean's icons: a red ✖ would mark every run that wrote.
        return "dry run" if run.dry_run else "write"

    @admin.display(description="written", ordering="written")
    def written_shown(self, run: BinpackRun) -> str:
        return written_describe(run)

    @staticmethod
    def _final(run: BinpackRun, value: int) -> int | str:
        return "not final" if run.state == BinpackRun.State.WRITING else value

    @admin.display(description="stale", ordering="stale")
    def stale_shown(self, run: BinpackRun):
        return self._final(run, run.stale)

    @admin.display(description="unwritten", ordering="unwritten")
    def unwritten_shown(self, run: BinpackRun):
        return self._final(run, run.unwritten)

    @admin.display(description="outcome unknown", ordering="unknown")
    def unknown_shown(self, run: BinpackRun):
        """Writes whose answer was lost, until the next run settles them from the pods."""
        return self._final(run, run.unknown)

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if obj is not None and obj.state == BinpackRun.State.WRITING:
            # Its counts are not kept until it finishes (or is settled): one line says so.
            return [("written_shown" if f == "written" else f) for f in fields
                    if f not in ("stale", "unwritten", "unknown")]
        return fields

    @admin.display(description="changes and why")
    def changes_explained(self, run: BinpackRun):
        """One row per pod: its node, the cost it had and gets, and why it gets that cost."""
        if not run.changes:
            return "—"
        rows = format_html_join("", "<tr><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (c.get("namespace", ""), c.get("pod", ""), c.get("node", ""), c.get("old") or "—",
             "(removed)" if c.get("new") is None else c.get("new"), self._result(run, c), c.get("reason", ""))
            for c in run.changes))
        more = (format_html("<p>The first {} of {} changes are recorded.</p>", len(run.changes), run.planned)
                if run.planned > len(run.changes) else "")
        return format_html('<p class="help">{}</p><table id="binpack-changes"><thead><tr><th>Pod</th><th>Node</th>'
                           "<th>Old cost</th><th>New cost</th><th>Result</th><th>Why</th></tr></thead><tbody>{}</tbody>"
                           "</table>{}",
                           COST_ORDER, rows, more)

    @staticmethod
    def _result(run: BinpackRun, change: dict) -> str:
        """Whether the pod got the new cost: a planned change is not a written one."""
        if run.dry_run:
            return "dry run: not written"
        return WRITE_RESULTS.get(change.get("result"), "—")   # "—": recorded before results were

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "subtitle": f"Cost formula: {FORMULA}"}
        return super().changelist_view(request, extra_context)


@admin.register(BinpackCluster)
class BinpackClusterAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "last_run", "last_written")
    actions = ["run_binpack", "dry_run_binpack"]

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("capacity.view_binpackrun") or request.user.has_perm("capacity.run_binpack")

    def get_queryset(self, request):
        return super().get_queryset(request).filter(retired_at__isnull=True)   # binpack acts: no retired cluster

    def has_run_binpack_permission(self, request):
        return request.user.has_perm("capacity.run_binpack")

    @admin.display(description="last run")
    def last_run(self, cluster):
        run = cluster.binpack_runs.first()
        return run.started_at if run else "never"

    @admin.display(description="pods written by it")
    def last_written(self, cluster):
        run = cluster.binpack_runs.first()
        return written_describe(run) if run else "-"

    def _run(self, request, queryset, *, dry_run: bool):
        from capacity.binpack.services import pod_deletion_costs_apply

        for cluster in queryset:
            try:
                run, _ = pod_deletion_costs_apply(cluster=cluster, actor=request.user,
                                                  trigger=BinpackRun.Trigger.ADMIN, dry_run=dry_run)
            except KubeError as exc:
                self.message_user(request, f"{cluster}: {exc}", messages.ERROR)
                continue
            for earlier in getattr(run, "settled", ()):
                self.message_user(request, f"{cluster}: {settled_describe(earlier)}", messages.WARNING)
            level = messages.WARNING if run.errors else messages.SUCCESS
            done = f"would write {run.planned}" if dry_run else f"wrote {run.written} of {run.planned}"
            untried, lost = run.results.count("untried"), run.results.count("lease-lost")
            unknown = run.results.count("unknown")
            more = "".join(said for count, said in (
                (unknown, f", {unknown} of unknown outcome (the write's answer was lost; the next run settles it "
                          "from the pod)"),
                (untried, f", {untried} not tried (the cluster had stopped answering)"),
                (lost, f", {lost} not tried (the run's lease lapsed while it wrote)"),
                (run.over_budget, f", {run.over_budget} left for the next run (budget)")) if count)
            self.message_user(request, f"{cluster}: {done} cost(s), {run.unchanged} unchanged, {run.skipped} "
                                       f"skipped, {run.stale} stale, {run.results.count('error')} error(s){more} "
                                       f"(run {run.pk})", level)

    @admin.action(description="Run binpack now (write deletion costs)", permissions=["run_binpack"])
    def run_binpack(self, request, queryset):
        self._run(request, queryset, dry_run=False)

    @admin.action(description="Dry-run binpack (record what would be written)", permissions=["run_binpack"])
    def dry_run_binpack(self, request, queryset):
        self._run(request, queryset, dry_run=True)


@admin.register(BinpackNodeFreed)
class BinpackNodeFreedAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Nodes a binpack run marked and the periodic check then saw free: what the savings page
    counts under binpack. Read only for everyone, never deleted here."""

    list_display = ("node", "cluster", "gpus", "gpu_model", "run", "marked_at", "freed_at", "removed_at",
                    "ended_at", "end_reason")
    list_filter = ("cluster",)
    date_hierarchy = "freed_at"
    search_fields = ("node",)
    fields = [f.name for f in BinpackNodeFreed._meta.fields if f.name != "id"]
    readonly_fields = fields
