"""Admin for consolidation campaigns: the campaign page (the plan it started from, each node's
progress with its defrag job, the kept-empty nodes, the audit) and the abort with its
confirmation. Campaigns are records: never added, edited or deleted here. Pool policies
(when a proposal starts on its own) are settings: edited here by an operator with
capacity.change_campaignpolicy, every change audited."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from audit.selectors import entries_of_subject
from clusters.errors import KubeError
from config import clock
from config.actors import actor_describe
from config.admin_display import ReadOnlyAdminMixin, actor_display, json_table
from config.admin_lookups import ListFiltersCheckedMixin

from capacity.campaigns.models import (Campaign, CampaignPolicy, CampaignProposal, CampaignRehearsal, CampaignState,
                                       NodeRole, NodeState)
from capacity.campaigns.planning import CampaignInputError, CampaignPlan, pool_selector_parse, pool_selector_text
from capacity.campaigns.policy import PolicyInputError, duration_parse, nodes_check, schedule_check
from capacity.campaigns.pools import consolidate_command
from capacity.campaigns.selectors import campaign_nodes, pool_nodes_read
from capacity.campaigns.services import (
    CampaignError,
    campaign_abort,
    campaign_policy_delete,
    campaign_policy_save,
)


@admin.register(Campaign)
class CampaignAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "cluster", "pool", "state", "nodes_freed", "asked_by", "created_at", "finished_at"]
    list_filter = ["state", "cluster"]
    readonly_fields = [f.name for f in Campaign._meta.fields]
    # The page draws the plan, the nodes' progress and the audit above these; what is left
    # is who and when, then folded, what a worker keeps for itself.
    fieldsets = [
        ("The campaign", {"fields": ["cluster", "state", "max_in_flight", "drain_when_safe", "source",
                                     "requested_by", "requested_by_label", "created_at", "finished_at"]}),
        ("Internals: the stored plan, abort request, lease and record-keeping", {
            "classes": ["collapse"],
            "fields": ["plan", "selector", "goal", "version", "error", "next_check_at", "abort_requested_at",
                       "abort_requested_by", "abort_requested_label", "lease_owner", "lease_expires_at",
                       "updated_at"]}),
    ]
    change_form_template = "capacity/campaign_change_form.html"

    asked_by = actor_display("requested_by", "requested_by_label", "asked by", ordering="requested_by")

    @admin.display(description="pool")
    def pool(self, obj) -> str:
        return pool_selector_text(obj.selector)

    @admin.display(description="nodes (safe or drained / planned)")
    def nodes_freed(self, obj) -> str:
        freed = obj.nodes.filter(role=NodeRole.FREED)
        return f"{freed.filter(state__in=['safe', 'drained']).count()} / {freed.count()}"

    def get_urls(self):
        own = [path("<int:pk>/abort/", self.admin_site.admin_view(self.abort_view), name="capacity_campaign_abort")]
        return own + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        campaign = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if campaign is not None:
            plan = CampaignPlan.from_dict(campaign.plan)
            moves = {n.node: n.moves for n in plan.nodes}
            rows = campaign_nodes(campaign=campaign)
            extra.update(
                plan=plan, pool=pool_selector_text(plan.selector), summary=plan.summary, left_out=plan.left_out,
                rows=[{"row": r, "moves": moves.get(r.node_name, ()),
                       "gpus": next((n.gpus for n in plan.nodes if n.node == r.node_name), "")} for r in rows],
                kept=campaign_nodes(campaign=campaign, role=NodeRole.KEPT_EMPTY),
                done_count=sum(1 for r in rows if r.state_now in (NodeState.SAFE, NodeState.DRAINED)),
                dropped_count=sum(1 for r in rows if r.state == NodeState.DROPPED),
                can_abort=request.user.has_perm("capacity.change_campaign") and campaign.is_live
                and not campaign.abort_requested_at,
                next_step=self._next_step(campaign, rows),
                audit_entries=[{"at": e.at, "action": e.action, "target": e.target, "cause": e.cause,
                                "by": actor_describe(e.actor, e.actor_label), "new": json_table(e.new)}
                               for e in entries_of_subject(subject_type="campaign", subject_id=campaign.pk,
                                                           oldest_first=True)])
        extra.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False)
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @staticmethod
    def _next_step(campaign: Campaign, rows) -> str:
        if campaign.state == CampaignState.RUNNING and campaign.abort_requested_at:
            return "Nothing to do: the abort is under way."
        if campaign.state == CampaignState.RUNNING:
            return "Nothing to do yet: a worker empties the nodes in order (Abort… ends the campaign)."
        if campaign.state == CampaignState.ABORTING:
            return "Nothing to do: the abort is under way."
        if campaign.state == CampaignState.DONE:
            # What the nodes are now: a safe node the operator drained after the campaign reads drained.
            safe = [r.node_name for r in rows if r.state_now == NodeState.SAFE]
            if safe:
                return (f"Done: {', '.join(safe)} {'stays' if len(safe) == 1 else 'stay'} cordoned with "
                        f"{'its' if len(safe) == 1 else 'their'} orphans serving; drain each (its defrag job's "
                        "Drain…) before removing it, or return it to service.")
            if any(r.state_now == NodeState.DRAINED for r in rows):
                return "Done: the drained nodes stay cordoned and empty until you remove them."
            return "Nothing left to do: the campaign freed no node (each row says why it was dropped)."
        return "Nothing left to do: the campaign was aborted; its defrag jobs finish their aborts on their own."

    def abort_view(self, request, pk: int):
        campaign = get_object_or_404(Campaign.objects.select_related("cluster"), pk=pk)
        if not request.user.has_perm("capacity.change_campaign"):
            raise PermissionDenied
        url = reverse("admin:capacity_campaign_change", args=[campaign.pk])
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            asked_before = campaign.abort_requested_at is not None or not campaign.is_live
            try:
                row = campaign_abort(campaign=campaign, actor=request.user)
            except CampaignError as exc:
                messages.error(request, str(exc))
            else:
                if asked_before:
                    messages.warning(request, f"Campaign #{row.pk} is already {row.state}"
                                              f"{' with its abort asked' if row.abort_requested_at else ''}: "
                                              "nothing new was asked")
                else:
                    messages.success(request, f"Abort of campaign #{row.pk} requested: a worker aborts its defrag "
                                              "jobs and uncordons the nodes it cordoned")
            return HttpResponseRedirect(url)
        rows = campaign_nodes(campaign=campaign) + campaign_nodes(campaign=campaign, role=NodeRole.KEPT_EMPTY)
        return TemplateResponse(request, "capacity/campaign_abort_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "campaign": campaign,
            "uncordoned": [r.node_name for r in rows if r.cordoned_by_campaign and not r.uncordoned],
            "jobs": [r for r in rows if r.job is not None and r.job.is_live],
            "title": f"Abort campaign #{campaign.pk}?"})


@admin.register(CampaignProposal)
class CampaignProposalAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Advice computed on a schedule: shown, never added, changed or deleted here."""

    list_display = ("id", "cluster", "pool", "computed_at", "freed", "gpus_freed", "pods_moved", "most_freeable",
                    "rehearsed_shown")
    list_filter = ("cluster", "pool")
    date_hierarchy = "computed_at"
    fields = ("cluster", "pool", "selector", "scoring", "computed_at", "freed", "gpus_freed", "pods_moved",
              "lower_bound", "rehearsed_shown", "command", "report")
    readonly_fields = fields

    @admin.display(description="at most freeable")
    def most_freeable(self, row: CampaignProposal) -> int:
        return row.campaign.most_freeable

    @admin.display(description="rehearsed", ordering="rehearsed")
    def rehearsed_shown(self, row: CampaignProposal) -> str:
        if not row.rehearsed or row.rehearsal_id is None:
            return "no"
        url = reverse("admin:capacity_campaignrehearsal_change", args=[row.rehearsal_id])
        return format_html('yes: <a href="{}">rehearsal #{}</a>', url, row.rehearsal_id)

    @admin.display(description="command that runs it")
    def command(self, row: CampaignProposal) -> str:
        return format_html("<code>{}</code>", consolidate_command(cluster=row.cluster.name, selector=row.selector))

    @admin.display(description="plan")
    def report(self, row: CampaignProposal) -> str:
        return format_html("<pre>{}</pre>", "\n".join(row.campaign.report_lines()))


@admin.register(CampaignRehearsal)
class CampaignRehearsalAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """A campaign run on a copy of a cluster loaded from a dump: a record, shown and never added,
    changed or deleted here."""

    list_display = ("id", "cluster", "pool", "state", "freed_shown", "time_to_all_safe", "asked_by", "started_at")
    list_filter = ("state", "cluster")
    date_hierarchy = "started_at"
    fields = ("cluster", "state", "pool", "goal", "max_in_flight", "drain_when_safe", "scoring", "dump_path",
              "dump_sha256", "dump_nodes", "dump_pods", "freed_shown", "simulated_seconds", "time_to_all_safe",
              "error", "requested_by", "requested_by_label", "started_at", "finished_at", "copy_cluster",
              "campaign_link", "plan_report", "outcome_report")
    readonly_fields = fields

    asked_by = actor_display("requested_by", "requested_by_label", "asked by", ordering="requested_by")

    @admin.display(description="pool")
    def pool(self, row: CampaignRehearsal) -> str:
        return pool_selector_text(row.selector)

    @admin.display(description="freed / planned")
    def freed_shown(self, row: CampaignRehearsal) -> str:
        return f"{row.freed if row.freed is not None else '-'} / {row.planned}"

    @admin.display(description="time to all safe (simulated)")
    def time_to_all_safe(self, row: CampaignRehearsal) -> str:
        if row.seconds_to_all_safe is None:
            return "not all safe" if row.state == "done" else "-"
        minutes, secs = divmod(round(row.seconds_to_all_safe), 60)
        return f"{minutes} min {secs} s" if minutes else f"{secs} s"

    @admin.display(description="campaign on the copy")
    def campaign_link(self, row: CampaignRehearsal) -> str:
        if row.campaign_id is None:
            return "-"
        return format_html('<a href="{}">campaign #{}</a>',
                           reverse("admin:capacity_campaign_change", args=[row.campaign_id]), row.campaign_id)

    @admin.display(description="plan")
    def plan_report(self, row: CampaignRehearsal) -> str:
        if not row.plan:
            return "-"
        return format_html("<pre>{}</pre>", "\n".join(CampaignPlan.from_dict(row.plan).report_lines()))

    @admin.display(description="outcome")
    def outcome_report(self, row: CampaignRehearsal) -> str:
        if not row.outcome:
            return "-"
        return format_html("<pre>{}</pre>", "\n".join(row.outcome.get("report_lines", [])))


POLICY_PERMISSION = "capacity.change_campaignpolicy"


class CampaignPolicyForm(forms.ModelForm):
    """Every value checked as Karpenter checks a disruption budget's, and the pool against the
    cluster as it is now; an error names its field and nothing is saved."""

    user = None   # the operator editing (set by the admin's get_form)

    class Meta:
        model = CampaignPolicy
        fields = ["cluster", "selector", "enabled", "schedule", "duration", "nodes", "max_in_flight",
                  "drain_when_safe"]

    def _checked(self, name: str, check):
        try:
            return check(self.cleaned_data.get(name) or "")
        except PolicyInputError as exc:
            raise forms.ValidationError(f"{exc}") from None

    def clean_selector(self) -> str:
        text = self.cleaned_data.get("selector") or ""
        try:
            return pool_selector_text(pool_selector_parse(text))
        except CampaignInputError:
            raise forms.ValidationError(f"{text.strip()!r} is not a pool: give node labels as KEY=VALUE[,KEY=VALUE], "
                                        "e.g. karpenter.sh/nodepool=h100") from None

    def clean_schedule(self) -> str:
        return self._checked("schedule", schedule_check) if (self.cleaned_data.get("schedule") or "").strip() else ""

    def clean_duration(self) -> str:
        text = (self.cleaned_data.get("duration") or "").strip()
        if text:
            self._checked("duration", duration_parse)
        return text

    def clean_nodes(self) -> str:
        return self._checked("nodes", nodes_check)

    def clean_max_in_flight(self) -> int:
        value, limit = self.cleaned_data.get("max_in_flight"), settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
        if value is not None and not 1 <= value <= limit:
            raise forms.ValidationError(f"{value} nodes at once: from 1 to the defrag jobs a cluster may run at "
                                        f"once ({limit}, CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER)")
        return value

    def clean(self):
        data = super().clean()
        if bool(data.get("schedule")) != bool(data.get("duration")) and not (
                self.has_error("schedule") or self.has_error("duration")):
            missing = "duration" if data.get("schedule") else "schedule"
            self.add_error(missing, f"a {missing} is set with the {'schedule' if missing == 'duration' else 'duration'}"
                                    " (both, or neither for a window open whenever enabled)")
        if data.get("drain_when_safe") and not (self.instance.pk and self.instance.drain_when_safe) and not (
                self.user is not None and self.user.has_perm("capacity.drain_defragjob")):
            self.add_error("drain_when_safe", f"user {self.user} may not drain nodes (needs "
                                              "capacity.drain_defragjob): leave drain when safe off")
        cluster, selector = data.get("cluster"), data.get("selector")
        if cluster is not None and selector and not self.has_error("selector"):
            try:
                nodes, pools = pool_nodes_read(cluster=cluster, selector=pool_selector_parse(selector),
                                               now=clock.now())
            except KubeError as exc:
                self.add_error("selector", f"cluster {cluster.name} could not be read to check the pool: {exc}")
            else:
                if not nodes:
                    self.add_error("selector", f"{selector} selects no GPU node of cluster {cluster.name}")
                elif selector not in pools.values():
                    self.add_error("selector", f"{selector} selects {len(nodes)} GPU node(s) of cluster "
                                               f"{cluster.name} but is not a pool the proposals name; its pools: "
                                               f"{', '.join(sorted(pools.values())) or 'none'}")
        return data


@admin.register(CampaignPolicy)
class CampaignPolicyAdmin(ListFiltersCheckedMixin, admin.ModelAdmin):
    """Settings: added, changed and removed by an operator with the permission; each change
    audited (old and new values), shown below the form with the schedule's acts."""

    form = CampaignPolicyForm
    list_display = ("cluster", "selector", "enabled", "schedule", "duration", "nodes", "max_in_flight",
                    "changed_by", "last_act_at")
    list_filter = ("cluster", "enabled")
    readonly_fields = ("acting_now", "changed_by", "changed_at", "last_act_at", "last_act", "history")
    fieldsets = [
        (None, {"fields": ["cluster", "selector", "enabled", "acting_now"]}),
        ("Window (UTC, as a Karpenter disruption budget)", {"fields": ["schedule", "duration"]}),
        ("Budgets", {"fields": ["nodes", "max_in_flight", "drain_when_safe"]}),
        ("Who changed it, and what the schedule did", {"fields": ["changed_by", "changed_at", "last_act_at",
                                                                   "last_act", "history"]}),
    ]

    def _may_change(self, request) -> bool:
        return request.user.has_perm(POLICY_PERMISSION)

    def has_add_permission(self, request) -> bool:
        return self._may_change(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self._may_change(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._may_change(request)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"user": request.user})

    def save_model(self, request, obj, form, change) -> None:
        campaign_policy_save(policy=obj, actor=request.user)

    def delete_model(self, request, obj) -> None:
        campaign_policy_delete(policy=obj, actor=request.user)

    def delete_queryset(self, request, queryset) -> None:
        for obj in queryset:
            campaign_policy_delete(policy=obj, actor=request.user)

    @admin.display(description="as the dashboard says it")
    def acting_now(self, obj) -> str:
        if obj is None or obj.pk is None:
            return "—"
        proposal = (CampaignProposal.objects.filter(cluster=obj.cluster, selector=pool_selector_parse(obj.selector))
                    .order_by("-computed_at").first())
        if proposal is None:
            return "no proposal for the pool yet: its nodes are counted at the next reading of the cluster"
        return obj.terms.words(pool_nodes=proposal.campaign.pool_nodes, now=clock.now())

    @admin.display(description="changes and acts")
    def history(self, obj) -> str:
        if obj is None or obj.pk is None:
            return "—"
        entries = entries_of_subject(subject_type="campaign_policy", subject_id=obj.pk, oldest_first=False)
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (f"{e.at:%Y-%m-%d %H:%M}", e.action, actor_describe(e.actor, e.actor_label), json_table(e.old),
             json_table(e.new)) for e in entries[:50]))
        return format_html('<table class="policy-history"><tr><th>at</th><th>what</th><th>by</th><th>before</th>'
                           "<th>after</th></tr>{}</table>", rows) if entries else "—"
