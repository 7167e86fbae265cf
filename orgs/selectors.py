"""Reads of orgs for other parts of the product: what the org switch changed (the savings
page), exemptions and snoozes in force (the pruner, the scale-to-zero apply)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import F, Q

from clusters import discovery, kube
from clusters.errors import KubeError, NotFound
from clusters.labels import COMPONENT_LABEL, GPU_RESOURCE, PYNODE_COMPONENT
from audit.selectors import entries_filter
from orgs import planning
from orgs.models import DormancySwitch, Org, ScaleToZero, WorkloadExemption

# The audit actions that record min-scale changes the org switch made, workload by workload.
_FLOOR_ACTIONS = ("scale_to_zero_applied", "scale_to_zero_drift_repaired", "scale_to_zero_apply_incomplete")
_NOT_WORKLOADS = {"setting", "not applied"}


def orgs_of_cluster(*, cluster) -> list[Org]:
    """Every org registered on the cluster."""
    return list(Org.objects.filter(cluster=cluster))


def org_counts(*, cluster, now: datetime) -> dict[str, int]:
    """How many orgs the cluster has: in all, dormant, protected from scale to zero at `now`
    (turned off, exempt, or snoozed: what `orgs_exempt_from_scale_to_zero` lists), drifting."""
    orgs = Org.objects.filter(cluster=cluster)
    return {"total": orgs.count(), "dormant": orgs.filter(dormant=True).count(),
            "protected": orgs.filter(_protected_at(now)).count(),
            "drifting": orgs.exclude(drift=[]).count()}


def org_enabled_since(*, org: Org) -> datetime | None:
    """When the product last set scale to zero on `org` (its latest switch to dormant),
    while its workloads are believed to hold it; else None."""
    if org.applied != ScaleToZero.ENABLED:
        return None
    return (org.switches.filter(direction=DormancySwitch.Direction.TO_DORMANT)
            .order_by("-at").values_list("at", flat=True).first())


def org_slugs_by_namespace(*, cluster) -> dict[str, str]:
    """The org of each namespace of the cluster, for history: retired orgs too, the org in
    service winning over one retired from the same namespace (the last row read wins)."""
    rows = Org.all_objects.filter(cluster=cluster).order_by(F("retired_at").asc(nulls_last=True))
    return dict(rows.values_list("namespace", "slug"))


def scale_to_zero_floor_changes(*, cluster, until: datetime) -> Iterator[tuple[str, str, datetime, str, str]]:
    """(org, workload, at, old, new) for every audited min-scale change of the org switch,
    oldest first; `workload` is "<target> <namespace>/<name>", old/new the min-scale texts."""
    rows = entries_filter(app="orgs", org__cluster=cluster, action__in=_FLOOR_ACTIONS, at__lte=until) \
        .select_related("org")
    for record in rows:
        old, new = record.old or {}, record.new or {}
        for workload, value in new.items():
            if workload in _NOT_WORKLOADS or not isinstance(value, str):
                continue
            before = old.get(workload, "unset")
            yield (record.org.slug, workload, record.at, before if isinstance(before, str) else "unset", value)


def scale_to_zero_offs(*, cluster, since: datetime) -> dict[str, tuple[datetime, ...]]:
    """Per org (slug) of the cluster, oldest first, the times since `since` its scale to zero
    was switched off: each wake (a switch to active) and each operator's disallow. From then
    the org no longer holds its workloads at zero, whether or not that patched them."""
    wakes = DormancySwitch.objects.filter(org__cluster=cluster, direction=DormancySwitch.Direction.TO_ACTIVE,
                                          at__gte=since).values_list("org__slug", "at")
    disallows = entries_filter(app="orgs", org__cluster=cluster, action="org_disallow_scale_to_zero",
                               at__gte=since).values_list("org__slug", "at")
    offs: dict[str, list[datetime]] = {}
    for slug, at in (*wakes, *disallows):
        offs.setdefault(slug, []).append(at)
    return {slug: tuple(sorted(times)) for slug, times in offs.items()}


@dataclass(frozen=True)
class ExemptOrgRow:
    org: str
    namespace: str
    dormant: bool
    why: str = ""


def _protected_at(now: datetime) -> Q:
    """Orgs kept warm at `now`: scale to zero turned off, exempt, or snoozed."""
    return Q(scale_to_zero_allowed=False) | Q(exempt=True) | Q(snoozed_until__gt=now)


def orgs_exempt_from_scale_to_zero(*, cluster, now: datetime) -> list[ExemptOrgRow]:
    """Orgs whose workloads are kept warm whatever their activity, and why: scale to zero
    turned off, or an operator's exemption or snooze still in force at `now`."""
    rows = Org.objects.filter(cluster=cluster).filter(_protected_at(now)).order_by("slug")
    out = []
    for org in rows:
        reasons = [] if org.scale_to_zero_allowed else ["scale to zero turned off"]
        hold = org.hold()
        if hold is not None and hold.active(now):
            reasons.append(hold.describe(now))
        out.append(ExemptOrgRow(org.slug, org.namespace, org.dormant, "; ".join(reasons)))
    return out


def _template_gpus(pod_spec: dict | None) -> int:
    total = 0
    for container in (pod_spec or {}).get("containers") or ():
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE)
        try:
            total += int(value or 0)
        except (TypeError, ValueError):
            continue
    return total


def workload_gpus_per_replica(*, cluster, gateway: kube.KubeGateway, now: datetime) -> dict[str, int]:
    """GPUs one replica of each switchable workload asks for, keyed as the audit names it
    ("ksvc ns/name", "revision ns/name", "podautoscaler ns/name": a PodAutoscaler scales
    the Revision of its name). Kinds the cluster does not serve give none."""
    served = discovery.served_groups(cluster=cluster, now=now, gateway=gateway)
    found: dict[str, int] = {}
    services = discovery.list_if_served(gateway, kube.KNATIVE_SERVICES, cluster=cluster, now=now,
                                        served=served) or []
    revisions = discovery.list_if_served(gateway, kube.REVISIONS, cluster=cluster, now=now, served=served) or []
    for ksvc in services:
        meta = ksvc.get("metadata") or {}
        spec = ((ksvc.get("spec") or {}).get("template") or {}).get("spec")
        found[f"ksvc {meta.get('namespace', '')}/{meta.get('name', '')}"] = _template_gpus(spec)
    for revision in revisions:
        meta = revision.get("metadata") or {}
        where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        gpus = _template_gpus(revision.get("spec"))
        found[f"revision {where}"] = gpus
        found[f"podautoscaler {where}"] = gpus
    return found


# --- exemptions and snoozes --------------------------------------------------------------------
# The owner kind the pruner resolves each exempted workload kind to.
PRUNE_OWNER_KIND = {WorkloadExemption.Kind.MODEL: "InferenceService", WorkloadExemption.Kind.PYNODE: "Service"}


def workload_holds_read(*, org: Org, now: datetime) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The org's workload exemptions and snoozes in force, as `plan_scale_to_zero` takes
    them ((kind, name) → description), and the snoozes that ended since the org was last
    checked, said in words (they no longer apply: their workloads follow the org again)."""
    held: dict[tuple[str, str], str] = {}
    ended: list[str] = []
    for exemption in WorkloadExemption.objects.filter(org=org):
        hold = exemption.hold()
        if hold.active(now):
            held[(exemption.kind, exemption.name)] = hold.describe(now)
        elif org.reconciled_at is None or exemption.until > org.reconciled_at:
            ended.append(f"the snooze of {exemption.kind} {org.namespace}/{exemption.name} ended at "
                         f"{exemption.until:%Y-%m-%d %H:%M} UTC")
    return held, ended


@dataclass(frozen=True)
class PruneHolds:
    """What the pruner must leave alone: namespaces of exempt or snoozed orgs, and owners
    (kind, namespace, name) of exempt or snoozed workloads, each with its skip reason."""

    namespaces: dict[str, str] = field(default_factory=dict)
    owners: dict[tuple[str, str, str], str] = field(default_factory=dict)


def prune_holds(*, cluster, namespaces: set[str], now: datetime) -> PruneHolds:
    """The exemptions and snoozes in force for the given namespaces (two small queries)."""
    if not namespaces:
        return PruneHolds()
    orgs = Org.objects.filter(namespace__in=namespaces)
    if cluster is not None:
        orgs = orgs.filter(cluster=cluster)
    held_orgs = orgs.filter(Q(exempt=True) | Q(snoozed_until__gt=now))
    by_namespace = {org.namespace: org.hold().word for org in held_orgs}
    exemptions = WorkloadExemption.objects.filter(org__in=orgs).filter(
        Q(until__isnull=True) | Q(until__gt=now)).select_related("org")
    owners = {(PRUNE_OWNER_KIND[e.kind], e.org.namespace, e.name): e.hold().word for e in exemptions}
    return PruneHolds(namespaces=by_namespace, owners=owners)


def namespaces_not_scaling_to_zero(*, cluster, namespaces: set[str]) -> frozenset[str]:
    """Of these namespaces, those whose org has scale to zero turned off (`scale_to_zero_allowed`):
    the pruner never touches them either."""
    if not namespaces:
        return frozenset()
    rows = Org.objects.filter(namespace__in=namespaces, scale_to_zero_allowed=False)
    if cluster is not None:
        rows = rows.filter(cluster=cluster)
    return frozenset(rows.values_list("namespace", flat=True))


def org_of_namespace(*, cluster, namespace: str) -> Org | None:
    """The org whose workloads live in `namespace` of `cluster` (None: no org there)."""
    return Org.objects.filter(cluster=cluster, namespace=namespace).first()


def org_keeps_at_zero(*, cluster, workload: dict, now: datetime) -> str:
    """Why its org's scale to zero keeps `workload` (a Knative Service or InferenceService as
    read from the cluster) at zero now, in words; "" when it does not: not a pynode or a
    model that can scale to zero, no org, an org awake or not allowed to scale to zero, or
    the workload exempt or snoozed (the switch keeps those at their owner's floor).

    Another feature that would raise it (the pruner's restore) must leave it asleep: it
    wakes when the org does, to its owner's floor."""
    kind = planning.switched_kind(workload)
    meta = workload.get("metadata") or {}
    if kind is None:
        return ""
    orgs = Org.objects.filter(namespace=meta.get("namespace", ""))
    if cluster is not None:
        orgs = orgs.filter(cluster=cluster)
    org = orgs.first()
    if org is None or org.wanted != ScaleToZero.ENABLED:
        return ""
    exemption = WorkloadExemption.objects.filter(org=org, kind=kind, name=meta.get("name", "")).first()
    if exemption is not None and exemption.hold().active(now):
        return ""
    since = f" since {org.dormant_since:%Y-%m-%d %H:%M} UTC" if org.dormant_since else ""
    workload = f"{kind} {org.namespace}/{meta.get('name', '')}"
    return f"org {org.slug} is dormant{since}: it keeps {workload} at zero until it wakes"


# How each kind of hold names its workload on the cluster: the resource, and the words.
_HELD_KINDS = {"inferenceservice": (kube.INFERENCESERVICES, "model (InferenceService)"),
               "pynode": (kube.KNATIVE_SERVICES, "pynode (Knative Service)")}


@dataclass(frozen=True)
class Presence:
    """Whether what an act names is on the cluster now: True, False (not there, or not such a
    workload), or None (the cluster could not be read); `said` names it and why."""

    found: bool | None
    said: str


def workload_presence(*, org: Org, kind: str, name: str) -> Presence:
    """Read the workload `kind`/`name` in the org's namespace (one GET)."""
    resource, words = _HELD_KINDS[kind]
    where = f"namespace {org.namespace} on cluster {org.cluster.name}"
    try:
        found = kube.gateway_for(org.cluster).get(resource, name, namespace=org.namespace)
    except NotFound:
        return Presence(False, f"no {words} named {name!r} in {where}")
    except KubeError as exc:
        return Presence(None, f"whether {words} {org.namespace}/{name} exists could not be read ({exc})")
    labels = (found.get("metadata") or {}).get("labels") or {}
    if kind == "pynode" and labels.get(COMPONENT_LABEL) != PYNODE_COMPONENT:
        return Presence(False, f"Knative Service {org.namespace}/{name} in {where} is not a pynode (no "
                                       f"label {COMPONENT_LABEL}={PYNODE_COMPONENT})")
    return Presence(True, f"{words} {org.namespace}/{name}")


def namespace_presence(*, cluster, namespace: str) -> Presence:
    """Read the namespace an org is registered for (one GET)."""
    try:
        kube.gateway_for(cluster).get(kube.NAMESPACES, namespace)
    except NotFound:
        return Presence(False, f"no namespace {namespace!r} on cluster {cluster.name}")
    except KubeError as exc:
        return Presence(None, f"whether namespace {namespace!r} exists on cluster {cluster.name} could not be read "
                              f"({exc})")
    return Presence(True, f"namespace {namespace} on cluster {cluster.name}")
