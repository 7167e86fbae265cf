"""Admin: prune runs (with per-pod utilization charts), decisions and their restore."""
from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from clusters.errors import KubeError, PrometheusError
from clusters.kube import gateway_for
from config import clock
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin, json_table
from config.admin_lookups import ListFiltersCheckedMixin

from . import selectors, services
from .actions import state_text
from .charts import CHART_JS, sparkline
from .models import PruneDecision, PruneRun
from .planning import M_KNATIVE_MIN_SCALE


class DecisionInline(ReadOnlyAdminMixin, JsonAsTablesMixin, admin.TabularInline):
    model = PruneDecision
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("namespace", "pod", "count", "owner_kind", "owner_name", "decision", "reason", "max_utilization",
              "effect", "result", "restore")
    readonly_fields = fields


@admin.register(PruneRun)
class PruneRunAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, JsonAsTablesMixin, admin.ModelAdmin):
    """A run and its decisions hold what each prune took away (the restore state): read only
    for everyone, never deleted here."""

    list_display = ("id", "cluster", "mode", "status", "evaluated_at", "pods_seen", "busy_pods",
                    "idle_candidates", "planned", "acted", "failed", "kube_api_calls", "duration_seconds")
    list_filter = ("cluster", "mode", "status")
    date_hierarchy = "evaluated_at"
    readonly_fields = [f.name for f in PruneRun._meta.fields if f.name != "skip_counts"] + [
        "skipped_by_reason", "utilization_charts"]
    exclude = ("skip_counts",)   # shown as "pods skipped, per reason"
    inlines = [DecisionInline]

    class Media:
        js = CHART_JS   # draws the utilization charts (vendored Chart.js, works offline)

    @admin.display(description="pods skipped, per reason")
    def skipped_by_reason(self, run: PruneRun):
        counts = sorted((run.skip_counts or {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if not counts:
            return "none"
        total = sum(n for _, n in counts)
        return format_html('<span id="skip-counts">{} pods: {}</span>', total,
                           format_html_join(", ", "{} {}", ((reason, n) for reason, n in counts)))

    @admin.display(description="GPU utilization of each decided pod over the window")
    def utilization_charts(self, run: PruneRun):
        decisions = list(run.decisions.all())
        if not decisions:
            return "no pod looked idle in this run"
        window = int(run.parameters.get("window_seconds", 1800))
        threshold = float(run.parameters.get("idle_threshold", 0.01))
        try:
            history = selectors.utilization_history(
                prometheus=services.prometheus_for(cluster=run.cluster), run=run,
                pods=[(d.namespace, d.pod) for d in decisions])
        except PrometheusError as exc:
            return format_html("charts unavailable: {}", exc)
        end = run.evaluated_at.timestamp()
        rows = ((d.namespace, d.pod if d.count == 1 else f"{d.pod} (+{d.count - 1} more)",
                 d.get_decision_display(), d.reason,
                 sparkline(history.get((d.namespace, d.pod), []), start=end - window, end=end,
                           threshold=threshold))
                for d in decisions)
        body = format_html_join("", "<tr><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        return format_html('<table class="prune-charts"><thead><tr><th>pod</th><th>decision</th>'
                           '<th>reason</th><th>utilization (dashed: idle threshold)</th></tr></thead>'
                           "<tbody>{}</tbody></table>", body)


@admin.register(PruneDecision)
class PruneDecisionAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, JsonAsTablesMixin, admin.ModelAdmin):
    # The owner's kind and name share a column: with whole words in every cell, fourteen
    # columns did not fit beside the filters at 1366 px.
    list_display = ("run", "namespace", "pod", "count", "owner", "decision", "reason", "method",
                    "max_utilization", "result", "event_sent", "restore")
    list_filter = ("decision", "reason", "result", "restore", "owner_kind", "method", "run__cluster", "run__mode")
    search_fields = ("namespace", "pod", "owner_name")
    readonly_fields = [f.name for f in PruneDecision._meta.fields]
    actions = ["restore_selected"]

    @admin.display(description="owner", ordering="owner_name")
    def owner(self, decision: PruneDecision) -> str:
        return f"{decision.owner_kind} {decision.owner_name}"

    # The restore writes to the cluster: viewing decisions is not enough for it. The model's
    # change permission is what operators who restore hold; it edits no decision (the admin
    # has no change permission on one for anybody).
    def has_restore_permission(self, request) -> bool:
        return request.user.has_perm("pruning.change_prunedecision")

    @admin.action(description="Restore: put back what the prune took away", permissions=["restore"])
    def restore_selected(self, request, queryset):
        selected = list(queryset.select_related("run__cluster"))
        if request.POST.get("confirm") != "yes":
            return self._restore_confirm(request, selected)   # starting pods again is asked first
        done = changed = asleep = already = not_acted = failed = 0
        for decision in selected:
            if decision.restore == PruneDecision.Restore.RESTORED:
                already += 1
                continue
            if not decision.restorable:
                not_acted += 1   # a skip, a dry run, a failed action: nothing was taken away
                continue
            cluster = decision.run.cluster
            if cluster is None:
                failed += 1
                self.message_user(request, f"{decision}: its run has no cluster", messages.ERROR)
                continue
            try:
                result = services.prune_decision_restore(
                    kube_gateway=gateway_for(cluster), decision=decision,
                    actor=request.user.get_username(), now=clock.now())
            except (KubeError, ValueError) as exc:
                failed += 1
                self.message_user(request, f"{decision}: {exc}", messages.ERROR)
                continue
            if result.restore == PruneDecision.Restore.RESTORED:
                done += 1
            elif result.restore == PruneDecision.Restore.CHANGED:
                changed += 1
                self.message_user(request, f"{decision}: {result.error}", messages.WARNING)
            elif result.restore == PruneDecision.Restore.NONE:
                # Its org's dormancy keeps it at zero: left asleep on purpose, still restorable.
                asleep += 1
                self.message_user(request, f"{decision}: {result.error}", messages.WARNING)
            else:
                failed += 1
                self.message_user(request, f"{decision}: {result.error}", messages.ERROR)
        # Django's admin shows messages through `capfirst`: lead with the count so the
        # verbs read as written. Every selected row is counted once, under one heading.
        parts = [f"restored {done}", f"left alone {changed} changed since the prune"]
        if asleep:
            parts.append(f"{asleep} kept asleep by their org's dormancy (restore them once the org is awake)")
        if already:
            parts.append(f"{already} already restored")
        if not_acted:
            parts.append(f"{not_acted} never scaled to zero by a prune (nothing to restore)")
        if failed:
            parts.append(f"{failed} failed")
        level = messages.ERROR if failed else messages.WARNING if (changed or asleep) else messages.SUCCESS
        self.message_user(request, f"{len(selected)} selected: {'; '.join(parts)}", level)

    def _restore_confirm(self, request, selected: list[PruneDecision]) -> TemplateResponse:
        """The page before a restore: each selected decision, what confirming does to it."""
        now = clock.now()
        outlook: dict[str, list] = {"restore": [], "asleep": [], "left": []}
        for decision in selected:
            group, words = self._restore_outlook(decision, now=now)
            outlook[group].append(words)
        return TemplateResponse(request, "pruning/restore_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, **outlook,
            "title": f"Restore what the pruner scaled to zero? ({len(selected)} selected)",
            "selected": [str(d.pk) for d in selected], "action": "restore_selected",
            "cancel_url": reverse("admin:pruning_prunedecision_changelist")})

    @staticmethod
    def _restore_outlook(decision: PruneDecision, *, now) -> tuple[str, str]:
        """("restore" | "asleep" | "left", what confirming does to `decision`). Whether its
        org keeps it asleep is read from the owner as it is now; the restore reads it again."""
        workload = f"{decision.owner_kind} {decision.namespace}/{decision.owner_name}"
        if decision.restore == PruneDecision.Restore.RESTORED:
            return "left", f"{workload}: already restored by {decision.restored_by or 'the schedule'}"
        if not decision.restorable:
            return "left", f"{decision}: never scaled to zero by a prune, nothing to restore"
        cluster = decision.run.cluster
        if cluster is None:
            return "left", f"{workload}: its prune run has no cluster, it cannot be restored"
        back = f"{workload}: back to {state_text(decision.restore_state)}"
        try:
            asleep = selectors.restore_kept_asleep(decision, now=now)
        except KubeError as exc:
            return "restore", format_html("{} (it cannot be read now: {}; if its org keeps it asleep when it is "
                                           "restored, it is left asleep)", back, exc)
        if not asleep:
            return "restore", back
        if decision.method == M_KNATIVE_MIN_SCALE:
            return "asleep", (f"{workload}: {asleep}. The pruner's min-scale 0 is withdrawn and the owner's values "
                              "are recorded for that wake: no pod starts now")
        return "asleep", f"{workload}: {asleep}. Left at zero: restore it once the org is awake"
