"""The facts the savings page is computed from: each app's record, read through its own
selectors, and the GPU counts only the cluster knows (one snapshot and the switchable
workloads' specs). The cluster is read after the permission check, in the view."""
from __future__ import annotations

from typing import TYPE_CHECKING

from datetime import datetime

from capacity.binpack.selectors import binpack_nodes_freed
from capacity.selectors import defrag_drains
from clusters import kube
from clusters.errors import KubeError
from clusters.labels import GPU_PRODUCT_LABEL
from clusters.selectors import snapshot_take
from orgs import selectors as org_selectors
from pruning.selectors import prune_actions_freeing

if TYPE_CHECKING:
    from clusters.models import Cluster

from savings.models import GpuPrice
from savings.planning import BinpackNodeFree, ExemptOrg, Facts, FloorChange, NodeDrain, PruneAction

LIVE_PHASES = ("Pending", "Running")


def savings_facts(*, cluster: Cluster, now: datetime, since: datetime,
                  gateway: kube.KubeGateway | None = None) -> Facts:
    slugs = org_selectors.org_slugs_by_namespace(cluster=cluster)
    changes = tuple(FloorChange(*c) for c in org_selectors.scale_to_zero_floor_changes(cluster=cluster, until=now))
    # No dormancy interval starts before the oldest change: no switch-off before it matters.
    offs = org_selectors.scale_to_zero_offs(cluster=cluster, since=min(c.at for c in changes)) if changes else {}
    prunes = tuple(
        PruneAction(org=slugs.get(a["namespace"], f"namespace {a['namespace']}"),
                    subject=f"{a['owner_kind']} {a['namespace']}/{a['owner_name']} (pod {a['pod']})",
                    gpus=len(a["gpus"] or ()), acted_at=a["acted_at"], restored_at=a["restored_at"],
                    namespace=a["namespace"], pod=a["pod"], owner_kind=a["owner_kind"], owner_name=a["owner_name"])
        for a in prune_actions_freeing(cluster=cluster, since=since))
    drains = tuple(NodeDrain(**d) for d in defrag_drains(cluster=cluster, until=now))
    frees = tuple(BinpackNodeFree(**f) for f in binpack_nodes_freed(cluster=cluster, until=now, since=since))
    exempt_rows = org_selectors.orgs_exempt_from_scale_to_zero(cluster=cluster, now=now)

    gpus_per_replica = node_gpus = None
    schedulable: frozenset[str] = frozenset()
    held: dict[str, int] | None = None
    node_models: dict[str, str] | None = None
    namespace_models: dict[str, str] = {}
    error = ""
    try:
        gateway = gateway or kube.gateway_for(cluster)
        snapshot = snapshot_take(gateway, now=now)
        node_gpus = {n.name: n.gpus_allocatable for n in snapshot.nodes}
        schedulable = frozenset(n.name for n in snapshot.nodes if not n.unschedulable)
        node_models = {n.name: n.labels.get(GPU_PRODUCT_LABEL, "") for n in snapshot.nodes if n.gpus_allocatable}
        held = {}
        used: dict[str, set[str]] = {}
        for pod in snapshot.pods:
            if pod.phase in LIVE_PHASES and not pod.terminating:
                held[pod.namespace] = held.get(pod.namespace, 0) + pod.gpus
                if pod.gpus and pod.node_name:
                    used.setdefault(pod.namespace, set()).add(node_models.get(pod.node_name, ""))
        # Only a namespace whose GPU pods all run on one known model says what its workloads use.
        namespace_models = {ns: next(iter(models)) for ns, models in used.items()
                            if len(models) == 1 and "" not in models}
        if changes:
            gpus_per_replica = org_selectors.workload_gpus_per_replica(cluster=cluster, gateway=gateway, now=now)
        else:
            gpus_per_replica = {}
    except KubeError as exc:
        error = str(exc)
    exempt = tuple(ExemptOrg(org=r.org, dormant=r.dormant,
                             gpus_held=None if held is None else held.get(r.namespace, 0), why=r.why)
                   for r in exempt_rows)
    return Facts(floor_changes=changes, scale_to_zero_offs=offs, gpus_per_replica=gpus_per_replica,
                 prune_actions=prunes, drains=drains, node_gpus=node_gpus, nodes_schedulable=schedulable,
                 exempt=exempt, cluster_error=error, node_models=node_models,
                 namespace_models=namespace_models, prices=gpu_prices(), binpack_frees=frees)


def gpu_prices() -> dict:
    """GPU model -> price per GPU-hour (Decimal), as the panel sets them."""
    return dict(GpuPrice.objects.values_list("gpu_model", "price_per_gpu_hour"))
