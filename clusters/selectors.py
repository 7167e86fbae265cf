"""Reads: which cluster, and what runs on it."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import F, QuerySet

from clusters import kube
from clusters.errors import KubeError, NotFound
from clusters.knative import AUTOSCALER_CONFIG_NAME, KNATIVE_NAMESPACE, InitialScale, initial_scale_from_config
from clusters.labels import APP_VERSION_LABEL
from clusters.models import Cluster
from clusters.snapshot import NODE_LIST, POD_LIST, ClusterSnapshot, NodeView, PodView, gc_paused

# Objects per LIST page for a whole-cluster snapshot. The API server answers a page in
# O(page) (etcd range reads, watch-cache pages), and each page is turned into views and let
# go before the next is asked for, so the raw JSON held at once is one page. Measured at
# 50,000 pods on the simulated cluster (bench/dashboard_render.py --pages): the time is
# the same from 250 to unpaged within the machine's noise (1.3-1.7 s), while the peak
# memory grows with the page: 84 MiB at 500, 94 at 1,000, 116 at 2,000, 181 at 5,000,
# 1,161 unpaged (the snapshot itself keeps 75). 1,000 stays near the smallest peak with
# half the round trips of kubectl's 500 (each one a network hop on a real cluster).
SNAPSHOT_PAGE_SIZE = 1000


def clusters_all() -> QuerySet[Cluster]:
    """Every cluster in service (not retired), by name."""
    return Cluster.objects.order_by("name")


def clusters_with_orgs() -> QuerySet[Cluster]:
    """The clusters in service at least one org in service runs on."""
    return Cluster.objects.filter(orgs__isnull=False, orgs__retired_at__isnull=True).distinct()


def cluster_names() -> list[str]:
    """The name of every cluster in service, in name order (one query)."""
    return list(Cluster.objects.order_by("name").values_list("name", flat=True))


def cluster_find(*, name: str | None = None, pk: int | None = None, retired: bool = False) -> Cluster | None:
    """The cluster in service with this name or id, or None. With `retired` (a history page),
    a retired cluster too: by name, the one in service first, else the latest retired."""
    rows = Cluster.all_objects if retired else Cluster.objects
    if pk is not None:
        return rows.filter(pk=pk).first()
    return rows.filter(name=name).order_by(F("retired_at").desc(nulls_first=True), "-pk").first()


def snapshot_take(gateway: kube.KubeGateway, *, now: datetime, namespace: str | None = None,
                  nodes: bool = True, gpu_nodes_only: bool = False,
                  page_size: int | None = SNAPSHOT_PAGE_SIZE) -> ClusterSnapshot:
    """The cluster as planning sees it: one paged LIST of nodes (unless `nodes` is False:
    a planner that reads only pods) and one of pods, in O(nodes + pods) time and with one
    page of raw JSON in memory at a time.

    With `gpu_nodes_only`, the snapshot holds the nodes with allocatable GPUs and only the
    pods bound to them (what the GPU map and the dashboard draw): the LISTs are the same,
    but the other objects are let go with their page instead of being made into views."""
    if gpu_nodes_only and not nodes:
        raise ValueError("gpu_nodes_only needs the nodes read (nodes=True)")
    with gc_paused():
        node_views = (_views_paged(gateway, kube.NODES, NodeView.from_fields, NODE_LIST, page_size=page_size)
                      if nodes else [])
        bound_to = None
        if gpu_nodes_only:
            node_views = [n for n in node_views if n.gpus_allocatable > 0]
            bound_to = frozenset(n.name for n in node_views)
        pods = _views_paged(gateway, kube.PODS, PodView.from_fields, POD_LIST, namespace=namespace,
                            page_size=page_size, bound_to=bound_to)
        return ClusterSnapshot.build(taken_at=now, nodes=node_views, pods=pods)


def _views_paged(gateway: kube.KubeGateway, resource: kube.Resource, view, decoder, *,
                 namespace: str | None = None, page_size: int | None,
                 bound_to: frozenset[str] | None = None) -> list:
    """Every object of a paged LIST as a view (with `bound_to`, only the pods bound to one of
    those nodes), each page decoded into just the fields the views read (`decoder`) and
    converted before the next one is asked for."""
    if bound_to is None:
        def take(items):
            return [view(o) for o in items]
    else:
        def take(items):
            return [view(o) for o in items if o.spec and o.spec.nodeName in bound_to]
    return gateway.list(resource, namespace=namespace, page_size=page_size, decoder=decoder, take=take)


def namespace_version(gateway: kube.KubeGateway, namespace: str) -> str | None:
    """`app.kubernetes.io/version` of a system namespace, as Knative and KServe installs set it."""
    try:
        ns = gateway.get(kube.NAMESPACES, namespace)
    except NotFound:
        return None
    return ((ns.get("metadata") or {}).get("labels") or {}).get(APP_VERSION_LABEL)


def knative_initial_scale_read(gateway: kube.KubeGateway) -> InitialScale:
    """What the cluster's `config-autoscaler` says about a zero initial scale (one GET).
    A ConfigMap that cannot be read (no permission, no answer) is no failure of the
    caller's work: it reads as "not allowed", with the reason in `cause`, since a write
    without initial-scale "0" is one Knative accepts whatever the flag."""
    try:
        config = gateway.get(kube.CONFIGMAPS, AUTOSCALER_CONFIG_NAME, namespace=KNATIVE_NAMESPACE)
    except NotFound:
        return initial_scale_from_config(config=None)
    except KubeError as exc:
        return initial_scale_from_config(config=None, error=str(exc))
    return initial_scale_from_config(config=config.get("data") or {})


def node_allocatable_largest(gateway: kube.KubeGateway, *, resources: tuple[str, ...] = ("cpu", "memory")
                             ) -> dict[str, tuple[Decimal, str]]:
    """The most of each resource any one node of the cluster can give a pod (its
    allocatable), by name: (amount, as the node states it); a resource no node states is
    left out."""
    largest: dict[str, tuple[Decimal, str]] = {}

    def take(items: list) -> list:
        for node in items:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            for name in resources:
                try:
                    amount = kube.quantity_parse(str(allocatable[name]))
                except (KeyError, ValueError):
                    continue
                if name not in largest or amount > largest[name][0]:
                    largest[name] = (amount, str(allocatable[name]))
        return []

    gateway.list(kube.NODES, take=take)
    return largest
