"""A consolidation campaign end to end on both backends: simcluster and the real control
plane (upstream kube-scheduler placing the replacements, Knative Serving 1.15's
PodAutoscalers counting the orphans).

The models name the `bin-packing-scheduler` profile, MostAllocated on both backends
(realcluster/cluster.py, simcluster/controllers/scheduler.py), and the product plans with
CAPACITY_SCHEDULER_SCORING=MostAllocated to match. The campaign and its defrag jobs are
stepped as tests/capacity/campaign_cluster.py steps them, with the backend's `now`.

What must hold on both: the planned nodes are freed (safe), no replacement lands on a
campaign node, every moved pod moves once. Where the scheduler put each replacement
against where the plan said is measured (`campaign_outcome`) and printed, not asserted:
upstream kube-scheduler scores more than the planner simulates (see the README's real tier
notes; the disagreement this layout shows is explained in
`test_campaign_frees_the_planned_nodes_and_moves_each_pod_once`).

Every test's nodes are its own (see pool.py) and live well under 50 s (see
test_features_defrag.py).
"""
from __future__ import annotations

import pytest

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign, NodeState
from capacity.campaigns.outcome import campaign_outcome
from capacity.campaigns.selectors import campaign_plan_read
from capacity.campaigns.services import campaign_rehearse, campaign_start, campaign_step
from capacity.defrag.models import LIVE_STATES, DefragJob
from capacity.defrag.services import defrag_job_step
from clusters import kube
from clusters.selectors import snapshot_take
from simcluster.controllers.scheduler import BIN_PACKING_SCHEDULER
from tests.capacity.cluster_dump import cluster_dump

from .pool import POOL_KEY, GpuPool

# Seconds of simulated time on simcluster, of wall time on the real tier.
BOUND_SECONDS = 20
READY_SECONDS = 30
CAMPAIGN_SECONDS = 60


@pytest.fixture
def gpus(tier_cluster, settings):
    _, backend = tier_cluster
    # The plan must score nodes as the models' scheduler does; the jobs poll every second.
    settings.CAPACITY_SCHEDULER_SCORING = "MostAllocated"
    settings.CAPACITY_DEFRAG_POLL_SECONDS = 1.0
    settings.CAPACITY_CAMPAIGN_POLL_SECONDS = 1.0
    pool = GpuPool(backend, "campaign")
    yield pool
    pool.close()


def cordon(pool: GpuPool, node: str, on: bool) -> None:
    pool.core.patch_node(node, {"spec": {"unschedulable": on}})


def place(pool: GpuPool, node: str, model: str, *, pods: int, gpus: int) -> None:
    """Start `model` with only `node` open, and wait until the scheduler has bound its pods."""
    for other in pool.nodes:
        cordon(pool, other, other != node)
    pool.knative_service(model, min_scale=pods, gpus=gpus, scheduler=BIN_PACKING_SCHEDULER)
    pool.backend.settle(lambda: len([p for p in pool.pods(revision=f"{model}-00001") if p.spec.node_name]) == pods,
                        what=f"{pods} pod(s) of {model} bound to {node}", seconds=BOUND_SECONDS)


def tick(cluster, backend, campaign: Campaign) -> Campaign:
    """One pass of the campaign, then one step of each of its live defrag jobs."""
    gateway = kube.gateway_for(cluster)
    campaign = campaign_step(campaign=campaign, gateway=gateway, now=backend.now(), enqueue=False)
    for job in DefragJob.objects.filter(campaign_nodes__campaign=campaign, state__in=LIVE_STATES):
        defrag_job_step(job=job, gateway=gateway, now=backend.now())
    return campaign


def test_campaign_frees_the_planned_nodes_and_moves_each_pod_once(tier_cluster, gpus, tmp_path):
    """Four 8-GPU nodes: a holds `pair` (2 pods of 1 GPU), b `solo` (1 of 1), c `fill-c`
    (5 GPUs), d `fill-d` (4 GPUs). The plan frees b then a: solo to c, pair's two pods to c
    as well (MostAllocated: the fullest node that fits).

    Upstream kube-scheduler adds PodTopologySpread's default constraint (pods of one
    ReplicaSet spread over hostnames, ScheduleAnyway, weight 2) to NodeResourcesFit
    (weight 1): once pair's first replacement is on c, c scores 66 of 100 for spreading
    against d's 100 (×2: 132 against 200), while MostAllocated gives c 71 and d 44
    (GPUs weighted 5 of 7), so pair's second replacement lands on d. simcluster and the
    planner score resources only and put it on c."""
    cluster, backend = tier_cluster
    a, b, c, d = (gpus.node_add(suffix) for suffix in ("a", "b", "c", "d"))
    for node, model, pods, size in ((c, "fill-c", 1, 5), (d, "fill-d", 1, 4), (a, "pair", 2, 1), (b, "solo", 1, 1)):
        place(gpus, node, model, pods=pods, gpus=size)
    for node in gpus.nodes:
        cordon(gpus, node, False)
    backend.settle(lambda: all(gpus.model_ready(f"{m}-00001", n) for m, n in (
        ("fill-c", 1), ("fill-d", 1), ("pair", 2), ("solo", 1))), what="every model ready", seconds=READY_SECONDS)
    gateway = kube.gateway_for(cluster)
    before = snapshot_take(gateway, now=backend.now())
    on_freed = {f"{p.namespace}/{p.name}" for n in (a, b) for p in before.pods_on(n) if p.live}

    plan = campaign_plan_read(cluster=cluster, selector={POOL_KEY: gpus.ns}, goal=None, gateway=gateway,
                              now=backend.now())
    assert plan.node_names == (b, a), plan.report_lines()
    assert sorted((m.source, m.to) for m in plan.moves) == [(a, c), (a, c), (b, c)]
    assert (plan.pods_moved_twice, plan.replacements_on_campaign_nodes, plan.most_freeable) == (0, 0, 2)

    # Rehearsed first, on a copy of a dump of this backend (as `consolidate --rehearse` does):
    # the copy frees the same nodes the real run must.
    rehearsal = campaign_rehearse(dump=cluster_dump(cluster.kubeconfig_path, tmp_path / "cluster.json"),
                                  selector={POOL_KEY: gpus.ns}, goal=None, max_in_flight=1, cluster=cluster)
    print(f"\n[{backend.name}] rehearsal:\n  " + "\n  ".join(rehearsal.outcome.report_lines()))
    assert rehearsal.plan.node_names == plan.node_names
    assert rehearsal.outcome.freed == (b, a) and rehearsal.outcome.replacements_on_campaign_nodes == 0

    started_at = backend.now()
    campaign = campaign_start(cluster=cluster, plan=plan, actor=None, max_in_flight=1, gateway=gateway,
                              now=started_at, enqueue=False)
    current = [campaign]

    def finished() -> bool:
        current[0] = tick(cluster, backend, current[0])
        return current[0].state not in LIVE_CAMPAIGN_STATES

    try:
        backend.settle(finished, what="the campaign done", seconds=CAMPAIGN_SECONDS)
    except AssertionError as exc:
        rows = [(n.node_name, n.state, n.waiting_reason, n.dropped_reason) for n in current[0].nodes.all()]
        raise AssertionError(f"{exc}: {rows} {current[0].error}") from None
    campaign = current[0]
    rows = {n.node_name: n for n in campaign.nodes.all()}
    assert campaign.state == "done"
    assert {node: row.state for node, row in rows.items()} == {a: NodeState.SAFE, b: NodeState.SAFE}
    safe_at = max(row.job.safe_at for row in rows.values())

    after = snapshot_take(gateway, now=backend.now())
    outcome = campaign_outcome(plan, before=before, after=after,
                               node_states={n: (row.state, row.dropped_reason) for n, row in rows.items()},
                               seconds_to_all_safe=(safe_at - started_at).total_seconds())
    print(f"\n[{backend.name}] campaign outcome:\n  " + "\n  ".join(outcome.report_lines()))
    assert outcome.freed == (b, a) and outcome.same_nodes_as_planned
    assert set(outcome.freed) == set(rehearsal.outcome.freed)      # the rehearsal predicted the real run
    # No replacement on a campaign node, none Pending, every replacement on the pool's other nodes.
    assert outcome.replacements_on_campaign_nodes == 0 and not outcome.pending
    assert len(outcome.replacements) == 3 and {node for _, node in outcome.replacements} <= {c, d}
    for _, node in outcome.replacements:
        assert node not in (a, b)
    # Each pod of the freed nodes moved once: every one orphaned by exactly one job, and no
    # replacement orphaned again.
    orphaned = [f"{o.namespace}/{o.pod_name}" for row in rows.values() for o in row.job.orphans.all()]
    assert sorted(orphaned) == sorted(on_freed)
    # The nodes stay cordoned and hold only the orphans, serving until drained.
    for node in (a, b):
        assert gpus.node_cordoned(node)
        assert {f"{p.metadata.namespace}/{p.metadata.name}" for p in gpus.pods(node=node)} <= on_freed
    print(f"[{backend.name}] placements agreeing with the plan: {outcome.placements_agreeing} of "
          f"{outcome.placements_planned}")
    for placement in outcome.disagreements:
        print(f"[{backend.name}]   {placement.revision}: {disagreement_why(placement)}")


def disagreement_why(placement) -> str:
    """Why the scheduler put a revision's replacements elsewhere than the plan, as far as
    the placements themselves tell."""
    stacked = max(placement.planned.count(n) for n in set(placement.planned))
    if stacked > 1 and len(set(placement.landed)) > len(set(placement.planned)):
        return ("the plan stacks its pods on one node, the scheduler spread them over "
                f"{', '.join(sorted(set(placement.landed)))}: kube-scheduler's PodTopologySpread default constraint "
                "(one ReplicaSet's pods over hostnames, ScheduleAnyway, score weight 2) outweighs "
                "NodeResourcesFit's MostAllocated score (weight 1); the planner scores GPUs only")
    return ("a tie on the planner's GPU fit broken otherwise (upstream at random), or cpu and memory "
            "requests scored beside GPUs")
