"""Model-serving runbook operations as audited services: registry sync, resource specs,
redeploy, delete the old revision to unblock a Pending one, delete a stuck model.

Every cluster-changing service takes the operator as `actor`, re-reads what it is about
to change right before changing it, and leaves a `RunbookAudit` with the old and new.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from capacity.runbook import planning
from capacity.runbook.models import ResourceSpec, RunbookAudit, ServedModel
from clusters import kube
from clusters.errors import Conflict, KubeError, NotFound
from clusters.labels import KNATIVE_SERVICE_LABEL, REDEPLOY_ANNOTATION, REVISION_UID_LABEL
from clusters.selectors import snapshot_take
from config import clock
from orgs.selectors import orgs_of_cluster

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)


class RunbookRefused(Exception):
    """The cluster no longer is in the state the operator confirmed: nothing was done."""


def _audit(*, action: str, actor, cluster: Cluster, target: str, old: dict, new: dict) -> RunbookAudit:
    return RunbookAudit.objects.create(at=clock.now(), actor=actor, cluster=cluster, action=action,
                                       target=target, old=old, new=new)


def _list(gateway: kube.KubeGateway, resource: kube.Resource) -> list[dict]:
    try:
        return gateway.list(resource)
    except NotFound:
        return []      # the kind is not installed (no KServe on this cluster, say)


# --- the registry ----------------------------------------------------------------------------
def registry_entries(*, cluster: Cluster, gateway: kube.KubeGateway | None = None) -> list[planning.ModelEntry]:
    gateway = gateway or kube.gateway_for(cluster)
    # The registry reads pods, never nodes: the snapshot's pods alone, one paged LIST.
    pods = snapshot_take(gateway, now=clock.now(), nodes=False).pods
    return planning.registry_build(
        isvcs=_list(gateway, kube.INFERENCESERVICES), ksvcs=_list(gateway, kube.KNATIVE_SERVICES),
        revisions=_list(gateway, kube.REVISIONS), pods=pods, namespaces=_list(gateway, kube.NAMESPACES))


def registry_sync(*, cluster: Cluster, gateway: kube.KubeGateway | None = None) -> list[ServedModel]:
    """Upsert one `ServedModel` per InferenceService / pynode; mark vanished ones gone."""
    now = clock.now()
    entries = registry_entries(cluster=cluster, gateway=gateway)
    orgs = {o.slug: o for o in orgs_of_cluster(cluster=cluster)}
    orgs_by_ns = {o.namespace: o for o in orgs.values()}
    seen = []
    with transaction.atomic():
        for e in entries:
            row, _ = ServedModel.objects.update_or_create(
                cluster=cluster, namespace=e.namespace, name=e.name, kind=e.kind,
                defaults=dict(model=e.model, framework=e.framework, org_slug=e.org or "",
                              org=orgs.get(e.org or "") or orgs_by_ns.get(e.namespace),
                              knative_service=e.knative_service, uid=e.uid, ready=e.ready,
                              revisions=[r.__dict__ for r in e.revisions], gpus_held=e.gpus_held,
                              blocked=[u.__dict__ for u in e.unblocks], synced_at=now, gone=False))
            seen.append(row.pk)
        ServedModel.objects.filter(cluster=cluster).exclude(pk__in=seen).update(gone=True, synced_at=now)
    return list(ServedModel.objects.filter(pk__in=seen))


def _entry(model: ServedModel, gateway: kube.KubeGateway) -> planning.ModelEntry | None:
    """A fresh view of one model (re-read right before acting)."""
    for e in registry_entries(cluster=model.cluster, gateway=gateway):
        if (e.namespace, e.name, e.kind) == (model.namespace, model.name, model.kind):
            return e
    return None


# --- resource specs ----------------------------------------------------------------------------
def resource_spec_apply(*, spec: ResourceSpec, actor) -> list[dict]:
    """Patch every deployed InferenceService of `spec.model` with the framework defaults
    under the spec's overrides: KServe rolls each to a new revision (a redeploy)."""
    gateway = kube.gateway_for(spec.cluster)
    targets = ServedModel.objects.filter(cluster=spec.cluster, model=spec.model, gone=False,
                                         kind=ServedModel.Kind.INFERENCE_SERVICE)
    if not targets.exists():
        raise RunbookRefused(f"no deployed InferenceService of model {spec.model!r} on {spec.cluster}: "
                             "sync the registry first")
    applied = []
    for target in targets:
        try:
            isvc = gateway.get(kube.INFERENCESERVICES, target.name, namespace=target.namespace)
            values = planning.resource_values(framework=target.framework,
                                              defaults=settings.RUNBOOK_RESOURCE_DEFAULTS,
                                              override=spec.override())
            patch = planning.resources_patch(isvc, values)
            old = ((isvc.get("spec") or {}).get("predictor") or {})
            gateway.patch(kube.INFERENCESERVICES, target.name, patch, namespace=target.namespace)
        except (KubeError, ValueError) as exc:
            applied.append({"target": str(target), "error": str(exc)})
            continue
        applied.append({"target": str(target), "resources": values.resources(), "gpu_product": values.gpu_product})
        _audit(action="resource_spec_apply", actor=actor, cluster=spec.cluster, target=str(target),
               old={"resources": (old.get("model") or {}).get("resources"), "nodeSelector": old.get("nodeSelector")},
               new={"resources": values.resources(), "gpu_product": values.gpu_product, "spec": spec.pk})
    spec.applied = applied
    spec.save(update_fields=["applied"])
    return applied


# --- redeploy ----------------------------------------------------------------------------------
def model_redeploy(*, model: ServedModel, actor) -> str:
    """A new revision with no other change: stamp the pod template with the time."""
    gateway = kube.gateway_for(model.cluster)
    stamp = clock.now().isoformat()
    annotations = {REDEPLOY_ANNOTATION: stamp}
    if model.kind == ServedModel.Kind.INFERENCE_SERVICE:
        # KServe copies the InferenceService's annotations onto the Knative template.
        gateway.patch(kube.INFERENCESERVICES, model.name, {"metadata": {"annotations": annotations}},
                      namespace=model.namespace)
    else:
        gateway.patch(kube.KNATIVE_SERVICES, model.name,
                      {"spec": {"template": {"metadata": {"annotations": annotations}}}}, namespace=model.namespace)
    _audit(action="model_redeploy", actor=actor, cluster=model.cluster, target=str(model), old={},
           new={REDEPLOY_ANNOTATION: stamp})
    return stamp


# --- unblock a Pending deployment ----------------------------------------------------------------
def revision_delete_old(*, model: ServedModel, revision: str, actor) -> planning.Unblock:
    """Delete `revision` so the Pending newer revision gets its GPUs. NOT
    graceful: the old revision's pods stop at once (`RUNBOOK_UNBLOCK_GRACE_SECONDS`).
    Refused unless, on a fresh read, the newest revision still waits for GPUs while
    `revision` holds some."""
    gateway = kube.gateway_for(model.cluster)
    entry = _entry(model, gateway)
    unblock = next((u for u in (entry.unblocks if entry else ()) if u.old_revision == revision), None)
    if unblock is None:
        raise RunbookRefused(f"{revision} is not blocking a Pending revision of {model} any more: nothing deleted")
    rev = gateway.get(kube.REVISIONS, revision, namespace=model.namespace)
    rev_uid = rev["metadata"]["uid"]
    gateway.delete(kube.REVISIONS, revision, namespace=model.namespace, uid=rev_uid, propagation="Background")
    # The garbage collector would delete the pods with their own grace period (Knative
    # sets it to the revision timeout, 300 s by default): the GPUs would stay held, and
    # the new revision Pending, that long. Stop them now, as an operator's `kubectl delete
    # revision` is meant to. IMPORTANT: after the revision is gone, so that no
    # ReplicaSet of it replaces them. A second delete only ever shortens a grace period.
    grace = settings.RUNBOOK_UNBLOCK_GRACE_SECONDS
    stopped = []
    for pod in gateway.list(kube.PODS, namespace=model.namespace,
                            label_selector=f"{REVISION_UID_LABEL}={rev_uid}"):
        meta = pod["metadata"]
        try:
            gateway.delete(kube.PODS, meta["name"], namespace=model.namespace, uid=meta["uid"],
                           grace_period_seconds=grace)
        except (NotFound, Conflict):
            continue   # gone, or a new pod under that name: not the one we meant
        stopped.append(meta["name"])
    _audit(action="revision_delete_old", actor=actor, cluster=model.cluster, target=f"{model.namespace}/{revision}",
           old={"revision": revision, "gpus_held": unblock.gpus_held, "pending_revision": unblock.pending_revision},
           new={"deleted": revision, "reason": unblock.reason, "pods_stopped": stopped,
                "grace_seconds": grace})
    return unblock


# --- delete a model stuck deploying -----------------------------------------------------------------
def model_delete_stuck(*, model: ServedModel, actor) -> list[str]:
    """Delete an InferenceService that never became ready, and what it left behind (its
    Knative Service, Configuration and Revisions), as the operator who asked."""
    if model.kind != ServedModel.Kind.INFERENCE_SERVICE:
        raise RunbookRefused(f"{model} is a {model.kind}, not an InferenceService")
    gateway = kube.gateway_for(model.cluster)
    try:
        isvc = gateway.get(kube.INFERENCESERVICES, model.name, namespace=model.namespace)
    except NotFound:
        isvc = None
    if isvc is not None:
        if planning._ready(isvc):
            raise RunbookRefused(f"{model} is Ready: it is not stuck deploying, nothing deleted")
        if model.uid and isvc["metadata"]["uid"] != model.uid:
            raise RunbookRefused(f"{model} was recreated since the registry saw it: sync and look again")
    deleted = []
    if isvc is not None:
        gateway.delete(kube.INFERENCESERVICES, model.name, namespace=model.namespace,
                       uid=isvc["metadata"]["uid"], propagation="Foreground")
        deleted.append(f"InferenceService/{model.name}")
    # What KServe and Knative left behind, should the garbage collector not get to it.
    for service in (f"{model.name}-predictor", f"{model.name}-predictor-default"):
        for resource, selector in ((kube.KNATIVE_SERVICES, None), (kube.CONFIGURATIONS, None),
                                   (kube.REVISIONS, f"{KNATIVE_SERVICE_LABEL}={service}")):
            names = [service] if selector is None else \
                [r["metadata"]["name"] for r in gateway.list(resource, namespace=model.namespace,
                                                             label_selector=selector)]
            for name in names:
                try:
                    gateway.delete(resource, name, namespace=model.namespace, propagation="Background")
                    deleted.append(f"{resource.kind}/{name}")
                except NotFound:
                    pass
    model.gone = True
    model.save(update_fields=["gone"])
    _audit(action="model_delete_stuck", actor=actor, cluster=model.cluster, target=str(model),
           old={"ready": False, "uid": model.uid}, new={"deleted": deleted})
    return deleted
