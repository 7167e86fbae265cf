"""Operators' view of orgs: dormancy state, history, and the acts each needing its own permission."""
from __future__ import annotations

from django.contrib import admin, messages

from config import clock
from config.actors import actor_describe
from orgs import services
from orgs.models import ActivityToken, AuditRecord, DormancySwitch, Org


class DormancySwitchInline(admin.TabularInline):
    model = DormancySwitch
    extra = 0
    can_delete = False
    fields = ("at", "direction", "cause", "by", "patched", "errors", "applied_at")
    readonly_fields = fields
    ordering = ("-at", "-id")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="by")
    def by(self, switch: DormancySwitch) -> str:
        return actor_describe(switch.actor, switch.actor_label)


@admin.register(Org)
class OrgAdmin(admin.ModelAdmin):
    list_display = ("slug", "cluster", "namespace", "dormant", "scale_to_zero_allowed", "last_activity_at",
                    "dormant_since", "scale_to_zero_state", "has_drift", "reconciled_at")
    list_filter = ("dormant", "scale_to_zero_allowed", "applied", "cluster")
    search_fields = ("slug", "namespace")
    readonly_fields = ("dormant", "dormant_since", "last_activity_at", "scale_to_zero_state", "applied", "pending",
                       "drift", "last_error", "reconciled_at", "mechanism", "knative_lever", "created_at",
                       "scale_to_zero_allowed")
    inlines = [DormancySwitchInline]
    actions = ["disallow_scale_to_zero", "allow_scale_to_zero", "mark_active_now", "run_dormancy_sweep_now"]

    @admin.display(boolean=True, description="drift")
    def has_drift(self, org: Org) -> bool:
        return bool(org.drift or org.last_error)

    @admin.display(description="scale to zero on the cluster")
    def scale_to_zero_state(self, org: Org) -> str:
        """What really holds, not what is meant: the org row is the intent."""
        wanted = org.wanted
        if org.pending:
            return f"partial: {wanted} not yet on {len(org.pending)} part(s), retried every minute"
        if org.applied == wanted:
            return f"{wanted} on all workloads"
        if not org.applied:
            return f"not applied yet ({wanted} wanted)"
        return f"{org.applied} holds; {wanted} wanted, being applied"

    @admin.display(description="Knative lever of the cluster")
    def knative_lever(self, org: Org) -> str:
        cluster = org.cluster
        if not cluster.knative_lever:
            return "not chosen yet (chosen at the first apply)"
        return f"{cluster.knative_lever}: {cluster.knative_lever_reason}"

    def _has(self, request, codename: str) -> bool:
        return request.user.has_perm(f"orgs.{codename}")

    def has_disallow_scale_to_zero_permission(self, request) -> bool:
        return self._has(request, "disallow_scale_to_zero")

    def has_allow_scale_to_zero_permission(self, request) -> bool:
        return self._has(request, "allow_scale_to_zero")

    def has_mark_active_permission(self, request) -> bool:
        return self._has(request, "mark_active")

    def has_run_dormancy_sweep_permission(self, request) -> bool:
        return self._has(request, "run_dormancy_sweep")

    def _allow(self, request, queryset, allowed: bool) -> None:
        now = clock.now()
        for org in queryset.select_related("cluster"):
            outcome = services.org_scale_to_zero_allow(org=org, allowed=allowed, actor=request.user, now=now)
            if outcome is not None and not outcome.complete:
                self.message_user(request, f"{outcome.summary()}; retried every minute", messages.WARNING)
            elif outcome is not None:
                self.message_user(request, f"{org}: {len(outcome.patched)} workload(s) patched")
        self.message_user(request, f"scale to zero {'allowed' if allowed else 'disallowed'} for "
                                   f"{queryset.count()} org(s)")

    @admin.action(permissions=["disallow_scale_to_zero"], description="Disallow scale to zero (and revert now)")
    def disallow_scale_to_zero(self, request, queryset) -> None:
        self._allow(request, queryset, False)

    @admin.action(permissions=["allow_scale_to_zero"], description="Allow scale to zero")
    def allow_scale_to_zero(self, request, queryset) -> None:
        self._allow(request, queryset, True)

    @admin.action(permissions=["mark_active"], description="Mark active now")
    def mark_active_now(self, request, queryset) -> None:
        now = clock.now()
        results = [services.org_mark_active_now(org=org, actor=request.user, now=now) for org in queryset]
        woke = [r.org for r in results if r.woke]
        self.message_user(request, f"marked active; woke {', '.join(woke) or 'none (all were active)'}")
        for result in results:
            if result.queued is False:
                self.message_user(request, result.describe(), messages.WARNING)

    @admin.action(permissions=["run_dormancy_sweep"], description="Run the dormancy sweep now (all orgs)")
    def run_dormancy_sweep_now(self, request, queryset) -> None:
        result = services.dormancy_sweep(now=clock.now(), actor=request.user)
        self.message_user(request, f"sweep: {len(result.switched)} org(s) turned dormant: "
                                   f"{', '.join(result.switched) or 'none'}")


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ("at", "action", "cause", "by", "org")
    list_filter = ("action",)
    search_fields = ("org__slug", "action", "cause", "actor_label")
    readonly_fields = ("at", "action", "cause", "actor", "actor_label", "org", "old", "new")

    @admin.display(description="by", ordering="actor")
    def by(self, record: AuditRecord) -> str:
        return actor_describe(record.actor, record.actor_label)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ActivityToken)
class ActivityTokenAdmin(admin.ModelAdmin):
    """Tokens are issued with `manage.py issue_activity_token` (shown once); here they are revoked."""

    list_display = ("caller", "user", "active", "created_at")
    fields = ("caller", "user", "active", "created_at")
    readonly_fields = ("caller", "user", "created_at")

    def has_add_permission(self, request) -> bool:
        return False
