"""What a cluster serves: the API groups the product acts on, and the Knative it runs.

A cluster without KServe (or Kubeflow, Kthena, metrics) is normal: kube-apiserver then
answers a path of that group with 404 "404 page not found", which must read as "none of
those workloads here", never as a failure that stops the rest of the work. So the groups
are read through discovery (`GET /apis`), kept on the `Cluster` row (shown in its admin
page with the time they were read), refreshed on a schedule (`clusters.tasks`), when
older than `MAX_AGE`, and at once when a list of a whole group answers 404.

The Knative Serving version is read from what the cluster says, in order: the
`knative-serving` namespace's `app.kubernetes.io/version` label, its
`serving.knative.dev/release` label, the same labels on the `controller` Deployment, and
that Deployment's image tag. Upstream's source manifests carry `devel` in the first
label (release manifests carry the number), and release images are pinned by digest, so
"unknown" is an ordinary answer: callers must choose what is safe without it.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from clusters import knative, kube
from clusters.errors import KubeError, NotFound
from clusters.labels import APP_VERSION_LABEL, RELEASE_LABEL
from clusters.models import Cluster

logger = logging.getLogger(__name__)

# The groups the product acts on, and what an operator calls them.
GROUPS: dict[str, str] = {
    kube.KNATIVE_SERVICES.group: "Knative Serving",
    kube.PODAUTOSCALERS.group: "Knative autoscaling (PodAutoscalers)",
    kube.INFERENCESERVICES.group: "KServe",
    kube.NOTEBOOKS.group: "Kubeflow notebooks",
    kube.MODELSERVINGS.group: "Kthena",
    "metrics.k8s.io": "resource metrics",
}
# How long a discovery answer is trusted before it is read again (minutes; the schedule
# refreshes every 5, so this only bites when the beat is not running).
MAX_AGE = timedelta(minutes=15)

KNATIVE_NAMESPACE = knative.KNATIVE_NAMESPACE
KNATIVE_CONTROLLER = "controller"
VERSION_LABELS = (APP_VERSION_LABEL, RELEASE_LABEL)  # in order of preference


@dataclass(frozen=True)
class ServedGroups:
    """The product's groups a cluster serves (`known` False: discovery could not be read,
    so every group is tried and a 404 on a list still counts as "not served")."""

    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seen_at: datetime | None = None
    known: bool = True

    def serves(self, resource: kube.Resource) -> bool:
        if not resource.group or not self.known:
            return True
        return resource.version in self.groups.get(resource.group, ())

    def describe(self) -> list[str]:
        return [f"{label} ({group}): {'served, ' + ', '.join(self.groups[group]) if group in self.groups else 'not served'}"
                for group, label in GROUPS.items()]


def _from_row(cluster: Cluster) -> ServedGroups:
    return ServedGroups(groups={g: tuple(v) for g, v in (cluster.api_groups or {}).items()},
                        seen_at=cluster.api_groups_seen_at, known=cluster.api_groups_seen_at is not None)


def cluster_discovery_refresh(*, cluster: Cluster, now: datetime,
                              gateway: kube.KubeGateway | None = None) -> ServedGroups:
    """Read discovery now and record it on the cluster row. A failure is recorded and the
    last answer kept (or none: then every group is tried)."""
    try:
        served = (gateway or kube.gateway_for(cluster)).api_groups()
    except KubeError as exc:
        logger.warning("cluster %s: cannot read API discovery: %s", cluster.name, exc)
        cluster.api_groups_error = f"{now:%Y-%m-%d %H:%M:%S %Z}: {exc}"[:2000]
        Cluster.objects.filter(id=cluster.id).update(api_groups_error=cluster.api_groups_error)
        return _from_row(cluster)
    cluster.api_groups = {g: served[g] for g in GROUPS if g in served}
    cluster.api_groups_seen_at, cluster.api_groups_error = now, ""
    Cluster.objects.filter(id=cluster.id).update(api_groups=cluster.api_groups,
                                                 api_groups_seen_at=now, api_groups_error="")
    return _from_row(cluster)


def served_groups(*, cluster: Cluster, now: datetime, gateway: kube.KubeGateway | None = None) -> ServedGroups:
    """The recorded answer while it is younger than MAX_AGE, else a fresh one."""
    seen = cluster.api_groups_seen_at
    if seen is not None and timedelta(0) <= now - seen < MAX_AGE:
        return _from_row(cluster)
    return cluster_discovery_refresh(cluster=cluster, now=now, gateway=gateway)


def list_if_served(gateway: kube.KubeGateway, resource: kube.Resource, *, cluster: Cluster, now: datetime,
                   served: ServedGroups, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict] | None:
    """The objects, or None when the cluster does not serve `resource`'s group.

    A 404 on a list means the collection itself does not exist (a list in a namespace
    with nothing in it answers 200 and no items): the group was uninstalled since
    discovery was read, so discovery is read again before saying so."""
    if not served.serves(resource):
        return None
    try:
        return gateway.list(resource, namespace=namespace, label_selector=label_selector)
    except NotFound:
        fresh = cluster_discovery_refresh(cluster=cluster, now=now, gateway=gateway)
        if fresh.known and fresh.serves(resource):
            raise
        return None


# --- the Knative version, from what the cluster says ------------------------------------------
@dataclass(frozen=True)
class KnativeVersion:
    """`version` as the cluster states it ("" when nothing states a number), where it was
    read, and what was looked at (for the panel)."""

    version: str
    source: str
    looked_at: tuple[str, ...] = ()


_NUMBER = re.compile(r"\d+\.\d+")


def _has_number(text: str | None) -> bool:
    return bool(text and _NUMBER.search(text))


def image_tag(image: str) -> str:
    """ "gcr.io/x/controller:v1.15.2" → "v1.15.2"; a digest-pinned or untagged image → ""."""
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        last = last.split("@", 1)[0]
        if ":" not in last:
            return ""
    return last.split(":", 1)[1] if ":" in last else ""


def knative_version_read(gateway: kube.KubeGateway) -> KnativeVersion:
    looked: list[str] = []
    try:
        ns = gateway.get(kube.NAMESPACES, KNATIVE_NAMESPACE)
    except NotFound:
        return KnativeVersion("", "", (f"no {KNATIVE_NAMESPACE} namespace",))
    labels = (ns.get("metadata") or {}).get("labels") or {}
    for label in VERSION_LABELS:
        value = labels.get(label)
        if _has_number(value):
            return KnativeVersion(value, f"label {label} of namespace {KNATIVE_NAMESPACE}", tuple(looked))
        looked.append(f"namespace label {label}={value!r}" if value is not None else f"no namespace label {label}")
    try:
        deployment = gateway.get(kube.DEPLOYMENTS, KNATIVE_CONTROLLER, namespace=KNATIVE_NAMESPACE)
    except NotFound:
        looked.append(f"no Deployment {KNATIVE_NAMESPACE}/{KNATIVE_CONTROLLER}")
        return KnativeVersion("", "", tuple(looked))
    labels = (deployment.get("metadata") or {}).get("labels") or {}
    for label in VERSION_LABELS:
        value = labels.get(label)
        if _has_number(value):
            return KnativeVersion(value, f"label {label} of Deployment {KNATIVE_NAMESPACE}/{KNATIVE_CONTROLLER}",
                                  tuple(looked))
    containers = ((((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
    for container in containers:
        tag = image_tag(container.get("image") or "")
        if _has_number(tag):
            return KnativeVersion(tag, f"image tag of Deployment {KNATIVE_NAMESPACE}/{KNATIVE_CONTROLLER}",
                                  tuple(looked))
        looked.append(f"controller image {container.get('image')!r} has no version tag")
    return KnativeVersion("", "", tuple(looked))
