"""A consolidation campaign rehearsed on a copy of the cluster before anyone touches it.

The copy is a `kubectl get nodes,pods,replicasets,deployments,services.serving.knative.dev,
revisions,podautoscalers,pdb -A -o json` dump loaded into a simulated cluster served in this
process with a manual clock, its scheduler placing pods as the cluster's does
(CAPACITY_SCHEDULER_SCORING). The product acts on it as on any cluster, through the same
gateway over HTTP: the copy is registered as a cluster row named rehearsal-<id>, created
retired (`clusters.services.cluster_copy_register`) so that no list, lookup by name or
periodic job that acts ever reaches it, while the campaign, its defrag jobs and their audit
entries stay in history under its name. The campaign is planned over the copy, started, and
stepped with its defrag jobs pass after pass, the copy's clock moved on by the poll interval
between passes, until it ends or a simulated deadline passes. Then the copy is read again
and the outcome (capacity/campaigns/outcome.py) kept on a `CampaignRehearsal` record.

The cluster the dump was taken of receives no request: the plan comes from the dump. Its
row only names the rehearsal, and its latest proposal for the pool is marked rehearsed
when the rehearsal planned the same nodes in the same order.
"""
from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.errors import KubeError
from clusters.selectors import snapshot_take
from clusters.services import cluster_copy_register
from config import clock
from simcluster.control import SimControl
from simcluster.scenario import ScenarioError
from simcluster.server import ClusterServer, build_simulation
from simcluster.sim import SimSettings

from capacity.campaigns.models import (
    LIVE_CAMPAIGN_STATES,
    Campaign,
    CampaignProposal,
    CampaignRehearsal,
    NodeRole,
    NodeState,
    RehearsalState,
)
from capacity.campaigns.outcome import CampaignOutcome, campaign_outcome
from capacity.campaigns.planning import CampaignPlan, pool_selector_text
from capacity.campaigns.selectors import campaign_plan_read, proposals_latest
from capacity.campaigns.services.drive import campaign_drive
from capacity.campaigns.services.record import CampaignError
from capacity.campaigns.services.start import campaign_abort, campaign_start

log = logging.getLogger(__name__)

# How the copy's scheduler places pods, for each scoring the cluster's scheduler may use.
PLACEMENT = {"LeastAllocated": "spread", "MostAllocated": "most-allocated"}
# The kinds a dump must hold for a campaign to be rehearsed on it (plural for messages).
_NEEDED = (("nodes", "nodes"), ("pods", "pods"))
# Simulated seconds the copy's controllers are given to settle after loading (pods bound in
# the dump are Running already; this lets Knative's and the ReplicaSets' status catch up).
SETTLE_SECONDS = 1.0


class RehearsalError(Exception):
    """A rehearsal refused or one that could not finish; the message says what is wrong."""


@dataclass(frozen=True)
class Rehearsal:
    """What a rehearsal found: the plan over the dump, the outcome on the copy, each planned
    node's state at the end (node → (state, dropped reason)) and the simulated time it took."""

    record: CampaignRehearsal
    plan: CampaignPlan
    outcome: CampaignOutcome
    campaign: Campaign
    node_states: Mapping[str, tuple[str, str]]
    simulated_seconds: float

    @property
    def freed_all(self) -> bool:
        return len(self.outcome.freed) == len(self.plan.nodes)

    def report_lines(self) -> list[str]:
        lines = [f"Rehearsal #{self.record.pk} on a copy of {self.record.dump_path} "
                 f"({self.record.dump_nodes} nodes, {self.record.dump_pods} pods), the copy's clock fast-forwarded: "
                 f"campaign {self.campaign.state} after {_minutes(self.simulated_seconds)} of simulated time."]
        lines += self.outcome.report_lines()
        return lines


def _minutes(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def dump_check(path: str | Path) -> tuple[Path, str]:
    """The dump's path and the SHA-256 of its bytes; refuses a path that is not a readable file."""
    where = Path(path)
    if not where.exists():
        raise RehearsalError(f"DUMP {where}: no such file")
    if not where.is_file():
        raise RehearsalError(f"DUMP {where}: not a file")
    try:
        data = where.read_bytes()
    except OSError as exc:
        raise RehearsalError(f"DUMP {where}: cannot be read: {exc.strerror}") from None
    if not data.strip():
        raise RehearsalError(f"DUMP {where}: the file is empty; expected the JSON of kubectl get nodes,pods,... "
                             "-A -o json (a v1 List) or YAML documents")
    return where, hashlib.sha256(data).hexdigest()


def _simulation(path: Path, scoring: str, start: datetime):
    """The copy's Simulation, loaded from the dump, its clock starting at the product's `start`
    (so the rehearsal's records read in the product's time); refuses what is not a dump."""
    try:
        return build_simulation(path, settings=SimSettings(placement=PLACEMENT[scoring]), start=start)
    except ScenarioError as exc:
        raise RehearsalError(f"DUMP {exc} (expected the JSON of kubectl get nodes,pods,... -A -o json, a v1 List, "
                             "or YAML documents of Kubernetes objects)") from None


def campaign_rehearse(*, dump: str | Path, selector: Mapping[str, str], goal: int | None, max_in_flight: int,
                      actor=None, drain_when_safe: bool = False, scoring: str | None = None, cluster=None,
                      now: datetime | None = None) -> Rehearsal:
    """Rehearse the campaign of pool `selector` (`goal` nodes, None: as many as can be) on a
    copy of `dump` and keep what happened. `cluster`: the cluster the dump was taken of (it
    is never sent a request; its latest proposal for the pool is marked rehearsed when the
    plans agree). Raises RehearsalError for a dump that cannot be rehearsed on (nothing is
    recorded then), CampaignInputError for a pool or goal that cannot be planned (nothing
    recorded either), and RehearsalError when the run on the copy fails (recorded as failed)."""
    now = now or clock.now()
    scoring = scoring or settings.CAPACITY_SCHEDULER_SCORING
    if scoring not in PLACEMENT:
        raise RehearsalError(f"scoring must be one of {', '.join(PLACEMENT)}, not {scoring!r}")
    limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or not 1 <= max_in_flight <= limit:
        raise RehearsalError(f"the nodes emptied at once (max in flight) must be a whole number from 1 to {limit} "
                             f"(CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER), not {max_in_flight!r}")
    path, sha256 = dump_check(dump)
    sim = _simulation(path, scoring, now)
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        server = ClusterServer(sim=sim, kubeconfig_out=Path(tmp) / "kubeconfig").start()
        gateway = kube.KubeGateway.from_kubeconfig(str(server.kubeconfig_path), name="rehearsal")
        copy = None
        try:
            control = SimControl(server.url)
            control.advance(SETTLE_SECONDS)
            before = snapshot_take(gateway, now=sim.clock.now())
            counts = {"nodes": len(before.nodes), "pods": len(before.pods)}
            missing = [word for key, word in _NEEDED if not counts[key]]
            if missing:
                raise RehearsalError(f"DUMP {path}: holds no {' and no '.join(missing)} "
                                     f"({counts['nodes']} nodes, {counts['pods']} pods): a campaign is rehearsed on "
                                     "kubectl get nodes,pods,replicasets,deployments,services.serving.knative.dev,"
                                     "revisions,podautoscalers,pdb -A -o json")
            record, copy, plan = _begin(path=path, sha256=sha256, counts=counts, selector=selector, goal=goal,
                                        max_in_flight=max_in_flight, drain_when_safe=drain_when_safe,
                                        scoring=scoring, cluster=cluster, actor=actor, now=now, gateway=gateway,
                                        sim_now=sim.clock.now(), server_kubeconfig=str(server.kubeconfig_path))
            try:
                rehearsal = _run(record=record, copy=copy, plan=plan, before=before, actor=actor,
                                 gateway=gateway, sim=sim, control=control)
            except Exception as exc:
                _fail(record, f"{type(exc).__name__}: {exc}" if not isinstance(exc, (CampaignError, RehearsalError))
                      else str(exc))
                if isinstance(exc, (CampaignError, KubeError)):
                    raise RehearsalError(f"rehearsal #{record.pk} failed on the copy: {exc}") from None
                raise
        finally:
            gateway.close()
            if copy is not None:
                kube.gateway_forget(copy)
            server.stop()
    if cluster is not None:
        _proposal_mark(rehearsal.record, cluster=cluster)
    return rehearsal


def _begin(*, path: Path, sha256: str, counts: dict, selector, goal, max_in_flight: int, drain_when_safe: bool,
           scoring: str, cluster, actor, now: datetime, gateway: kube.KubeGateway, sim_now: datetime,
           server_kubeconfig: str) -> tuple[CampaignRehearsal, object, CampaignPlan]:
    """The record, the copy's cluster row and the plan over the copy, in one transaction: a
    pool or goal that cannot be planned, or a plan that frees nothing, leaves nothing behind."""
    with transaction.atomic():
        record = CampaignRehearsal.objects.create(
            cluster=cluster, dump_path=str(path), dump_sha256=sha256, dump_nodes=counts["nodes"],
            dump_pods=counts["pods"], selector=dict(selector), goal=goal, max_in_flight=max_in_flight,
            drain_when_safe=drain_when_safe, scoring=scoring, plan={}, planned=0, requested_by=actor,
            started_at=now)
        copy = cluster_copy_register(
            name=f"rehearsal-{record.pk}", kubeconfig_path=server_kubeconfig, actor=actor, now=now,
            cause=f"the copy of {path} that rehearsal #{record.pk} runs on: never in service")
        plan = campaign_plan_read(cluster=copy, selector=selector, goal=goal, scoring=scoring, gateway=gateway,
                                  now=sim_now)
        if not plan.nodes:
            raise RehearsalError(f"the plan over {path} frees no node of pool {pool_selector_text(plan.selector)}: "
                                 f"nothing to rehearse ({plan.summary})")
        record.copy_cluster, record.plan, record.planned = copy, json.loads(json.dumps(plan.to_dict())), plan.freed
        record.save(update_fields=["copy_cluster", "plan", "planned"])
    return record, copy, plan


def _run(*, record: CampaignRehearsal, copy, plan: CampaignPlan, before, actor, gateway: kube.KubeGateway, sim,
         control: SimControl) -> Rehearsal:
    """Start the campaign on the copy and step it to its end on the copy's clock."""
    started = sim.clock.now()
    campaign = campaign_start(cluster=copy, plan=plan, actor=actor, max_in_flight=record.max_in_flight,
                              drain_when_safe=record.drain_when_safe, gateway=gateway, now=started, enqueue=False,
                              source=f"rehearsal:{record.pk}")
    poll = min(settings.CAPACITY_CAMPAIGN_POLL_SECONDS, settings.CAPACITY_DEFRAG_POLL_SECONDS)
    # Each node's defrag job has its timeout; a campaign empties at least one node at a time.
    deadline = settings.CAPACITY_DEFRAG_TIMEOUT_SECONDS * len(plan.nodes)
    drive = dict(gateway=gateway, now=sim.clock.now, advance=control.advance, poll_seconds=poll)
    campaign = campaign_drive(campaign=campaign, max_seconds=deadline, **drive)
    notes = []
    if campaign.state in LIVE_CAMPAIGN_STATES:
        notes.append(f"The campaign was still {campaign.state} after {_minutes(deadline)} of simulated time "
                     f"({settings.CAPACITY_DEFRAG_TIMEOUT_SECONDS} s, the defrag timeout, per node): aborted on "
                     "the copy.")
        campaign_abort(campaign=campaign, actor=actor, now=sim.clock.now(), enqueue=False)
        campaign = campaign_drive(campaign=campaign, max_seconds=settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS,
                                  **drive)
    ended = sim.clock.now()
    after = snapshot_take(gateway, now=ended)
    rows = list(campaign.nodes.filter(role=NodeRole.FREED).select_related("job").order_by("position"))
    node_states = {r.node_name: (r.state, r.dropped_reason) for r in rows}
    safe_at = [r.job.safe_at for r in rows if r.job is not None and r.job.safe_at is not None
               and r.state in (NodeState.SAFE, NodeState.DRAINED)]
    to_safe = (max(safe_at) - started).total_seconds() if len(safe_at) == len(rows) and rows else None
    outcome = campaign_outcome(plan, before=before, after=after, node_states=node_states,
                               seconds_to_all_safe=to_safe)
    if notes:
        outcome = replace(outcome, notes=(*outcome.notes, *notes))
    simulated = (ended - started).total_seconds()
    CampaignRehearsal.objects.filter(pk=record.pk).update(
        state=RehearsalState.DONE, campaign=campaign, outcome=json.loads(json.dumps(
            {**outcome.to_dict(), "report_lines": outcome.report_lines()})),
        freed=len(outcome.freed), simulated_seconds=simulated, seconds_to_all_safe=outcome.seconds_to_all_safe,
        finished_at=clock.now())
    record.refresh_from_db()
    return Rehearsal(record=record, plan=plan, outcome=outcome, campaign=campaign, node_states=node_states,
                     simulated_seconds=simulated)


def _fail(record: CampaignRehearsal, error: str) -> None:
    CampaignRehearsal.objects.filter(pk=record.pk).update(state=RehearsalState.FAILED, error=error,
                                                         finished_at=clock.now())


def _proposal_mark(record: CampaignRehearsal, *, cluster) -> CampaignProposal | None:
    """Mark the cluster's latest proposal for the rehearsed pool rehearsed when its plan frees
    the same nodes in the same order, linking the rehearsal. The pool is the same when the
    selectors are, or when they select the same nodes (`karpenter.sh/nodepool=h100` and
    `node.kubernetes.io/instance-type=p5.48xlarge` may both name every H100 node)."""
    plan = CampaignPlan.from_dict(record.plan)
    for proposal in proposals_latest(cluster=cluster):
        campaign = proposal.campaign
        same_pool = proposal.selector == record.selector or (
            plan.pool_node_names is not None and campaign.pool_node_names == plan.pool_node_names)
        if same_pool and campaign.node_names == plan.node_names:
            CampaignProposal.objects.filter(pk=proposal.pk).update(rehearsed=True, rehearsal=record)
            return proposal
    return None
