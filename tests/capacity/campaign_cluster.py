"""A pool of six half-full GPU nodes on the simulated cluster for the campaign tests, and a
runner that steps a campaign and its defrag jobs on the cluster's clock, as workers would."""
from __future__ import annotations

from config.actors import acting_as

from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, Campaign
from capacity.campaigns.selectors import campaign_plan_read
from capacity.campaigns.services import campaign_drive, campaign_pass, campaign_start
from capacity.defrag.models import RUNNING_STATES, DefragJob
from defrag_builders import make_node
from defrag_cluster import NS, knative_service

POOL = {"karpenter.sh/nodepool": "h100"}
OPERATOR = "cli:ops@bastion"     # who started the campaigns: every pass acts on their behalf


def half_full_pool(nodes: int = 6) -> list[dict]:
    """`nodes` 8-GPU nodes and `nodes` models of two 2-GPU pods each: the scheduler spreads
    them two to a node (4 of 8 GPUs used everywhere)."""
    return ([make_node(f"n{i}") for i in range(1, nodes + 1)]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
            + [knative_service(f"m{i}", min_scale=2, gpus=2) for i in range(1, nodes + 1)])


def plan_now(world, *, goal=None):
    return campaign_plan_read(cluster=world.cluster, selector=POOL, goal=goal, gateway=world.gateway,
                              now=world.now())


def start(world, *, goal=None, max_in_flight: int = 1, **kwargs) -> Campaign:
    plan = plan_now(world, goal=goal)
    with acting_as(OPERATOR):
        return campaign_start(cluster=world.cluster, plan=plan, actor=None, max_in_flight=max_in_flight,
                              gateway=world.gateway, now=world.now(), enqueue=False, **kwargs)


def tick(world, campaign: Campaign) -> Campaign:
    """One pass of the campaign, then one step of each of its live defrag jobs."""
    return campaign_pass(campaign=campaign, gateway=world.gateway, now=world.now())


def run(world, campaign: Campaign, *, until=None, dt: float = 2.0, max_ticks: int = 300, seen_running=None):
    """Tick until the campaign is no longer live (or `until(campaign)` holds). `seen_running`,
    a list, receives how many of its jobs were running after each tick."""
    def count_running(campaign):
        seen_running.append(DefragJob.objects.filter(campaign_nodes__campaign=campaign,
                                                     state__in=RUNNING_STATES).count())

    campaign = campaign_drive(campaign=campaign, gateway=world.gateway, now=world.now, advance=world.advance,
                              poll_seconds=dt, max_seconds=dt * (max_ticks - 1), until=until,
                              after_pass=count_running if seen_running is not None else None)
    if until(campaign) if until else campaign.state not in LIVE_CAMPAIGN_STATES:
        return campaign
    rows = [(n.node_name, n.state, n.waiting_reason, n.dropped_reason) for n in campaign.nodes.all()]
    raise AssertionError(f"campaign stuck in {campaign.state}: {rows} {campaign.error}")
