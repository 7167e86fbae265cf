"""Whether a cordoned node of a campaign may start now, read from the cluster right before
it starts: dropped (karpenter.sh/do-not-disrupt on the node or a pod, a workload the product
exempts or snoozes, a pod that cannot move), waiting (a PodDisruptionBudget that allows no
disruption, a revision already moving too many of its pods, the cluster's defrag job limit),
or go, with the defrag report its job starts from. Also: a running job's replacements the
scheduler cannot place."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from clusters import kube
from clusters.errors import NotFound
from clusters.labels import DO_NOT_DISRUPT, ISVC_LABEL, KNATIVE_SERVICE_LABEL, REVISION_LABEL
from clusters.snapshot import PodView
from pruning.planning import selector_matches, selector_requirements

from capacity.campaigns.models import Campaign, CampaignNode, NodeState
from capacity.campaigns.selectors import campaign_holds
from capacity.defrag.models import RUNNING_STATES, DefragJob, OrphanState
from capacity.defrag.planning import DefragPlan, pod_serving
from capacity.defrag.services import DefragError, defrag_discover


@dataclass(frozen=True)
class Verdict:
    drop: str = ""                 # why the node leaves the campaign
    wait: str = ""                 # why it waits for a later step
    plan: DefragPlan | None = None


def _moving(campaign: Campaign) -> dict[tuple[str, str], int]:
    """(namespace, revision) → pods the campaign's in-flight jobs have orphaned or will, whose
    replacements are not known ready yet (their job is not safe)."""
    counts: dict[tuple[str, str], int] = {}
    jobs = DefragJob.objects.filter(campaign_nodes__campaign=campaign, campaign_nodes__state=NodeState.RUNNING,
                                    state__in=RUNNING_STATES)
    for job in jobs:
        for namespace, revision in job.orphans.filter(
                state__in=[OrphanState.PLANNED, OrphanState.ORPHANED, OrphanState.DELETING]).values_list(
                "namespace", "revision__revision"):
            counts[(namespace, revision)] = counts.get((namespace, revision), 0) + 1
        if not job.revisions.exists():   # not recorded yet: its report says what it will orphan
            for entry in job.report.get("revisions", ()):
                key = (entry["namespace"], entry["revision"])
                counts[key] = counts.get(key, 0) + len(entry["pods"])
    return counts


def _revision_budget(campaign: Campaign, plan: DefragPlan, gateway: kube.KubeGateway) -> str:
    """Why the node must wait for the revision budget, or "": at most
    CAPACITY_CAMPAIGN_REVISION_FRACTION of a revision's ready pods moving at once; a revision
    that no in-flight job moves may always move one node's worth (a small revision moves one
    node at a time)."""
    fraction = settings.CAPACITY_CAMPAIGN_REVISION_FRACTION
    moving = _moving(campaign)
    for entry in plan.revisions:
        key = (entry.namespace, entry.revision)
        already = moving.get(key, 0)
        if not already:
            continue
        ready = sum(1 for p in gateway.list(kube.PODS, namespace=key[0],
                                            label_selector=f"{REVISION_LABEL}={key[1]}") if pod_serving(p))
        allowed = int(fraction * ready)
        if already + len(entry.pods) > allowed:
            return (f"revision {key[0]}/{key[1]}: {already} of its {ready} ready pods are already moving; "
                    f"{len(entry.pods)} more would pass the budget of {allowed} "
                    f"(CAPACITY_CAMPAIGN_REVISION_FRACTION {fraction:g})")
    return ""


def _pdb_budget(pods: list[PodView], gateway: kube.KubeGateway) -> str:
    """Why the node must wait for a PodDisruptionBudget, or "": one that selects a pod of the
    node and allows no disruption now (status.disruptionsAllowed 0, as the eviction API reads it)."""
    for namespace in sorted({p.namespace for p in pods}):
        for pdb in gateway.list(kube.PDBS, namespace=namespace):
            reqs = selector_requirements((pdb.get("spec") or {}).get("selector"))
            if reqs is None:
                continue
            allowed = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
            selected = [p.name for p in pods if p.namespace == namespace and selector_matches(reqs, p.labels)]
            if selected and allowed <= 0:
                return (f"PodDisruptionBudget {namespace}/{pdb['metadata']['name']} allows no disruption now "
                        f"(it selects {', '.join(selected[:3])})")
    return ""


def node_start_verdict(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime) -> Verdict:
    """Read the node and its pods afresh and say whether it starts now."""
    try:
        node = gateway.get(kube.NODES, row.node_name)
    except NotFound:
        return Verdict(drop="the node is gone")
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    if annotations.get(DO_NOT_DISRUPT) == "true":
        return Verdict(drop=f'the node says {DO_NOT_DISRUPT}: "true"')
    pods = [p for p in (PodView.from_object(o) for o in gateway.list(
        kube.PODS, field_selector=f"spec.nodeName={row.node_name}")) if p.live]
    for pod in pods:
        if pod.annotations.get(DO_NOT_DISRUPT) == "true":
            return Verdict(drop=f'pod {pod.namespace}/{pod.name} says {DO_NOT_DISRUPT}: "true"')
    holds = campaign_holds(cluster=campaign.cluster, pods=pods, now=now)
    for pod in pods:
        for label in (ISVC_LABEL, KNATIVE_SERVICE_LABEL):
            name = pod.labels.get(label)
            if name and (pod.namespace, name) in holds:
                return Verdict(drop=f"{pod.namespace}/{name} is on hold ({holds[(pod.namespace, name)]})")
    try:
        plan = defrag_discover(cluster=campaign.cluster, node_name=row.node_name, gateway=gateway)
    except DefragError as exc:
        return Verdict(drop=str(exc))
    if plan.blockers:
        return Verdict(drop="pods that cannot move: " + ", ".join(f"{p.key} ({p.reason})" for p in plan.blockers[:3]))
    limit = settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER
    running = DefragJob.objects.filter(cluster=campaign.cluster, state__in=RUNNING_STATES).count()
    if running >= limit:
        return Verdict(wait=f"the cluster already runs {running} defrag job(s), its limit "
                            f"(CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER {limit})")
    wait = _pdb_budget(pods, gateway) or _revision_budget(campaign, plan, gateway)
    return Verdict(wait=wait) if wait else Verdict(plan=plan)


def replacements_unschedulable(job: DefragJob, gateway: kube.KubeGateway) -> str:
    """The scheduler's reason a replacement of the job's orphans cannot be placed (a Pending
    pod of one of its ReplicaSets, PodScheduled False), or ""."""
    for revision in job.revisions.all():
        for obj in gateway.list(kube.PODS, namespace=revision.namespace,
                                label_selector=f"{REVISION_LABEL}={revision.revision}"):
            pod = PodView.from_object(obj)
            owner = pod.controller
            if owner is None or owner.name != revision.replicaset or pod.phase != "Pending" or pod.terminating:
                continue
            if pod.unschedulable_message:
                return (f"replacement {pod.namespace}/{pod.name} cannot be scheduled: "
                        f"{pod.unschedulable_message}")
    return ""
