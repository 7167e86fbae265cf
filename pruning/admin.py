"""Admin: prune runs (with per-pod utilization charts), decisions and their restore."""
from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from clusters.errors import KubeError, PrometheusError
from config.admin_display import JsonAsTablesMixin

from . import selectors, services
from .charts import CHART_JS, sparkline
from .models import PruneDecision, PruneRun


class DecisionInline(JsonAsTablesMixin, admin.TabularInline):
    model = PruneDecision
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("namespace", "pod", "count", "owner_kind", "owner_name", "decision", "reason", "max_utilization",
              "effect", "result", "restore")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(PruneRun)
class PruneRunAdmin(JsonAsTablesMixin, admin.ModelAdmin):
    list_display = ("id", "cluster", "mode", "status", "evaluated_at", "pods_seen", "busy_pods",
                    "idle_candidates", "planned", "acted", "failed", "kube_api_calls", "duration_seconds")
    list_filter = ("cluster", "mode", "status")
    date_hierarchy = "evaluated_at"
    readonly_fields = [f.name for f in PruneRun._meta.fields if f.name != "skip_counts"] + [
        "skipped_by_reason", "utilization_charts"]
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

    def has_add_permission(self, request):
        return False

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
class PruneDecisionAdmin(JsonAsTablesMixin, admin.ModelAdmin):
    list_display = ("run", "namespace", "pod", "count", "owner_kind", "owner_name", "decision", "reason", "method",
                    "max_utilization", "result", "event_sent", "restore")
    list_filter = ("decision", "reason", "result", "restore", "owner_kind", "method", "run__cluster", "run__mode")
    search_fields = ("namespace", "pod", "owner_name")
    readonly_fields = [f.name for f in PruneDecision._meta.fields]
    actions = ["restore_selected"]

    def has_add_permission(self, request):
        return False

    # The restore writes to the cluster: viewing decisions is not enough for it. The model's
    # change permission is what operators who restore already hold (no field of a decision
    # is editable in the admin, so it grants nothing else here).
    @admin.action(description="Restore: put back what the prune took away", permissions=["change"])
    def restore_selected(self, request, queryset):
        from clusters.kube import gateway_for
        from config import clock

        done = changed = asleep = already = not_acted = failed = 0
        selected = list(queryset.select_related("run__cluster"))
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
