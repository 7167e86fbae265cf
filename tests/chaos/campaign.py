"""The chaos scenario of a consolidation campaign: a pool of half-full GPU nodes, the campaign
started through the product (its first pass queued to the workers on commit), worker
processes SIGKILLed at random moments and API faults injected while it cordons, empties its
nodes through defrag jobs and ends (done, or aborted from the panel at a random moment);
then the campaign's invariants.

The pool: four 8-GPU nodes holding two 2-GPU model pods each, an empty node (kept empty by
the campaign under LeastAllocated scoring) and an empty node an operator cordoned before
(outside the campaign, and never uncordoned by it).

Time: a pass or a job whose worker was killed is not stepped until its lease lapses and a
resume beat hands it on; when nothing of the campaign has moved for a few wall seconds the
driver fast-forwards the product clock, as it does for a killed defrag job.
"""
from __future__ import annotations

import time
from collections import Counter

from kubernetes.client.exceptions import ApiException

from audit.selectors import entries_of_subject
from capacity.campaigns.models import (
    FINAL_NODE_STATES, LIVE_CAMPAIGN_STATES, Campaign, CampaignNode, CampaignState, NodeRole, NodeState,
)
from capacity.campaigns.planning import pool_selector_text
from capacity.campaigns.selectors import campaign_plan_read
from capacity.campaigns.services import campaign_start
from capacity.defrag.models import LIVE_STATES, DefragJob, DefragOrphan, JobState
from config import clock
from config.actors import acting_as

from .driver import FORWARD_AFTER_WALL_S, FORWARD_STEP_S, ChaosDriver, ChaosStuck, _needs_step
from .world import Kube

from campaign_cluster import POOL, half_full_pool  # noqa: E402 - tests/capacity, on the path via .world
from defrag_builders import make_node  # noqa: E402
from defrag_cluster import NS  # noqa: E402

POOL_NODES = ("n1", "n2", "n3", "n4")       # half full: two 2-GPU pods each
KEPT_EMPTY_NODE = "n5"                      # empty and schedulable when the campaign starts
CLOSED_NODE = "n6"                          # empty, cordoned by an operator before the campaign
OPERATOR = "cli:chaos@bastion"              # who starts the campaigns
# Rows whose node the campaign still holds cordoned (a replacement there breaks the plan).
HOLDING = (NodeState.CORDONED, NodeState.RUNNING, NodeState.SAFE, NodeState.DRAINED)
# The workers' settings for this scenario (test_chaos_campaign.py): passes and job checks
# every second of product time, so the campaign ends within the test's budget.
CAMPAIGN_ENV = {"CAPACITY_CAMPAIGN_POLL_SECONDS": "1", "CAPACITY_DEFRAG_POLL_SECONDS": "1"}


class CampaignChaos(ChaosDriver):
    SPEEDS = (20.0, 50.0)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.campaign: Campaign | None = None
        self.before: dict[str, str] = {}          # pod → node when the campaign started
        self.seen_on_campaign_nodes: set[tuple[str, str]] = set()
        self._marks: tuple = ()
        self._marked_at = 0.0

    def objects(self) -> list[dict]:
        return (half_full_pool(len(POOL_NODES))
                + [make_node(KEPT_EMPTY_NODE, unschedulable=True), make_node(CLOSED_NODE, unschedulable=True)])

    # ---- what the kills aim at, and when time is moved ----------------------------------------
    def lease_owner(self) -> str | None:
        """The campaign's worker, or (a pass between two) one of its stepping jobs' workers."""
        if self.campaign is None:
            return None
        owner = Campaign.objects.filter(pk=self.campaign.pk).values_list("lease_owner", flat=True).first()
        if owner:
            return owner
        return (DefragJob.objects.filter(campaign_nodes__campaign=self.campaign, state__in=LIVE_STATES)
                .exclude(lease_owner="").values_list("lease_owner", flat=True).first())

    def tick(self) -> None:
        if self.campaign is not None:
            self._watch_campaign_nodes()
            self._forward_when_stalled()
        super().tick()

    def _forward_when_stalled(self) -> None:
        """Nothing of the live campaign moved (its record, its stepping jobs' heartbeats) for
        FORWARD_AFTER_WALL_S: its worker was killed, so time runs on to its lease's end and the
        next resume beat, as it would in production, instead of being waited out for real."""
        row = Campaign.objects.filter(pk=self.campaign.pk).values_list("state", "version").first()
        jobs = [j for j in DefragJob.objects.filter(campaign_nodes__campaign=self.campaign, state__in=LIVE_STATES)
                if _needs_step(j)]
        marks = (row, tuple(sorted((j.pk, j.state, j.heartbeat_at) for j in jobs)))
        now = time.monotonic()
        if marks != self._marks:
            self._marks, self._marked_at = marks, now
            return
        live = row is not None and row[0] in LIVE_CAMPAIGN_STATES
        if (live or jobs) and now - self._marked_at > FORWARD_AFTER_WALL_S:
            self.forward(FORWARD_STEP_S)

    def _watch_campaign_nodes(self) -> None:
        """Every pod that was not there at the start, seen on a node the campaign holds
        cordoned: a replacement that landed on a campaign node. Pods are read first, rows
        after: a row still holding its node then held it when the pod was read."""
        try:
            pods = [(p.metadata.name, p.spec.node_name) for p in self.kube.pods() if p.spec.node_name]
        except ApiException:       # an injected fault: the next tick looks again
            return
        holding = set(CampaignNode.objects.filter(campaign=self.campaign, state__in=HOLDING)
                      .values_list("node_name", flat=True))
        for pod, node in pods:
            if node in holding and pod not in self.before:
                self.seen_on_campaign_nodes.add((pod, node))

    # ---- one scenario ---------------------------------------------------------------------------
    def _scenario(self, handle, kube: Kube, sub_seed: int) -> None:
        cluster, self.kube = handle.cluster, kube
        self.wait(lambda: _pods_running(kube) == 2 * len(POOL_NODES), "the model pods run", limit_s=60)
        kube.core.patch_node(KEPT_EMPTY_NODE, {"spec": {"unschedulable": False}})
        self.before = {p.metadata.name: p.spec.node_name for p in kube.pods()}
        mode = self.rng.choice(("done", "done-drain", "abort"))
        in_flight = self.rng.choice((1, 2))
        plan = campaign_plan_read(cluster=cluster, selector=POOL, goal=None, now=clock.now())
        with acting_as(OPERATOR):
            self.campaign = campaign_start(cluster=cluster, plan=plan, actor=None, max_in_flight=in_flight,
                                           drain_when_safe=mode == "done-drain")   # queued on commit
        self.campaign_plan = plan
        latency = self.rng.choice((5, 20, 50))
        handle.control.set_faults(seed=sub_seed, error_rate=0.10, throttle_rate=0.05, conflict_rate=0.05,
                                  latency_ms=latency, drop_watch_after=round(self.rng.uniform(0.3, 2.0), 1))
        self.say(f"{self.where()} campaign #{self.campaign.pk} frees {', '.join(plan.node_names)}, keeps "
                 f"{', '.join(plan.kept_empty) or 'none'} empty, {in_flight} at once, then {mode}; "
                 f"faults seed {sub_seed}, latency {latency} ms")
        self.kill_times = []
        self.schedule_kills(self.rng.randint(2, 4), 8.0)
        try:
            if mode == "abort":
                abort_at = time.monotonic() + self.rng.uniform(0.5, 6.0)
                self.wait(lambda: time.monotonic() >= abort_at or not self._live(), "the abort moment")
                self.campaign_abort()
            self.wait(lambda: not self._live() and not self._jobs_moving(), f"campaign #{self.campaign.pk} ends")
        finally:
            self.stats.faults.update(handle.control.faults().get("injected", {}))
            handle.control.clear_faults()
        self.settle()
        self.check_campaign(cluster, kube, mode)
        self.campaign = None

    def _live(self) -> bool:
        return Campaign.objects.filter(pk=self.campaign.pk, state__in=LIVE_CAMPAIGN_STATES).exists()

    def _jobs_moving(self) -> bool:
        """A job of the campaign still on its way (an aborted one deletes its orphans first)."""
        return any(_needs_step(j) for j in DefragJob.objects.filter(campaign_nodes__campaign=self.campaign,
                                                                    state__in=LIVE_STATES))

    def campaign_abort(self) -> None:
        """The operator confirms the abort in the panel (its page lists what it does)."""
        url = f"/admin/capacity/campaign/{self.campaign.pk}/abort/"
        page = self.panel.get(url)
        if page.status_code != 200:
            raise ChaosStuck(f"{self.where()} the campaign's abort page answered {page.status_code}")
        page = self.panel.post(url, {"confirm": "yes"})
        if page.status_code != 302:
            raise ChaosStuck(f"{self.where()} the campaign's abort answered {page.status_code}")
        self.stats.aborts += 1
        state = Campaign.objects.get(pk=self.campaign.pk).state
        self.say(f"{self.where()} abort campaign #{self.campaign.pk} in {state}")

    # ---- the invariants ---------------------------------------------------------------------------
    def check_campaign(self, cluster, kube: Kube, mode: str) -> None:
        campaign = Campaign.objects.get(pk=self.campaign.pk)
        rows = list(campaign.nodes.select_related("job").order_by("position"))
        self.stats.campaigns[campaign.state] += 1
        wanted = CampaignState.ABORTED if mode == "abort" else CampaignState.DONE
        if campaign.state != wanted and not (mode == "abort" and campaign.state == CampaignState.DONE):
            self.violation(f"campaign #{campaign.pk} ended {campaign.state}, wanted {wanted} ({mode})")
        planned = set(self.campaign_plan.node_names) | set(self.campaign_plan.kept_empty)
        if {r.node_name for r in rows} != planned:
            self.violation(f"campaign #{campaign.pk} rows {sorted(r.node_name for r in rows)}, planned {sorted(planned)}")
        self._check_rows(campaign, rows, kube)
        self._check_moves(campaign, rows, kube)
        self._check_audit(campaign, rows)

    def _check_rows(self, campaign: Campaign, rows: list[CampaignNode], kube: Kube) -> None:
        """Each node's end, and its cordon: kept while safe or drained, lifted by the campaign
        when it laid it and the node was dropped, aborted or returned; never lifted when it
        was an operator's."""
        ended = (NodeState.SAFE, NodeState.DRAINED, NodeState.DROPPED)
        if campaign.state == CampaignState.ABORTED:
            ended += (NodeState.ABORTED,)
        cordoned = {n.metadata.name: bool(n.spec.unschedulable) for n in kube.core.list_node().items}
        for row in rows:
            self.stats.campaign_nodes[row.state] += 1
            where = f"campaign #{campaign.pk} node {row.node_name} ({row.role}, {row.state})"
            if row.role == NodeRole.FREED and row.state not in ended:
                self.violation(f"{where}: not safe, drained or dropped")
            if row.role == NodeRole.KEPT_EMPTY and row.state != NodeState.RETURNED:
                self.violation(f"{where}: a kept-empty node not returned to service")
            if row.state == NodeState.DROPPED and not row.dropped_reason:
                self.violation(f"{where}: dropped without a reason")
            if row.state in (NodeState.SAFE, NodeState.DRAINED):
                if not cordoned.get(row.node_name):
                    self.violation(f"{where}: uncordoned though it is to be removed")
                if row.job is None or row.job.state != (JobState.SAFE if row.state == NodeState.SAFE
                                                        else JobState.DRAINED):
                    self.violation(f"{where}: its defrag job is {row.job and row.job.state}")
            elif row.state in FINAL_NODE_STATES and row.cordoned_by_campaign:
                if cordoned.get(row.node_name) or not row.uncordoned:
                    self.violation(f"{where}: the campaign's cordon not lifted (cordoned: "
                                   f"{cordoned.get(row.node_name)}, recorded uncordoned: {row.uncordoned})")
            if not row.cordoned_by_campaign and row.uncordoned:
                self.violation(f"{where}: uncordoned by the campaign though it did not cordon it")
            if row.job is not None and row.job.state in LIVE_STATES and row.job.state not in (JobState.SAFE,
                                                                                            JobState.ABORT_STUCK):
                self.violation(f"{where}: its defrag job #{row.job.pk} left {row.job.state}")
        if not cordoned.get(CLOSED_NODE):
            self.violation(f"node {CLOSED_NODE}, cordoned by an operator before the campaign, was uncordoned")

    def _check_moves(self, campaign: Campaign, rows: list[CampaignNode], kube: Kube) -> None:
        """No replacement on a node the campaign held, every pod of a freed node orphaned
        once, and no pod orphaned that was not there at the start (a replacement moved again)."""
        for pod, node in sorted(self.seen_on_campaign_nodes):
            self.violation(f"campaign #{campaign.pk}: replacement {pod} ran on campaign node {node}")
        held = {r.node_name for r in rows if r.state in (NodeState.SAFE, NodeState.DRAINED)}
        for pod in kube.pods():
            if pod.spec.node_name in held and pod.metadata.name not in self.before:
                self.violation(f"campaign #{campaign.pk}: replacement {pod.metadata.name} on campaign node "
                               f"{pod.spec.node_name}")
        records = DefragOrphan.objects.filter(job__campaign_nodes__campaign=campaign)
        recorded = set(records.values_list("pod_name", flat=True))
        orphans = records.filter(orphaned_at__isnull=False)
        times = Counter(orphans.values_list("uid", flat=True))
        names = dict(orphans.values_list("uid", "pod_name"))
        for uid, n in times.items():
            if n > 1:
                self.violation(f"campaign #{campaign.pk}: pod {names[uid]} orphaned {n} times")
        for name in sorted(set(names.values()) - set(self.before)):
            self.violation(f"campaign #{campaign.pk}: pod {name}, not there at the start, was orphaned")
        for row in rows:
            if row.state not in (NodeState.SAFE, NodeState.DRAINED):
                continue
            on_node = {p for p, node in self.before.items() if node == row.node_name}
            moved = set(row.job.orphans.filter(orphaned_at__isnull=False).values_list("pod_name", flat=True))
            if moved != on_node:
                self.violation(f"campaign #{campaign.pk} node {row.node_name}: pods moved {sorted(moved)}, "
                               f"it held {sorted(on_node)}")
        for pod in kube.core.list_namespaced_pod(NS).items:
            if not pod.metadata.owner_references and pod.metadata.name not in recorded:
                self.violation(f"pod {NS}/{pod.metadata.name} orphaned without a record")

    def _check_audit(self, campaign: Campaign, rows: list[CampaignNode]) -> None:
        """Each cordon, uncordon and job start audited exactly once (whatever the kills
        repeated), the start and the end once, and nothing audited of a node outside it."""
        entries = Counter(entries_of_subject(subject_type="campaign", subject_id=campaign.pk)
                          .values_list("action", "target"))
        end = "campaign_abort" if campaign.state == CampaignState.ABORTED else "campaign_done"
        wanted = Counter({("campaign_start", f"pool {pool_selector_text(POOL)}"): 1,
                          (end, f"campaign #{campaign.pk}"): 1})
        for row in rows:
            target = f"Node/{row.node_name}"
            if row.cordoned_by_campaign:
                wanted[("node_cordon", target)] = 1
            if row.uncordoned:
                wanted[("node_uncordon", target)] = 1
            if row.job_id is not None:
                wanted[("node_start", target)] = 1
        acts = ("campaign_start", "campaign_done", "campaign_abort", "node_cordon", "node_uncordon", "node_start")
        got = Counter({k: n for k, n in entries.items() if k[0] in acts})
        if got != wanted:
            extra, missing = got - wanted, wanted - got
            self.violation(f"campaign #{campaign.pk}: audit differs from what it did: more {dict(extra)}, "
                           f"missing {dict(missing)}")
        inside = {f"Node/{r.node_name}" for r in rows}
        outside = sorted({t for _, t in entries if t.startswith("Node/") and t not in inside})
        if outside:
            self.violation(f"campaign #{campaign.pk}: audited acts on nodes outside it: {outside}")


def _pods_running(kube: Kube) -> int:
    try:
        return sum(1 for p in kube.pods() if p.status.phase == "Running" and p.spec.node_name)
    except ApiException:
        return 0
