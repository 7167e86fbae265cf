"""Reads: which cluster, and what runs on it."""
from __future__ import annotations

from django.conf import settings

from clusters import kube
from clusters.errors import NotFound
from clusters.models import Cluster
from clusters.services import cluster_sync_default


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


def namespace_version(gateway: kube.KubeGateway, namespace: str) -> str | None:
    """`app.kubernetes.io/version` of a system namespace, as Knative and KServe installs set it."""
    try:
        ns = gateway.get(kube.NAMESPACES, namespace)
    except NotFound:
        return None
    return ((ns.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/version")
