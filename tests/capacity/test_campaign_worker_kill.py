"""A campaign on a real Celery worker (prefork, Redis broker, this test's PostgreSQL) whose
pool process is SIGKILLed while a node of it is being emptied: the message comes back
(acks_late, reject_on_worker_lost), takes its own lease back, and the campaign finishes with
every planned node freed, no replacement on a campaign node and every pod moved once.

The simulated cluster's clock runs (speed 50), so the worker sees pods start on its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from audit.selectors import entries_of_subject
from capacity.campaigns.models import Campaign, CampaignState, NodeState
from capacity.campaigns.services import LEASE_SECONDS
from capacity.defrag.models import DefragOrphan
from campaign_cluster import half_full_pool, plan_now, start
from defrag_cluster import Kube
from tests.celery_workers import CELERY, ROOT, broker_url, celery_processes, pool_children, wait_for  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class World:
    """What `campaign_cluster.start` needs of a world, for a cluster whose clock runs."""

    def __init__(self, handle):
        from clusters import kube as gateway

        self.cluster = handle.cluster
        self.gateway = gateway.gateway_for(handle.cluster)
        self.kube = Kube(handle.kubeconfig_path)

    def now(self):
        from config import clock

        return clock.now()


def test_a_killed_pool_process_mid_campaign_resumes_and_frees_the_planned_nodes(sim_cluster_factory,
                                                                               celery_processes):
    handle = sim_cluster_factory(half_full_pool(4), name="sim", speed=50.0)
    world = World(handle)
    for _ in range(400):                     # wall time: the cluster's clock runs
        if sum(1 for p in world.kube.pods() if p.status.phase == "Running") == 8:
            break
        time.sleep(0.05)
    before = {p.metadata.name: p.spec.node_name for p in world.kube.pods()}
    plan = plan_now(world)
    campaign = start(world, max_in_flight=1)

    procs = celery_processes
    procs.env.update({"CAPACITY_DEFRAG_POLL_SECONDS": "0.5", "CAPACITY_CAMPAIGN_POLL_SECONDS": "0.5"})
    procs.start("worker", "worker", "--pool=prefork", "--concurrency=2", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"campaign-test-{os.getpid()}@%h", "--loglevel=INFO")
    wait_for(lambda: "ready." in procs.log("worker"), "the worker is ready", procs)
    subprocess.run([str(CELERY), "-A", "config", "call", "capacity.tasks.campaign_run", f"--args=[{campaign.pk}]"],
                   cwd=ROOT, env=procs.env, check=True, capture_output=True, timeout=60)
    wait_for(lambda: Campaign.objects.filter(pk=campaign.pk, nodes__state=NodeState.RUNNING).exclude(
        lease_owner="").exists(), "the worker cordons the nodes and starts the first", procs)

    for child in pool_children(procs.procs["worker"][0].pid):
        os.kill(child, signal.SIGKILL)       # whichever pool process holds the campaign or its job
    wait_for(lambda: Campaign.objects.get(pk=campaign.pk).state == CampaignState.DONE,
             "a new pool process takes the campaign back and finishes it", procs, limit_s=LEASE_SECONDS * 4)
    assert "WorkerLostError" in procs.log("worker") or "exited by signal" in procs.log("worker")

    campaign.refresh_from_db()
    freed = set(plan.node_names)
    assert set(campaign.nodes.values_list("state", flat=True)) == {NodeState.SAFE}
    assert all(world.kube.node_cordoned(n) for n in freed)
    # Every replacement runs outside the campaign; only the orphans (still serving) are on its nodes.
    orphans = set(DefragOrphan.objects.filter(job__campaign_nodes__campaign=campaign).values_list("pod_name",
                                                                                                  flat=True))
    assert orphans == {p for p, node in before.items() if node in freed}
    for pod in world.kube.pods():
        if pod.metadata.name not in orphans:
            assert pod.spec.node_name not in freed, pod.metadata.name
    # Each side effect recorded once despite the kill.
    actions = [e.action for e in entries_of_subject(subject_type="campaign", subject_id=campaign.pk)]
    assert actions.count("node_cordon") == len(freed) and actions.count("node_start") == len(freed)
    assert actions.count("campaign_done") == 1
