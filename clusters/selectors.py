"""Reads: which cluster, and what runs on it."""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet

from clusters import kube
from clusters.errors import NotFound
from clusters.labels import APP_VERSION_LABEL
from clusters.models import Cluster
from clusters.services import cluster_sync_default
from clusters.snapshot import ClusterSnapshot, NodeView, PodView

# Objects per LIST page for a whole-cluster snapshot. kubectl pages by 500, but each page
# is a round trip and the API server re-walks the list for every page; 5,000 keeps a
# 10,000-pod snapshot to three requests while a 100,000-pod one still pages.
SNAPSHOT_PAGE_SIZE = 5000


def cluster_get(*, name: str | None = None) -> Cluster:
    """The named cluster, or the default one (made from the environment on first use)."""
    if name is None or name == settings.DEFAULT_CLUSTER_NAME:
        default = cluster_sync_default()
        if default is not None:
            return default
        name = name or settings.DEFAULT_CLUSTER_NAME
    try:
        return Cluster.objects.get(name=name)
    except Cluster.DoesNotExist:
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
        raise Cluster.DoesNotExist(f"no cluster named {name!r} (known: {known})") from None


def clusters_all() -> QuerySet[Cluster]:
    """Every registered cluster, by name."""
    return Cluster.objects.order_by("name")


def clusters_with_orgs() -> QuerySet[Cluster]:
    """The clusters at least one org runs on."""
    return Cluster.objects.filter(orgs__isnull=False).distinct()


def cluster_names() -> list[str]:
    """The name of every registered cluster, in name order (one query)."""
    return list(Cluster.objects.order_by("name").values_list("name", flat=True))


def cluster_find(*, name: str | None = None, pk: int | None = None) -> Cluster | None:
    """The cluster with this name or id, or None."""
    if pk is not None:
        return Cluster.objects.filter(pk=pk).first()
    return Cluster.objects.filter(name=name).first()


def snapshot_take(gateway: kube.KubeGateway, *, now: datetime, namespace: str | None = None,
                  nodes: bool = True) -> ClusterSnapshot:
    """The cluster as planning sees it: one paged LIST of nodes (unless `nodes` is False:
    a planner that reads only pods) and one of pods."""
    node_views = ([NodeView.from_object(o) for o in gateway.list(kube.NODES, page_size=SNAPSHOT_PAGE_SIZE)]
                  if nodes else [])
    pods = [PodView.from_object(o) for o in gateway.list(kube.PODS, namespace=namespace,
                                                          page_size=SNAPSHOT_PAGE_SIZE)]
    return ClusterSnapshot.build(taken_at=now, nodes=node_views, pods=pods)


def namespace_version(gateway: kube.KubeGateway, namespace: str) -> str | None:
    """`app.kubernetes.io/version` of a system namespace, as Knative and KServe installs set it."""
    try:
        ns = gateway.get(kube.NAMESPACES, namespace)
    except NotFound:
        return None
    return ((ns.get("metadata") or {}).get("labels") or {}).get(APP_VERSION_LABEL)
