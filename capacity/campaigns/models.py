"""Consolidation campaigns and their proposals: the campaign (the plan it started from, its budgets, its state)
and one row per node it frees or keeps empty (its audit entries live in the audit trail,
subject "campaign").

A campaign's nodes are emptied by defrag jobs it starts, each linked from its node's row; the
campaign's own side effects are the cordons it lays and lifts, each written under an intent
first so a restarted worker knows which cordons are its own (see `capacity.campaigns.services`).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models

from config.actors import actor_label_current

from capacity.campaigns.planning import CampaignPlan
from capacity.campaigns.policy import ActingTerms


class CampaignState(models.TextChoices):
    RUNNING = "running", "running (cordoning, then emptying its nodes)"
    DONE = "done", "done (every node safe, drained or dropped)"
    ABORTING = "aborting", "aborting"
    ABORTED = "aborted", "aborted"


# A live campaign holds its nodes: no other campaign plans them.
LIVE_CAMPAIGN_STATES = (CampaignState.RUNNING, CampaignState.ABORTING)


class NodeRole(models.TextChoices):
    FREED = "freed", "freed (emptied by a defrag job)"
    KEPT_EMPTY = "kept-empty", "kept empty (cordoned while the campaign runs)"


class NodeState(models.TextChoices):
    PLANNED = "planned", "planned (not touched yet)"
    CORDONED = "cordoned", "cordoned, waiting its turn"
    RUNNING = "running", "its defrag job is emptying it"
    SAFE = "safe", "safe to remove (its defrag job is safe)"
    DRAINED = "drained", "drained"
    DROPPED = "dropped", "dropped (see the reason)"
    ABORTED = "aborted", "left by the campaign's abort"
    RETURNED = "returned", "returned to service"


# A freed node's outcome, once the campaign is done with it.
FREED_FINAL_STATES = (NodeState.SAFE, NodeState.DRAINED, NodeState.DROPPED, NodeState.ABORTED)
# A row the campaign no longer acts on (its cordon, if it was the campaign's, is lifted).
FINAL_NODE_STATES = (*FREED_FINAL_STATES, NodeState.RETURNED)


class Campaign(models.Model):
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="campaigns",
                                help_text="The cluster whose pool the campaign frees.")
    selector = models.JSONField(help_text="The pool: node labels (KEY: VALUE) every node of it carries.")
    goal = models.PositiveIntegerField(null=True, blank=True,
                                       help_text="Nodes asked to be freed; empty: as many as can be.")
    max_in_flight = models.PositiveIntegerField(help_text="Defrag jobs of the campaign emptying nodes at once.")
    drain_when_safe = models.BooleanField(
        default=False, help_text="The operator chose at start that each safe node is drained by the campaign; "
                                 "otherwise the drain is the operator's step.")
    state = models.CharField(max_length=10, choices=CampaignState.choices, default=CampaignState.RUNNING,
                             help_text="Where the campaign is; a restarted worker resumes from it.")
    plan = models.JSONField(help_text="The plan it started from (the campaign planner's value, as confirmed).")
    source = models.CharField(max_length=60, default="cli",
                              help_text="Where it was started: cli, panel or proposal:ID (the proposal).")
    version = models.PositiveIntegerField(
        default=0, help_text="Bumped by every record of a step: a step whose campaign changed under it re-reads "
                             "and decides again (compare-and-set).")
    error = models.TextField(blank=True, help_text="Why the last step could not finish (retried on the next).")
    next_check_at = models.DateTimeField(null=True, blank=True, help_text="Earliest time of the next step.")
    abort_requested_at = models.DateTimeField(null=True, blank=True,
                                              help_text="An operator asked for the abort; the next step does it.")
    abort_requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                           on_delete=models.SET_NULL, related_name="+",
                                           help_text="Who asked for the abort (empty: a command).")
    abort_requested_label = models.CharField(max_length=150, blank=True,
                                             help_text="Where the abort was asked when not in the panel.")
    lease_owner = models.CharField(max_length=200, blank=True,
                                   help_text="The worker stepping the campaign now; empty when none.")
    lease_expires_at = models.DateTimeField(null=True, blank=True,
                                            help_text="The owner's lease ends here; then any worker may take it.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", help_text="The operator who started the campaign.")
    requested_by_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Where the campaign was started when not in the panel: cli:USER@HOST (the OS user and host).")
    created_at = models.DateTimeField(help_text="When the campaign was started (the injected clock).")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When it was done or aborted.")
    updated_at = models.DateTimeField(auto_now=True, help_text="Last write.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"campaign #{self.pk} ({self.cluster}): {self.state}"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_CAMPAIGN_STATES

    @property
    def abort_pending(self) -> bool:
        return self.abort_requested_at is not None and self.state == CampaignState.RUNNING


class CampaignNode(models.Model):
    """One node the campaign frees (by a defrag job) or keeps empty while it runs."""

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="nodes",
                                 help_text="The campaign.")
    node_name = models.CharField(max_length=253, help_text="The node.")
    role = models.CharField(max_length=10, choices=NodeRole.choices, default=NodeRole.FREED,
                            help_text="Freed by a defrag job, or kept empty while the campaign runs.")
    position = models.PositiveIntegerField(help_text="Its place in the plan's order (kept-empty nodes after).")
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.PLANNED,
                             help_text="Where the node is in the campaign.")
    job = models.ForeignKey("capacity.DefragJob", null=True, blank=True, on_delete=models.PROTECT,
                            related_name="campaign_nodes", help_text="The defrag job emptying it.")
    cordoned_by_campaign = models.BooleanField(
        default=False, help_text="It was schedulable and the campaign cordoned it: the campaign uncordons it at "
                                 "the end, on a drop or an abort. A node cordoned before is left as it was.")
    cordon_intent_at = models.DateTimeField(
        null=True, blank=True, help_text="Written before the cordon patch: a node found cordoned after this was "
                                         "cordoned by the campaign, even if the worker died before recording it.")
    uncordon_intent_at = models.DateTimeField(
        null=True, blank=True, help_text="Written before the uncordon patch: a node found schedulable after this "
                                         "was uncordoned by the campaign.")
    uncordoned = models.BooleanField(default=False, help_text="The campaign lifted its own cordon.")
    waiting_reason = models.CharField(max_length=500, blank=True,
                                      help_text="Why its turn has not come though a slot is free (a budget).")
    dropped_reason = models.TextField(blank=True, help_text="Why the campaign dropped the node.")
    updated_at = models.DateTimeField(auto_now=True, help_text="Last write.")

    class Meta:
        ordering = ["campaign", "position"]
        constraints = [models.UniqueConstraint(fields=["campaign", "node_name"],
                                               name="capacity_one_row_per_campaign_node")]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.role}): {self.state}"

    @property
    def state_now(self) -> str:
        """Its state as the operator reads it: a safe node whose defrag job an operator has
        drained since (the drain is the operator's step, after the campaign is done) is drained."""
        if self.state == NodeState.SAFE and self.job is not None and self.job.state == "drained":
            return NodeState.DRAINED
        return self.state

    def get_state_now_display(self) -> str:
        return NodeState(self.state_now).label


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
    rehearsed = models.BooleanField(default=False, help_text="A rehearsal on a dump of the cluster planned the same "
                                                             "nodes in the same order (see the rehearsal).")
    rehearsal = models.ForeignKey("capacity.CampaignRehearsal", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="proposals",
                                  help_text="The latest rehearsal whose plan freed these nodes in this order.")

    class Meta:
        ordering = ["-computed_at", "cluster", "pool"]
        indexes = [models.Index(fields=["cluster", "pool", "-computed_at"], name="capacity_proposal_latest")]

    def __str__(self) -> str:
        return f"{self.cluster} / {self.pool} at {self.computed_at:%Y-%m-%d %H:%M}"

    @property
    def campaign(self) -> CampaignPlan:
        return CampaignPlan.from_dict(self.plan)


class RehearsalState(models.TextChoices):
    RUNNING = "running", "running on the copy"
    DONE = "done", "done (see the outcome)"
    FAILED = "failed", "failed (see the error)"


class CampaignRehearsal(models.Model):
    """A campaign run on a copy of a cluster: a `kubectl get … -o json` dump loaded into a
    simulated cluster with its own clock, run there to the end, and what happened. Nothing is
    sent to the cluster the dump was taken of. The copy is registered as a retired cluster
    (`copy_cluster`, named rehearsal-<id>) so that no list or periodic job ever acts on it,
    and the campaign, defrag jobs and audit entries of the run stay in history under it."""

    cluster = models.ForeignKey("clusters.Cluster", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="campaign_rehearsals",
                                help_text="The cluster the dump was taken of (--cluster); empty when none was named "
                                          "and there is no default cluster. It received no request.")
    copy_cluster = models.ForeignKey("clusters.Cluster", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+",
                                     help_text="The copy the campaign ran on: a simulated cluster loaded from the "
                                               "dump, registered retired (no act of the product reaches it).")
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                 help_text="The campaign run on the copy.")
    dump_path = models.CharField(max_length=1000, help_text="The dump file, as given (DUMP).")
    dump_sha256 = models.CharField(max_length=64, help_text="SHA-256 of the dump file's bytes.")
    dump_nodes = models.PositiveIntegerField(help_text="Nodes in the dump.")
    dump_pods = models.PositiveIntegerField(help_text="Pods in the dump.")
    selector = models.JSONField(help_text="The pool: node labels (KEY: VALUE) every node of it carries.")
    goal = models.PositiveIntegerField(null=True, blank=True,
                                       help_text="Nodes asked to be freed; empty: as many as can be.")
    max_in_flight = models.PositiveIntegerField(help_text="Defrag jobs of the campaign emptying nodes at once.")
    drain_when_safe = models.BooleanField(default=False, help_text="Each safe node was drained by the campaign.")
    scoring = models.CharField(max_length=20, help_text="The scheduler scoring the copy's scheduler placed pods "
                                                        "with (CAPACITY_SCHEDULER_SCORING).")
    state = models.CharField(max_length=10, choices=RehearsalState.choices, default=RehearsalState.RUNNING,
                             help_text="Running on the copy, done, or failed (the error says why).")
    plan = models.JSONField(help_text="The campaign plan over the dump (the campaign planner's value).")
    outcome = models.JSONField(null=True, blank=True,
                               help_text="What the campaign did on the copy: nodes freed and dropped, pods moved, "
                                         "where their replacements landed, stuck pods with the scheduler's reason.")
    planned = models.PositiveIntegerField(help_text="Nodes the plan frees.")
    freed = models.PositiveIntegerField(null=True, blank=True, help_text="Nodes the campaign freed on the copy.")
    simulated_seconds = models.FloatField(null=True, blank=True,
                                          help_text="Seconds of the copy's clock from the start to the end of the "
                                                    "campaign (the clock is fast-forwarded between passes).")
    seconds_to_all_safe = models.FloatField(null=True, blank=True,
                                            help_text="Seconds of the copy's clock from the start until every "
                                                      "planned node was safe; empty when not all were.")
    error = models.TextField(blank=True, help_text="Why the rehearsal could not finish.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", help_text="The operator who asked for the rehearsal.")
    requested_by_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Where the rehearsal was asked when not in the panel: cli:USER@HOST (the OS user and host).")
    started_at = models.DateTimeField(help_text="When the rehearsal began (the product's clock).")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When it ended (the product's clock).")

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"rehearsal #{self.pk}: {self.state}"

    @property
    def freed_all(self) -> bool:
        return self.state == RehearsalState.DONE and self.freed == self.planned


# Who starts a campaign on its own: the schedule, under the pool's policy ("…#<policy id>"),
# on the campaign's requested_by_label and its audit entries.
AUTO_ACTOR_LABEL = "schedule: campaign policy #"


class CampaignPolicy(models.Model):
    """An operator's terms for a pool's proposed campaign to start on its own: enabled, in a
    window (a cron schedule in UTC and a duration, as Karpenter's disruption budgets), and
    within a node budget. A setting, edited in the panel with every change audited; a pool
    without one, or with it disabled, never acts on its own."""

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="campaign_policies",
                                help_text="The cluster of the pool.")
    selector = models.CharField(
        max_length=500, help_text="The pool, as its proposal selects it: node labels KEY=VALUE[,KEY=VALUE], e.g. "
                                  "karpenter.sh/nodepool=h100 (what `consolidate --pool` takes).")
    enabled = models.BooleanField(default=False, help_text="Off by default: the pool's campaigns start only when "
                                                           "an operator starts them.")
    schedule = models.CharField(
        max_length=100, blank=True, help_text="When the window opens: a cron expression in UTC (minute hour "
                                              "day-of-month month day-of-week, or @daily…), as a Karpenter budget's "
                                              "schedule. Empty, with an empty duration: open whenever enabled.")
    duration = models.CharField(max_length=20, blank=True,
                                help_text="How long the window stays open after each time the schedule fires: "
                                          "hours and minutes, as 2h, 30m or 1h30m. Set with the schedule.")
    nodes = models.CharField(max_length=10, default="10%",
                             help_text="The most nodes one automatic campaign frees: a count (3) or a percentage of "
                                       "the pool's nodes (10%), rounded up as Karpenter rounds a budget's nodes.")
    max_in_flight = models.PositiveIntegerField(
        default=1, help_text="Nodes an automatic campaign empties at once "
                             "(at most CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER).")
    drain_when_safe = models.BooleanField(
        default=False, help_text="Each safe node is drained by the campaign (needs the drain permission to set); "
                                 "otherwise it stays cordoned with its orphans serving until an operator drains it.")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="Who changed the policy last.")
    changed_at = models.DateTimeField(null=True, blank=True, help_text="When it was changed last.")
    last_act_at = models.DateTimeField(null=True, blank=True,
                                       help_text="When the schedule last acted on a proposal under this policy.")
    last_act_proposal = models.PositiveIntegerField(
        null=True, blank=True, help_text="The proposal it acted on (never acted on twice; the audit has each act).")
    last_act = models.CharField(max_length=500, blank=True, help_text="What came of it: the campaign started, or "
                                                                      "why it was refused.")

    class Meta:
        verbose_name_plural = "campaign policies"
        ordering = ["cluster", "selector"]
        constraints = [models.UniqueConstraint(fields=["cluster", "selector"],
                                               name="capacity_one_campaign_policy_per_pool",
                                               violation_error_message="This cluster already has a policy for "
                                                                       "this pool: change that one.")]

    def __str__(self) -> str:
        return f"{self.cluster} / {self.selector}: {'on' if self.enabled else 'off'}"

    @property
    def terms(self) -> ActingTerms:
        return ActingTerms(enabled=self.enabled, schedule=self.schedule, duration=self.duration, nodes=self.nodes,
                           max_in_flight=self.max_in_flight, drain_when_safe=self.drain_when_safe)

    def values(self) -> dict:
        """The settings an audit entry of a change records."""
        return {"selector": self.selector, "enabled": self.enabled, "schedule": self.schedule,
                "duration": self.duration, "nodes": self.nodes, "max_in_flight": self.max_in_flight,
                "drain_when_safe": self.drain_when_safe}
