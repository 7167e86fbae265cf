"""Campaign proposals: the best campaign of each GPU pool, computed on a schedule.

A proposal is advice, not the record of an act: nothing was done to the cluster when it
was written, so it is replaced as the cluster changes and its history is kept only
`CAPACITY_CAMPAIGN_PROPOSAL_DAYS` days (capacity/campaigns/services.py). The panel still
never edits one (read-only admin): what the dashboard and the GPU map show is what the
schedule computed.
"""
from __future__ import annotations

from django.db import models

from capacity.campaigns.planning import CampaignPlan


class CampaignProposal(models.Model):
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="campaign_proposals",
                                help_text="The cluster whose pool the campaign frees.")
    pool = models.CharField(max_length=253, help_text="The pool's name, as the GPU map names it (its node pool "
                                                      "label's value, else its GPU product).")
    selector = models.JSONField(help_text="The node labels that select the pool ({label: value}): what "
                                          "`consolidate --pool` takes.")
    scoring = models.CharField(max_length=20, help_text="The cluster scheduler's scoring strategy the plan "
                                                        "assumed (CAPACITY_SCHEDULER_SCORING).")
    computed_at = models.DateTimeField(db_index=True, help_text="When the cluster was read for it (the product's "
                                                                "clock); a later reading that gave the same plan "
                                                                "moves it forward.")
    plan = models.JSONField(help_text="The campaign plan: its nodes in order with where each pod goes, the nodes "
                                      "left out and why, the empty nodes kept empty.")
    freed = models.PositiveIntegerField(help_text="Nodes the campaign frees.")
    gpus_freed = models.PositiveIntegerField(help_text="GPUs of the nodes it frees.")
    pods_moved = models.PositiveIntegerField(help_text="Pods it moves, each once.")
    lower_bound = models.PositiveIntegerField(help_text="The fewest nodes the pool's GPU requests could fit on: "
                                                        "no plan frees more than the pool's nodes less this.")
    rehearsed = models.BooleanField(default=False, help_text="A rehearsal of this campaign exists (none yet).")

    class Meta:
        ordering = ["-computed_at", "cluster", "pool"]
        indexes = [models.Index(fields=["cluster", "pool", "-computed_at"], name="capacity_proposal_latest")]

    def __str__(self) -> str:
        return f"{self.cluster} / {self.pool} at {self.computed_at:%Y-%m-%d %H:%M}"

    @property
    def campaign(self) -> CampaignPlan:
        return CampaignPlan.from_dict(self.plan)
