"""The campaigns worth proposing, decided over one snapshot (no ORM, no HTTP, no clock): the
GPU pools of a cluster as the GPU map names them, the node selector of each, and the best
campaign of each pool (as many nodes as can be freed together).

A pool is `capacity.gpumap.advice.node_pool`: the value of the first of NODE_POOL_LABELS a
node carries, else its GPU product. Its selector is that label and value, so the campaign
a proposal shows is the one `consolidate --pool KEY=VALUE` plans for the same nodes.
"""
from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from clusters.labels import GPU_PRODUCT_LABEL, ISVC_LABEL, KNATIVE_SERVICE_LABEL, NODE_POOL_LABELS
from clusters.snapshot import ClusterSnapshot, NodeView, PodView
from orgs.planning import HELD_EXEMPT, HELD_SNOOZED

from capacity.campaigns.planning import CampaignPlan, campaign_plan, pool_selector_text
from capacity.gpumap.advice import Scoring, node_pool


def pool_selector(node: NodeView) -> dict[str, str] | None:
    """The node label that names the node's pool (as `node_pool` reads it), as a selector;
    None for a node with neither a pool label nor a GPU product (no label selects its pool)."""
    for key in (*NODE_POOL_LABELS, GPU_PRODUCT_LABEL):
        if node.labels.get(key):
            return {key: node.labels[key]}
    return None


def gpu_pools(snapshot: ClusterSnapshot) -> dict[str, dict[str, str]]:
    """Pool name → its selector, for every pool of the snapshot's GPU nodes that a label names."""
    pools: dict[str, dict[str, str]] = {}
    for node in snapshot.nodes:
        if node.gpus_allocatable > 0 and (selector := pool_selector(node)) is not None:
            pools.setdefault(node_pool(node), selector)
    return dict(sorted(pools.items()))


# How a hold reads in a plan's "left out" line and in a dropped node's reason.
HOLD_WORDS = {HELD_EXEMPT: "exempted by an operator", HELD_SNOOZED: "snoozed by an operator"}


def workload_holds(pods: Iterable[PodView], *, namespaces: Mapping[str, str],
                   owners: Mapping[tuple[str, str, str], str]) -> dict[tuple[str, str], str]:
    """The holds `campaign_plan` takes ((namespace, workload) → reason) from what the orgs
    keep (`orgs.selectors.prune_holds`, its words HELD_EXEMPT / HELD_SNOOZED): whole
    namespaces (an exempt or snoozed org: each of its models and pynodes with a pod among
    `pods`) and single workloads ((kind, namespace, name): an exempt or snoozed model or
    pynode). The one reading of holds: the proposals, the plan a campaign starts from and
    each node's check before its defrag job starts all take it from here."""
    holds = {(namespace, name): HOLD_WORDS.get(word, word) for (_, namespace, name), word in owners.items()}
    if namespaces:
        for pod in pods:
            word = namespaces.get(pod.namespace)
            if word is None:
                continue
            for label in (ISVC_LABEL, KNATIVE_SERVICE_LABEL):
                if name := pod.labels.get(label):
                    holds.setdefault((pod.namespace, name), f"its org is {HOLD_WORDS.get(word, word)}")
    return holds


@dataclass(frozen=True)
class PoolProposal:
    pool: str
    plan: CampaignPlan


def proposals_plan(snapshot: ClusterSnapshot, *, held_nodes: Collection[str] = (),
                   holds: Mapping[tuple[str, str], str] | None = None,
                   scoring: str = Scoring.LEAST_ALLOCATED) -> list[PoolProposal]:
    """The best campaign (as many nodes as can be freed) of every GPU pool, by pool name."""
    return [PoolProposal(pool, campaign_plan(snapshot, selector=selector, goal=None, scoring=scoring,
                                             held_nodes=held_nodes, holds=holds))
            for pool, selector in gpu_pools(snapshot).items()]


def consolidate_command(*, cluster: str, selector: Mapping[str, str]) -> str:
    """The command that runs the proposed campaign: every freeable node of the pool (--max)."""
    return shlex.join(["manage.py", "consolidate", "--cluster", cluster, "--pool", pool_selector_text(selector),
                       "--max"])
