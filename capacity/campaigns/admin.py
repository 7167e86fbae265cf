"""Admin for consolidation campaigns: the campaign page (the plan it started from, each node's
progress with its defrag job, the kept-empty nodes, the audit) and the abort with its
confirmation. Campaigns are records: never added, edited or deleted here."""
from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from audit.selectors import entries_of_subject
from config.actors import actor_describe
from config.admin_display import ReadOnlyAdminMixin, actor_display, json_table
from config.admin_lookups import ListFiltersCheckedMixin

from capacity.campaigns.models import (Campaign, CampaignProposal, CampaignRehearsal, CampaignState, NodeRole,
                                       NodeState)
from capacity.campaigns.planning import CampaignPlan, pool_selector_text
from capacity.campaigns.pools import consolidate_command
from capacity.campaigns.selectors import campaign_nodes
from capacity.campaigns.services import CampaignError, campaign_abort


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
                done_count=sum(1 for r in rows if r.state in (NodeState.SAFE, NodeState.DRAINED)),
                dropped_count=sum(1 for r in rows if r.state == NodeState.DROPPED),
                can_abort=request.user.has_perm("capacity.change_campaign") and campaign.is_live
                and not campaign.abort_requested_at,
                next_step=self._next_step(campaign),
                audit_entries=[{"at": e.at, "action": e.action, "target": e.target, "cause": e.cause,
                                "by": actor_describe(e.actor, e.actor_label), "new": json_table(e.new)}
                               for e in entries_of_subject(subject_type="campaign", subject_id=campaign.pk,
                                                           oldest_first=True)])
        extra.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False)
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @staticmethod
    def _next_step(campaign: Campaign) -> str:
        if campaign.state == CampaignState.RUNNING and campaign.abort_requested_at:
            return "Nothing to do: the abort is under way."
        if campaign.state == CampaignState.RUNNING:
            return "Nothing to do yet: a worker empties the nodes in order (Abort… ends the campaign)."
        if campaign.state == CampaignState.ABORTING:
            return "Nothing to do: the abort is under way."
        if campaign.state == CampaignState.DONE:
            if campaign.drain_when_safe:
                return "Done: the drained nodes stay cordoned and empty until you remove them."
            return ("Done: each safe node stays cordoned with its orphans serving; drain it (its defrag job's "
                    "Drain…) before removing it, or return it to service.")
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
