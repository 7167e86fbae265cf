"""Admin: campaign proposals, read only (the schedule writes them; the panel never edits one)."""
from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from config.admin_display import ReadOnlyAdminMixin
from config.admin_lookups import ListFiltersCheckedMixin

from capacity.campaigns.models import CampaignProposal
from capacity.campaigns.pools import consolidate_command


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
        return "yes" if row.rehearsed else "no"

    @admin.display(description="command that runs it")
    def command(self, row: CampaignProposal) -> str:
        return format_html("<code>{}</code>", consolidate_command(cluster=row.cluster.name, selector=row.selector))

    @admin.display(description="plan")
    def report(self, row: CampaignProposal) -> str:
        return format_html("<pre>{}</pre>", "\n".join(row.campaign.report_lines()))
