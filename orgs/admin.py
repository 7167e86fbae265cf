"""Operators' view of orgs: dormancy state, history, exemptions and snoozes, and the acts
each needing its own permission. An act on several orgs shows first, on a confirmation
page, what it would change on each org and its workloads (planned, nothing written)."""
from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from clusters.selectors import clusters_all
from config import clock
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin, actor_display
from config.admin_lookups import ListFiltersCheckedMixin
from config.admin_records import RetireInsteadOfDeleteMixin
from orgs import planning, retirement, selectors, services, tokens
from orgs.models import ActivityToken, DormancySwitch, Org, WorkloadExemption

SNOOZE_CHOICES = (("24h", "snooze for 24 hours"), ("7d", "snooze for 7 days"),
                  ("until", "snooze until a time (UTC)"), ("exempt", "exempt until removed"))
SNOOZE_DURATIONS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}


class HoldFormMixin(forms.Form):
    """How long, and why: the same choices for an org and for one workload."""

    hold = forms.ChoiceField(choices=SNOOZE_CHOICES, initial="24h", widget=forms.RadioSelect,
                             label="For how long")
    until_time = forms.DateTimeField(required=False, label="Until (UTC)",
                                     help_text="Only with “snooze until a time”, e.g. 2026-12-01 18:00.")
    reason = forms.CharField(max_length=200, help_text="Why; shown beside the exemption and kept in the audit.")

    def clean(self):
        data = super().clean()
        choice, now = data.get("hold"), clock.now()
        try:
            if choice == "exempt":
                data["until"] = None
            elif choice in SNOOZE_DURATIONS:
                data["until"] = planning.snooze_until(now=now, duration=SNOOZE_DURATIONS[choice])
            elif choice == "until":
                if data.get("until_time") is None:
                    self.add_error("until_time", "give the time the snooze ends")
                else:
                    data["until"] = planning.snooze_until(now=now, until=data["until_time"])
        except ValueError as exc:
            self.add_error("until_time", str(exc))
        return data


class OrgHoldForm(HoldFormMixin):
    pass


class ExemptionFilter(admin.SimpleListFilter):
    title = "exemption"
    parameter_name = "held"

    def lookups(self, request, model_admin):
        return (("exempt", "exempt"), ("snoozed", "snoozed now"), ("any", "exempt or snoozed"),
                ("none", "neither"))

    def queryset(self, request, queryset):
        now = clock.now()
        snoozed = Q(exempt=False, snoozed_until__gt=now)
        held = Q(exempt=True) | snoozed
        return {"exempt": queryset.filter(exempt=True), "snoozed": queryset.filter(snoozed),
                "any": queryset.filter(held), "none": queryset.exclude(held)}.get(self.value(), queryset)


def _hold_text(hold, now) -> str:
    if hold is None:
        return "—"
    return hold.describe(now)


class DormancySwitchInline(ReadOnlyAdminMixin, JsonAsTablesMixin, admin.TabularInline):
    model = DormancySwitch
    extra = 0
    can_delete = False
    fields = ("at", "direction", "cause", "by", "patched", "errors", "applied_at")
    readonly_fields = fields
    ordering = ("-at", "-id")

    by = actor_display("actor", "actor_label", "by")


@admin.display(description="exemption")
def workload_exemption_state(self, exemption: WorkloadExemption) -> str:
    return exemption.hold().describe(clock.now())


class WorkloadExemptionInline(admin.TabularInline):
    model = WorkloadExemption
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("kind", "name", "state", "created_at", "set_by")
    readonly_fields = fields
    verbose_name = "workload exempt or snoozed"
    verbose_name_plural = "workloads exempt or snoozed (models and pynodes)"

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    state = workload_exemption_state
    set_by = actor_display("created_by", "actor_label", "set by")


def _org_retire(*, obj: Org, actor, now) -> str:
    return retirement.org_retire(org=obj, actor=actor, now=now).describe()


def _org_delete(*, obj: Org, actor, now) -> None:
    retirement.org_delete(org=obj, actor=actor, now=now)


class OrgForm(forms.ModelForm):
    """An org is registered for a namespace the cluster has: the namespace is read first."""

    class Meta:
        model = Org
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "cluster" in self.fields:
            self.fields["cluster"].queryset = clusters_all()   # in service: none that is retired

    def clean_slug(self):
        # Unique among orgs in service: a conditional constraint on a column the form does
        # not show (retired_at), which Django's form validation skips; checked here.
        slug = self.cleaned_data["slug"]
        if Org.objects.filter(slug=slug).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError("An org in service already has this slug.")
        return slug

    def clean(self):
        data = super().clean()
        cluster, namespace = data.get("cluster"), data.get("namespace")
        if cluster is not None and namespace and \
                Org.objects.filter(cluster=cluster, namespace=namespace).exclude(pk=self.instance.pk).exists():
            self.add_error("namespace", "An org in service already has this namespace on this cluster.")
        if cluster is None or not namespace or self.errors or not {"cluster", "namespace"} & set(self.changed_data):
            return data
        presence = selectors.namespace_presence(cluster=cluster, namespace=namespace)
        if presence.found is not True:
            self.add_error("namespace" if presence.found is False else None,
                           f"{presence.said}: nothing was saved. An org is registered for a namespace of its "
                           "cluster (create the namespace first, or check its name).")
        return data


@admin.register(Org)
class OrgAdmin(RetireInsteadOfDeleteMixin, ListFiltersCheckedMixin, JsonAsTablesMixin, admin.ModelAdmin):
    # Words, not Django's boolean icons: its red ✖ would mark the normal states (active, no drift).
    list_display = ("slug", "cluster", "namespace", "dormancy", "scale_to_zero", "exemption_state",
                    "last_activity_at", "dormant_since", "scale_to_zero_state", "has_drift", "reconciled_at")
    list_filter = ("dormant", "scale_to_zero_allowed", ExemptionFilter, "applied", "cluster")
    search_fields = ("slug", "namespace")
    # The page shows dormancy and scale to zero in words too (the list's columns), not as the
    # booleans' icons; the actions change them, never the form.
    readonly_fields = ("dormancy", "dormant_since", "last_activity_at", "exemption", "scale_to_zero_state", "applied",
                       "pending", "pending_since", "drift", "last_error", "reconciled_at", "mechanism", "knative_lever",
                       "created_at", "scale_to_zero")
    exclude = ("exempt", "snoozed_until", "exemption_reason", "dormant", "scale_to_zero_allowed")
    inlines = [WorkloadExemptionInline, DormancySwitchInline]
    actions = ["disallow_scale_to_zero", "allow_scale_to_zero", "mark_active_now", "run_dormancy_sweep_now",
               "exempt_or_snooze", "end_exemption"]
    retire_service = _org_retire
    delete_service = _org_delete
    form = OrgForm

    @admin.display(description="dormant", ordering="dormant")
    def dormancy(self, org: Org) -> str:
        return "dormant" if org.dormant else "active"

    @admin.display(description="scale to zero", ordering="scale_to_zero_allowed")
    def scale_to_zero(self, org: Org) -> str:
        return "allowed" if org.scale_to_zero_allowed else "turned off"

    @admin.display(description="drift")
    def has_drift(self, org: Org) -> str:
        if org.last_error:
            return format_html("<strong>{}</strong>", "⚠ error")
        if org.drift:
            return format_html("<strong>⚠ drift: {} part(s)</strong>", len(org.drift))
        return "none"

    @admin.display(description="exempt / snoozed")
    def exemption_state(self, org: Org) -> str:
        hold = org.hold()
        if hold is None:
            return "—"
        now = clock.now()
        if hold.until is None:
            return "exempt"
        if not hold.active(now):
            return "snooze ended"
        return f"snoozed, {planning.duration_words(hold.until - now)} left"

    @admin.display(description="exemption from dormancy and pruning")
    def exemption(self, org: Org) -> str:
        now = clock.now()
        text = _hold_text(org.hold(), now)
        if org.pk is None:
            return text
        add = reverse("admin:orgs_workloadexemption_add") + f"?org={org.pk}"
        return format_html('{} <br><span class="help">The org: the actions “Exempt or snooze…” and “End the '
                           'exemption” of the org list. One model or pynode: <a href="{}">exempt or snooze a '
                           'workload of {}</a>.</span>', text, add, org.slug)

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

    def has_exempt_permission(self, request) -> bool:
        return self._has(request, "exempt")

    # --- preview, then act --------------------------------------------------------------------
    def _preview_then(self, request, queryset, *, act: str, title: str, apply, form_class=None):
        """Show what the act would change on each org (the scale-to-zero plan on a fresh
        read, nothing written); apply it only when the operator confirms that page."""
        confirmed = request.POST.get("confirm") == "yes"
        form = form_class(request.POST if confirmed else None) if form_class else None
        if confirmed and (form is None or form.is_valid()):
            apply(form.cleaned_data if form is not None else None)
            return None
        orgs = list(queryset.select_related("cluster"))
        context = {
            **self.admin_site.each_context(request),
            "title": title, "subtitle": None, "opts": self.model._meta, "act": act, "form": form,
            "previews": services.orgs_preview(orgs=orgs, act=act, now=clock.now()),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action_name": request.POST.get("action", ""), "select_across": request.POST.get("select_across", "0"),
            "whole_fleet": act == "sweep", "selected_count": len(orgs),
        }
        return TemplateResponse(request, "admin/orgs/org/action_preview.html", context)

    def _allow(self, request, queryset, allowed: bool) -> None:
        now = clock.now()
        word = "allowed" if allowed else "disallowed"
        changed, kept = 0, []
        for org in queryset.select_related("cluster"):
            if org.scale_to_zero_allowed == allowed:   # the service changes nothing on it
                kept.append(org.slug)
                continue
            outcome = services.org_scale_to_zero_allow(org=org, allowed=allowed, actor=request.user, now=now)
            changed += 1
            if outcome is not None and not outcome.complete:
                self.message_user(request, f"{outcome.summary()}; retried every minute", messages.WARNING)
            elif outcome is not None:
                self.message_user(request, f"{org}: {len(outcome.patched)} workload(s) patched")
        text = f"scale to zero {word} for {changed} org(s)"
        if kept:
            text += f"; left as they were (already {word}): {', '.join(sorted(kept))}"
        self.message_user(request, text)

    @admin.action(permissions=["disallow_scale_to_zero"], description="Disallow scale to zero (and revert now)…")
    def disallow_scale_to_zero(self, request, queryset):
        return self._preview_then(request, queryset, act="disallow", title="Disallow scale to zero: what changes",
                                  apply=lambda _: self._allow(request, queryset, False))

    @admin.action(permissions=["allow_scale_to_zero"], description="Allow scale to zero…")
    def allow_scale_to_zero(self, request, queryset):
        return self._preview_then(request, queryset, act="allow", title="Allow scale to zero: what changes",
                                  apply=lambda _: self._allow(request, queryset, True))

    def _mark_active(self, request, queryset) -> None:
        now = clock.now()
        results = [services.org_mark_active_now(org=org, actor=request.user, now=now) for org in queryset]
        woke = [r.org for r in results if r.woke]
        self.message_user(request, f"marked active; woke {', '.join(woke) or 'none (all were active)'}")
        for result in results:
            if result.queued is False:
                self.message_user(request, result.describe(), messages.WARNING)

    @admin.action(permissions=["mark_active"], description="Mark active now…")
    def mark_active_now(self, request, queryset):
        return self._preview_then(request, queryset, act="mark_active", title="Mark active now: what changes",
                                  apply=lambda _: self._mark_active(request, queryset))

    def _sweep(self, request) -> None:
        result = services.dormancy_sweep(now=clock.now(), actor=request.user)
        self.message_user(request, f"sweep: {len(result.switched)} org(s) turned dormant: "
                                   f"{', '.join(result.switched) or 'none'}")
        if result.queued is False:
            self.message_user(request, result.queue_failure(), messages.WARNING)

    @admin.action(permissions=["run_dormancy_sweep"], description="Run the dormancy sweep now (all orgs)…")
    def run_dormancy_sweep_now(self, request, queryset):
        return self._preview_then(request, queryset, act="sweep",
                                  title="Run the dormancy sweep now: the orgs it would mark dormant",
                                  apply=lambda _: self._sweep(request))

    def _hold(self, request, queryset, data) -> None:
        now = clock.now()
        for org in queryset:
            try:
                outcome = services.org_hold_set(org=org, until=data["until"], reason=data["reason"],
                                                actor=request.user, now=now)
            except ValueError as exc:
                self.message_user(request, f"{org}: {exc}; nothing changed", messages.ERROR)
                continue
            self.message_user(request, outcome.describe(), messages.WARNING if "could not" in outcome.message
                              else messages.SUCCESS)

    @admin.action(permissions=["exempt"], description="Exempt or snooze from dormancy and pruning…")
    def exempt_or_snooze(self, request, queryset):
        return self._preview_then(request, queryset, act="hold",
                                  title="Exempt or snooze from dormancy and pruning: what changes",
                                  apply=lambda data: self._hold(request, queryset, data), form_class=OrgHoldForm)

    def _hold_clear(self, request, queryset) -> None:
        now = clock.now()
        for org in queryset:
            self.message_user(request, services.org_hold_clear(org=org, actor=request.user, now=now).describe())

    @admin.action(permissions=["exempt"], description="End the exemption or snooze…")
    def end_exemption(self, request, queryset):
        return self._preview_then(request, queryset, act="hold_clear", title="End the exemption or snooze: what "
                                  "changes", apply=lambda _: self._hold_clear(request, queryset))


class WorkloadExemptionForm(HoldFormMixin, forms.ModelForm):
    not_deployed_yet = forms.BooleanField(
        required=False, label="Not deployed yet",
        help_text="Hold a workload that is not on the cluster yet: the hold applies when one of this name appears. "
                  "Otherwise the workload is read first, and a name the cluster does not have is refused.")

    class Meta:
        model = WorkloadExemption
        fields = ("org", "kind", "name")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "org" in self.fields:
            self.fields["org"].queryset = Org.objects.all()   # orgs in service: none that is retired

    def validate_unique(self) -> None:
        """Setting it again replaces the earlier exemption or snooze of the same workload."""

    def clean(self):
        data = super().clean()
        org, kind, name = data.get("org"), data.get("kind"), (data.get("name") or "").strip()
        if org is None or not kind or not name or self.errors or data.get("not_deployed_yet"):
            return data
        presence = selectors.workload_presence(org=org, kind=kind, name=name)
        if presence.found is not True:
            self.add_error("name" if presence.found is False else None,
                           f"{presence.said}: nothing was exempted or snoozed. Check the name, or tick “Not "
                           "deployed yet” to hold it until it appears.")
        return data


@admin.register(WorkloadExemption)
class WorkloadExemptionAdmin(ListFiltersCheckedMixin, admin.ModelAdmin):
    """Exempt or snooze one model or pynode; removing the row ends it. Both are audited and,
    on a dormant org, applied to the cluster at once."""

    form = WorkloadExemptionForm
    list_display = ("org", "kind", "name", "state", "set_by", "created_at")
    list_filter = ("kind", "org__cluster")
    search_fields = ("org__slug", "name", "reason")
    fields = ("org", "kind", "name", "not_deployed_yet", "hold", "until_time", "reason")
    autocomplete_fields = ("org",)

    state = workload_exemption_state
    set_by = actor_display("created_by", "actor_label", "set by")

    def get_fields(self, request, obj=None):
        if obj is not None:
            return ("org", "kind", "name", "state", "reason", "set_by", "created_at")
        return self.fields

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:
            return ("org", "kind", "name", "state", "reason", "set_by", "created_at")
        return ()

    def has_add_permission(self, request) -> bool:
        return request.user.has_perm("orgs.exempt")

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("orgs.exempt")

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("orgs.exempt") or super().has_view_permission(request, obj)

    def save_model(self, request, obj, form, change) -> None:
        data = form.cleaned_data
        outcome = services.workload_hold_set(org=data["org"], kind=data["kind"], name=data["name"],
                                             until=data["until"], reason=data["reason"], actor=request.user,
                                             now=clock.now(), not_deployed_yet=data["not_deployed_yet"])
        saved = WorkloadExemption.objects.get(org=data["org"], kind=data["kind"], name=data["name"])
        obj.pk, obj.created_at = saved.pk, saved.created_at
        level = messages.WARNING if outcome.waiting or (outcome.applied is not None and not outcome.applied.complete) \
            else messages.INFO
        self.message_user(request, outcome.describe(), level)

    def delete_model(self, request, obj) -> None:
        outcome = services.workload_hold_clear(exemption=obj, actor=request.user, now=clock.now())
        self.message_user(request, outcome.describe())

    def delete_queryset(self, request, queryset) -> None:
        for exemption in queryset.select_related("org"):
            self.delete_model(request, exemption)


@admin.register(ActivityToken)
class ActivityTokenAdmin(ListFiltersCheckedMixin, admin.ModelAdmin):
    """Tokens are issued with `manage.py issue_activity_token` (shown once); here they are revoked."""

    list_display = ("caller", "user", "active", "created_at")
    fields = ("caller", "user", "active", "created_at")
    readonly_fields = ("caller", "user", "created_at")

    def has_add_permission(self, request) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        if "active" in form.changed_data:
            tokens.activity_token_active_set(token=obj, active=obj.active, actor=request.user, now=clock.now())

    def delete_model(self, request, obj) -> None:
        tokens.activity_token_delete(token=obj, actor=request.user, now=clock.now())

    def delete_queryset(self, request, queryset) -> None:
        for token in queryset.select_related("user"):
            self.delete_model(request, token)
