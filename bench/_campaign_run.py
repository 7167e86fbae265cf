"""Campaigns and the GPU map's one-node-at-a-time advice, executed on the simulated cluster
(for bench/campaign.py and its test): the product's own services stepped in-process on the
cluster's manual clock, as workers would step them, each run on a fresh copy of the cluster.

    executed = run_campaign(scenario, selector={...}, scoring="LeastAllocated", max_in_flight=2)
    executed = run_one_at_a_time(scenario, selector={...}, scoring="LeastAllocated")

`scenario`: what simcluster serves (a path, YAML text or a list of objects).

Django must be set up with a database (bench/_django.py) and `tests/capacity` on the path.
What each run measures (`Executed`): nodes freed (safe), pods moved (orphaned by a job),
pods moved more than once (a job orphaned a pod that was not on the cluster when the run
began: a replacement that had landed on a node freed later), replacements landing on a
node being freed (those, plus new pods still on a freed node at the end), the simulated
seconds from the start to the last node safe, and the API calls of each pass per node in
flight (a pass: the campaign's step and its due jobs' steps, or the one job's step).
"""
from __future__ import annotations

import itertools
import statistics
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from config.actors import acting_as

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign
from capacity.campaigns.planning import selects
from capacity.campaigns.selectors import campaign_plan_read
from capacity.campaigns.services import campaign_start, campaign_step
from capacity.defrag.models import LIVE_STATES, RUNNING_STATES, DefragJob, JobState
from capacity.defrag.services import defrag_discover, defrag_job_start, defrag_job_step
from capacity.gpumap.advice import Freeing, defrag_advice
from clusters.kube import KubeGateway
from clusters.models import Cluster
from clusters.selectors import snapshot_take
from simcluster.control import SimControl
from simcluster.resources import PODS
from simcluster.testing import ClusterServer

OPERATOR = "cli:bench@campaign"
TICK_SECONDS = 1.0          # simulated time between two looks at what is due
SETTLE_SECONDS = 600        # simulated time the cluster gets to place its pods first
JOB_SECONDS = 900           # a one-at-a-time job not safe by then counts as not freed
_names = itertools.count(1)


@dataclass(frozen=True)
class Executed:
    way: str
    freed: int
    pods_moved: int
    moved_twice: int
    onto_freed: int
    seconds_to_all_safe: float | None
    calls_per_check: float | None     # median API calls of a pass per node in flight
    passes: int

    @property
    def moves_per_node(self) -> float | None:
        return self.pods_moved / self.freed if self.freed else None


@contextmanager
def served(scenario, *, placement: str | None = None):
    """The cluster served on its own, its pods placed; `placement` then replaces the
    scheduler's (a pool filled under spreading, consolidated under bin-packing)."""
    with tempfile.TemporaryDirectory(prefix="campaign-run-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server = ClusterServer(scenario, kubeconfig_out=str(kubeconfig))
        server.start()
        try:
            control = SimControl(server.url)
            for _ in range(SETTLE_SECONDS // 10):
                control.advance(10)
                if all(p.get("spec", {}).get("nodeName") for p in server.sim.store.all(PODS)
                       if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")):
                    break
            if placement:
                server.sim.settings.placement = placement
            cluster = Cluster.objects.create(name=f"bench-run-{next(_names)}", kubeconfig_path=str(kubeconfig))
            gateway = KubeGateway.from_kubeconfig(str(kubeconfig), name=cluster.name)
            yield server.sim.clock.now, control, cluster, gateway
        finally:
            server.stop()


def _measure(way: str, *, before, after, jobs: list[DefragJob], started, samples: list[float],
             freed_nodes: set[str]) -> Executed:
    before_names = {f"{p.namespace}/{p.name}" for p in before.pods}
    before_uids = {p.uid for p in before.pods}
    orphans = [f"{o.namespace}/{o.pod_name}" for job in jobs for o in job.orphans.all()]
    again = sum(1 for o in orphans if o not in before_names)
    stayed = sum(1 for p in after.pods if p.uid not in before_uids and p.live and p.gpus > 0
                 and p.node_name in freed_nodes)
    safe = [j for j in jobs if j.state in (JobState.SAFE, JobState.DRAINED)]
    seconds = (max(j.safe_at for j in safe) - started).total_seconds() if safe and len(safe) == len(jobs) else None
    return Executed(way=way, freed=len(safe), pods_moved=len(orphans), moved_twice=again, onto_freed=again + stayed,
                    seconds_to_all_safe=seconds,
                    calls_per_check=statistics.median(samples) if samples else None, passes=len(samples))


def run_campaign(scenario, *, selector: Mapping[str, str], scoring: str, max_in_flight: int,
                 placement: str | None = None, max_seconds: float = 36000) -> Executed:
    """The campaign over the whole pool (as many nodes as can be freed), stepped when due."""
    with served(scenario, placement=placement) as (now, control, cluster, gateway):
        before = snapshot_take(gateway, now=now())
        plan = campaign_plan_read(cluster=cluster, selector=selector, goal=None, scoring=scoring, now=now(),
                                  gateway=gateway)
        way = f"campaign, {max_in_flight} in flight"
        if not plan.nodes:
            return _measure(way, before=before, after=before, jobs=[], started=now(), samples=[], freed_nodes=set())
        with acting_as(OPERATOR):
            campaign = campaign_start(cluster=cluster, plan=plan, actor=None, max_in_flight=max_in_flight,
                                      gateway=gateway, now=now(), enqueue=False)
        started, samples = now(), []
        while campaign.state in LIVE_CAMPAIGN_STATES:
            if (now() - started).total_seconds() > max_seconds:
                raise RuntimeError(f"campaign still {campaign.state} after {max_seconds:g} simulated seconds")
            calls = gateway.calls_total()
            in_flight = _running(campaign)
            jobs_before = _jobs(campaign).count()
            passed = campaign.next_check_at is None or campaign.next_check_at <= now()
            if passed:
                campaign = campaign_step(campaign=campaign, gateway=gateway, now=now(), enqueue=False)
            for job in _jobs(campaign).filter(state__in=LIVE_STATES):
                defrag_job_step(job=job, gateway=gateway, now=now())
            # A steady pass: the campaign looked at its nodes in flight and started none.
            if passed and in_flight and _jobs(campaign).count() == jobs_before:
                samples.append((gateway.calls_total() - calls) / in_flight)
            campaign.refresh_from_db()
            if campaign.state in LIVE_CAMPAIGN_STATES:
                control.advance(TICK_SECONDS)
        after = snapshot_take(gateway, now=now())
        jobs = list(_jobs(campaign).order_by("pk"))
        # A node the campaign dropped is back in service: a replacement landing there later is not
        # one on a node the campaign frees.
        return _measure(way, before=before, after=after, jobs=jobs, started=started, samples=samples,
                        freed_nodes={j.node_name for j in jobs if j.state in (JobState.SAFE, JobState.DRAINED)})


def _jobs(campaign: Campaign):
    return DefragJob.objects.filter(campaign_nodes__campaign=campaign)


def _running(campaign: Campaign) -> int:
    return _jobs(campaign).filter(state__in=RUNNING_STATES).count()


def run_one_at_a_time(scenario, *, selector: Mapping[str, str], scoring: str,
                      placement: str | None = None) -> Executed:
    """The GPU map's candidates in the pool, one defrag job at a time: the advice read
    afresh before each, its first candidate that frees its node started once the previous
    job is safe, until the advice has none left."""
    with served(scenario, placement=placement) as (now, control, cluster, gateway):
        before = snapshot_take(gateway, now=now())
        started, samples, jobs, tried = now(), [], [], set()
        while True:
            snapshot = snapshot_take(gateway, now=now())
            pool = {n.name for n in snapshot.nodes if selects(selector, n)}
            step = next((s for s in defrag_advice(snapshot, scoring=scoring).steps
                         if s.outcome == Freeing.TOGETHER and s.node in pool and s.node not in tried), None)
            if step is None:
                break
            tried.add(step.node)
            plan = defrag_discover(cluster=cluster, node_name=step.node, gateway=gateway)
            with acting_as(OPERATOR):
                job = defrag_job_start(cluster=cluster, node_name=step.node, plan=plan, now=now(), enqueue=False)
            began = now()
            while job.state in LIVE_STATES and job.state != JobState.SAFE:
                if (now() - began).total_seconds() > JOB_SECONDS:
                    break
                calls, waiting = gateway.calls_total(), job.state == JobState.WAITING
                job = defrag_job_step(job=job, gateway=gateway, now=now())
                if waiting and gateway.calls_total() > calls:
                    samples.append(gateway.calls_total() - calls)
                if job.state in LIVE_STATES and job.state != JobState.SAFE:
                    control.advance(TICK_SECONDS)
            jobs.append(job)
        after = snapshot_take(gateway, now=now())
        freed = {j.node_name for j in jobs if j.state == JobState.SAFE}
        return _measure("one at a time (the map's rank order)", before=before, after=after, jobs=jobs,
                        started=started, samples=samples, freed_nodes=freed)
