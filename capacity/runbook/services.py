"""Model-serving runbook operations as audited services: registry sync, resource specs,
redeploy, delete the old revision to unblock a Pending one, delete a stuck model.

Every cluster-changing service takes the operator as `actor`, re-reads what it is about
to change right before changing it, and announces the change before sending it: a
`RunbookAction` row is committed `acting` with the target, its before-state and the planned
value (the redeploy stamp, the uid to delete), then the write is sent, then the row moves
to `done` or `failed` by a compare-and-set, and the outcome is written to the audit trail
once (actor, cause, target, before and after). A process killed in between leaves the row
`acting` under a lease that lapses; `runbook_actions_settle` (run by the registry sync)
then reads the cluster and records what really happened, never sending the write again.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from capacity.runbook import planning
from capacity.runbook.models import ResourceSpec, RunbookAction, ServedModel
from capacity.runbook.selectors import scale_to_zero_reconcile_schedule
from audit.services import audit
from clusters import kube
from clusters.errors import Conflict, KubeError, NotFound, describe_failure
from clusters.labels import KNATIVE_SERVICE_LABEL, REDEPLOY_ANNOTATION, REVISION_UID_LABEL
from clusters.knative import InitialScale
from clusters.selectors import knative_initial_scale_read, snapshot_take
from config import clock
from config.celery import task_send
from config.leases import lease_holder
from orgs.selectors import org_keeps_at_zero, org_of_namespace, orgs_of_cluster

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)


class RunbookRefused(Exception):
    """The cluster no longer is in the state the operator confirmed: nothing was done."""


# Seconds an announced action may stay `acting` before the registry sync settles it from
# the cluster. It covers one write with the gateway's retries (5 attempts, back-off up to
# 10 s each) and is at most a minute, so a killed process's row is settled at the next
# registry sync after it lapses.
ACTING_LEASE_SECONDS = 60


class RunbookUnsettled(Exception):
    """The write was sent but neither its answer nor a read of the cluster says whether it
    took effect: the action stays `acting` and the registry sync settles it from the cluster."""


def _intent_announce(*, action: str, actor, cluster: Cluster, target: str, model: ServedModel, old: dict,
                     new: dict) -> RunbookAction:
    """Commit the action as `acting` before its write. IMPORTANT: durable, so the row is in
    the database before anything is sent, whatever happens to this process next."""
    now = clock.now()
    with transaction.atomic(durable=True):
        return RunbookAction.objects.create(
            at=now, actor=actor, cluster=cluster, action=action, target=target, served_model=model, old=old, new=new,
            state=RunbookAction.State.ACTING, acting_owner=lease_holder("act"),
            acting_expires_at=now + timedelta(seconds=ACTING_LEASE_SECONDS))


def _intent_settle(row: RunbookAction, *, state: str, new: dict | None = None, error: str = "",
                   owner: str | None = None, first_hand: bool = True) -> RunbookAction:
    """Move `row` from `acting` to `state`, only while `owner` still holds it (one
    conditional UPDATE). Lost to someone else: a process that saw its own write answered
    (`first_hand` and done) knows better than a read made before that write landed, and
    records done over the other's verdict; otherwise the other's verdict stands."""
    owner = owner or row.acting_owner
    fields = dict(state=state, error=error, acting_owner="", acting_expires_at=None, settled_at=clock.now())
    if new is not None:
        fields["new"] = new
    with transaction.atomic():
        won = RunbookAction.objects.filter(pk=row.pk, state=RunbookAction.State.ACTING,
                                           acting_owner=owner).update(**fields)
        if not won and first_hand and state == RunbookAction.State.DONE:
            current = RunbookAction.objects.get(pk=row.pk)
            if current.state != RunbookAction.State.DONE:
                fields["error"] = (f"{error} " if error else "") + (
                    f"(the registry sync had taken it over, {current.state}, while the write was still under way; "
                    "the write's own answer says it was done)")
                won = RunbookAction.objects.filter(pk=row.pk, state=current.state,
                                                   acting_owner=current.acting_owner).update(**fields)
        row.refresh_from_db()
        if won:
            _action_audit(row, first_hand=first_hand)
    return row


# Why each action is done: the operator's request the runbook carried out.
ACTION_CAUSES = {
    "resource_spec_apply": "the operator saved the model's resource spec",
    "model_redeploy": "the operator asked for a redeploy",
    "revision_delete_old": "the operator deleted the old revision to unblock a Pending one",
    "model_delete_stuck": "the operator deleted a model stuck deploying",
}


def _action_audit(row: RunbookAction, *, first_hand: bool) -> None:
    """The settled action in the audit trail, once: done with the values after, or failed
    (`<action>_failed`, nothing after) with why. Settled by the registry sync, the entry
    names the operator who asked, never the process that read the cluster."""
    done = row.state == RunbookAction.State.DONE
    cause = ACTION_CAUSES.get(row.action, row.action) + (f"; {row.error}" if row.error else "")
    audit(app="runbook", action=row.action if done else f"{row.action}_failed", at=row.settled_at or clock.now(),
          actor=row.actor, cause=cause, target=row.target, cluster_id=row.cluster_id,
          subject=("runbook_action", row.pk), old=row.old, new=row.new if done else {},
          **({} if first_hand else {"actor_label": ""}))


def _intent_carry_out(row: RunbookAction, *, write: Callable[[], dict], landed: Callable[[], bool]) -> RunbookAction:
    """Send the announced write and settle the row by its answer. A write that failed is
    checked against the cluster, since a request whose answer was lost may still have been
    applied: done if the cluster shows it, else failed with the reason (the gateway has
    already retried transient failures). Raises the write's error when it was not done,
    `RunbookUnsettled` when not even a read answers."""
    try:
        outcome = write()
    except KubeError as exc:
        try:
            happened = landed()
        except KubeError as read_exc:
            raise RunbookUnsettled(
                f"{row.target}: the cluster did not confirm the {row.action} ({describe_failure(exc)}) and could "
                f"not be read ({describe_failure(read_exc)}); it is recorded as acting and the registry sync "
                "settles it from the cluster") from exc
        if happened:
            return _intent_settle(row, state=RunbookAction.State.DONE, new={**row.new, "settled": "from the cluster"},
                                  error=f"the write's answer was lost ({describe_failure(exc)}); the cluster shows it done")
        _intent_settle(row, state=RunbookAction.State.FAILED,
                       error=f"{describe_failure(exc)}; the cluster shows it was not done: nothing was changed")
        raise
    return _intent_settle(row, state=RunbookAction.State.DONE, new=outcome)


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
def resource_spec_targets(spec: ResourceSpec):
    """The deployed InferenceServices a spec applies to: every version of its model on its
    cluster, whatever org each belongs to."""
    targets = ServedModel.objects.filter(cluster=spec.cluster, model=spec.model, gone=False,
                                         kind=ServedModel.Kind.INFERENCE_SERVICE).select_related("org")
    if not targets.exists():
        raise RunbookRefused(f"no deployed InferenceService of model {spec.model!r} on {spec.cluster}: "
                             "sync the registry first")
    return targets


def resource_spec_preview(*, spec: ResourceSpec,
                          gateway: kube.KubeGateway | None = None) -> list[planning.ResourceChange]:
    """What saving `spec` (not saved yet) would do to each deployed version of its model, by
    org: each request and limit old → new, read from the cluster now. Writes nothing, to the
    database or the cluster. Raises `RunbookRefused` when the model has no deployed version."""
    targets = resource_spec_targets(spec)
    gateway = gateway or kube.gateway_for(spec.cluster)
    changes = []
    for target in targets:
        org = target.org_slug or (target.org.slug if target.org else "")
        try:
            isvc = gateway.get(kube.INFERENCESERVICES, target.name, namespace=target.namespace)
            values = planning.resource_values(framework=target.framework,
                                              defaults=settings.RUNBOOK_RESOURCE_DEFAULTS,
                                              override=spec.override())
        except NotFound:
            changes.append(planning.ResourceChange(target=str(target), org=org, framework=target.framework,
                                                   error="gone from the cluster since the last registry sync"))
            continue
        except KubeError as exc:
            changes.append(planning.ResourceChange(target=str(target), org=org, framework=target.framework,
                                                   error=f"could not be read: {describe_failure(exc)}"))
            continue
        except ValueError as exc:
            changes.append(planning.ResourceChange(target=str(target), org=org, framework=target.framework,
                                                   error=str(exc)))
            continue
        changes.append(planning.resources_change(isvc=isvc, values=values, target=str(target), org=org,
                                                 framework=target.framework))
    return sorted(changes, key=lambda c: (c.org, c.target))


def resource_spec_apply(*, spec: ResourceSpec, actor) -> list[dict]:
    """Patch every deployed InferenceService of `spec.model` with the framework defaults
    under the spec's overrides: KServe rolls each to a new revision (a redeploy). Each
    patch is announced before it is sent (the row holds the patch and the predictor before)."""
    gateway = kube.gateway_for(spec.cluster)
    targets = resource_spec_targets(spec)
    applied = []
    for target in targets:
        try:
            isvc = gateway.get(kube.INFERENCESERVICES, target.name, namespace=target.namespace)
            values = planning.resource_values(framework=target.framework,
                                              defaults=settings.RUNBOOK_RESOURCE_DEFAULTS,
                                              override=spec.override())
        except (KubeError, ValueError) as exc:
            applied.append({"target": str(target), "error": str(exc)})
            continue
        patch = planning.resources_patch(isvc, values)
        if planning.merge_patch_holds(isvc, patch):
            # It already asks for these resources: a patch would change nothing and start no revision.
            applied.append({"target": str(target), "unchanged": True, "resources": values.resources(),
                            "gpu_product": values.gpu_product})
            continue
        old = ((isvc.get("spec") or {}).get("predictor") or {})
        new = {"resources": values.resources(), "gpu_product": values.gpu_product, "spec": spec.pk,
               "uid": isvc["metadata"]["uid"], "patch": patch}
        row = _intent_announce(action="resource_spec_apply", actor=actor, cluster=spec.cluster, target=str(target),
                               model=target,
                               old={"resources": (old.get("model") or {}).get("resources"),
                                    "nodeSelector": old.get("nodeSelector")}, new=new)

        def write(target=target, patch=patch, new=new) -> dict:
            gateway.patch(kube.INFERENCESERVICES, target.name, patch, namespace=target.namespace)
            return new

        try:
            _intent_carry_out(row, write=write, landed=lambda target=target, new=new: _resources_landed(
                gateway, namespace=target.namespace, name=target.name, new=new))
        except (KubeError, RunbookUnsettled) as exc:
            applied.append({"target": str(target), "error": str(exc)})
            continue
        applied.append({"target": str(target), "resources": values.resources(), "gpu_product": values.gpu_product})
    spec.applied = applied
    spec.save(update_fields=["applied"])
    return applied


def _get(gateway: kube.KubeGateway, resource: kube.Resource, name: str, namespace: str) -> dict | None:
    try:
        return gateway.get(resource, name, namespace=namespace)
    except NotFound:
        return None


def _resources_landed(gateway: kube.KubeGateway, *, namespace: str, name: str, new: dict) -> bool:
    isvc = _get(gateway, kube.INFERENCESERVICES, name, namespace)
    return isvc is not None and isvc["metadata"].get("uid") == new["uid"] and \
        planning.merge_patch_holds(isvc, new["patch"])


# --- redeploy ----------------------------------------------------------------------------------
def _redeploy_resource(kind: str) -> kube.Resource:
    return kube.INFERENCESERVICES if kind == ServedModel.Kind.INFERENCE_SERVICE else kube.KNATIVE_SERVICES


def _redeploy_landed(gateway: kube.KubeGateway, *, kind: str, namespace: str, name: str, stamp: str) -> bool:
    obj = _get(gateway, _redeploy_resource(kind), name, namespace)
    return planning.redeploy_landed(obj=obj, kind=kind, stamp=stamp,
                                    revisions=_list_in(gateway, kube.REVISIONS, namespace))


def _list_in(gateway: kube.KubeGateway, resource: kube.Resource, namespace: str) -> list[dict]:
    try:
        return gateway.list(resource, namespace=namespace)
    except NotFound:
        return []


class RedeployReads:
    """What redeploying a set of models reads once, not once per model: each cluster's
    config-autoscaler word on a zero initial scale, and the org reconcile's schedule (both
    only when some model is kept at zero by its org)."""

    def __init__(self) -> None:
        self._initial: dict[int, InitialScale] = {}
        self._reconcile: planning.Schedule | None = None

    def initial_scale(self, cluster: Cluster, gateway: kube.KubeGateway) -> InitialScale:
        # Unreadable reads as "not allowed": a redeploy without initial-scale "0" is one Knative accepts.
        if cluster.pk not in self._initial:
            self._initial[cluster.pk] = knative_initial_scale_read(gateway)
        return self._initial[cluster.pk]

    def reconcile(self) -> planning.Schedule:
        if self._reconcile is None:
            self._reconcile = scale_to_zero_reconcile_schedule()
        return self._reconcile


# A redeploy that wakes a model its dormant org keeps at zero (a KServe model: its new
# revision runs at its owner's minReplicas) queues the org's scale to zero again this long
# after it, so that the new revision is back at zero well before the 10-minute reconcile.
# Long enough for KServe to have made the new revision and its PodAutoscaler (seconds);
# an apply that comes earlier changes nothing and the reconcile still repairs it.
REAPPLY_AFTER_REDEPLOY_SECONDS = 60
ORG_APPLY_TASK = "orgs.tasks.org_scale_to_zero_apply"


def _redeploy_plan(model: ServedModel, gateway: kube.KubeGateway, current: dict, *, stamp: str,
                   reads: RedeployReads, reapply: bool = True) -> planning.RedeployPlan:
    asleep = org_keeps_at_zero(cluster=model.cluster, workload=current, now=clock.now())
    if not asleep:
        return planning.redeploy_plan(kind=model.kind, obj=current, stamp=stamp)
    return planning.redeploy_plan(kind=model.kind, obj=current, stamp=stamp, asleep=asleep,
                                  initial=reads.initial_scale(model.cluster, gateway), reconcile=reads.reconcile(),
                                  reapply_seconds=REAPPLY_AFTER_REDEPLOY_SECONDS if reapply else None)


def _org_reapply_queue(model: ServedModel, *, actor) -> str:
    """Queue the org's scale to zero after a redeploy that woke its model: "" once queued,
    else why it could not be (the reconcile then brings it back to zero)."""
    org = org_of_namespace(cluster=model.cluster, namespace=model.namespace)
    if org is None:
        return "its org is gone"
    cause = f"after the runbook's redeploy of {model} by {actor or 'system'}, which woke it"
    try:
        task_send(ORG_APPLY_TASK, args=(org.pk,), kwargs={"cause": cause}, countdown=REAPPLY_AFTER_REDEPLOY_SECONDS)
    except Exception as exc:   # the broker: the redeploy is done, its model goes back to zero by the reconcile
        logger.warning("redeploy of %s: the org's scale to zero could not be queued: %s", model, exc)
        return f"the org's scale to zero could not be queued ({type(exc).__name__}: {exc})"
    return ""


def redeploy_preview(*, models: list[ServedModel],
                     reads: RedeployReads | None = None) -> list[tuple[ServedModel, planning.RedeployPlan | None, str]]:
    """What redeploying each model would do, read from the cluster now (for the
    confirmation): (model, plan, "") or (model, None, why it could not be read). Writes
    nothing; the redeploy reads each model again right before its write."""
    reads = reads or RedeployReads()
    stamp = clock.now().isoformat()
    previews = []
    for model in models:
        gateway = kube.gateway_for(model.cluster)
        try:
            current = gateway.get(_redeploy_resource(model.kind), model.name, namespace=model.namespace)
        except KubeError as exc:
            previews.append((model, None, describe_failure(exc)))
            continue
        previews.append((model, _redeploy_plan(model, gateway, current, stamp=stamp, reads=reads), ""))
    return previews


def model_redeploy(*, model: ServedModel, actor, reads: RedeployReads | None = None) -> planning.RedeployPlan:
    """A new revision with no other change: stamp the pod template with the time. The
    stamp is announced first; the merge patch sets that one value (and, for a pynode its
    dormant org keeps at zero where the cluster allows it, the switch's initial-scale "0",
    so the new revision starts no pod), so the same patch sent twice makes one revision.
    Returns the plan carried out: what the new revision does to a model kept asleep."""
    gateway = kube.gateway_for(model.cluster)
    resource = _redeploy_resource(model.kind)
    current = gateway.get(resource, model.name, namespace=model.namespace)
    plan = _redeploy_plan(model, gateway, current, stamp=clock.now().isoformat(), reads=reads or RedeployReads())
    before = (current["metadata"].get("annotations") or {}) if model.kind == ServedModel.Kind.INFERENCE_SERVICE \
        else ((((current.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {})
    row = _intent_announce(action="model_redeploy", actor=actor, cluster=model.cluster, target=str(model), model=model,
                           old={REDEPLOY_ANNOTATION: before.get(REDEPLOY_ANNOTATION), **plan.old},
                           new={REDEPLOY_ANNOTATION: plan.stamp, "kind": model.kind, **plan.new,
                                **({"org_keeps_at_zero": plan.asleep, "effect": plan.effect} if plan.asleep else {})})

    def write() -> dict:
        gateway.patch(resource, model.name, plan.patch, namespace=model.namespace)
        return row.new

    _intent_carry_out(row, write=write, landed=lambda: _redeploy_landed(
        gateway, kind=model.kind, namespace=model.namespace, name=model.name, stamp=plan.stamp))
    if plan.outcome == planning.RECONCILE:
        missed = _org_reapply_queue(model, actor=actor)
        if missed:   # say what will bring it back to zero instead
            plan = _redeploy_plan(model, gateway, current, stamp=plan.stamp, reads=reads or RedeployReads(),
                                  reapply=False)
    return plan


# --- unblock a Pending deployment ----------------------------------------------------------------
def _revision_pods_stop(gateway: kube.KubeGateway, *, namespace: str, rev_uid: str) -> tuple[list[str], list[str]]:
    """Stop the deleted revision's pods now (see `revision_delete_old`): the pods stopped,
    and those that could not be asked (they stop within their own grace period)."""
    grace = settings.RUNBOOK_UNBLOCK_GRACE_SECONDS
    stopped, missed = [], []
    try:
        pods = gateway.list(kube.PODS, namespace=namespace, label_selector=f"{REVISION_UID_LABEL}={rev_uid}")
    except KubeError as exc:
        return [], [f"its pods could not be listed ({describe_failure(exc)})"]
    for pod in pods:
        meta = pod["metadata"]
        try:
            gateway.delete(kube.PODS, meta["name"], namespace=namespace, uid=meta["uid"],
                           grace_period_seconds=grace)
        except (NotFound, Conflict):
            continue   # gone, or a new pod under that name: not the one we meant
        except KubeError as exc:
            missed.append(f"{meta['name']} ({describe_failure(exc)})")
            continue
        stopped.append(meta["name"])
    return stopped, missed


def _revision_gone(gateway: kube.KubeGateway, *, namespace: str, revision: str, uid: str) -> bool:
    return planning.deleted(_get(gateway, kube.REVISIONS, revision, namespace), uid)


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
    grace = settings.RUNBOOK_UNBLOCK_GRACE_SECONDS
    row = _intent_announce(
        action="revision_delete_old", actor=actor, cluster=model.cluster, target=f"{model.namespace}/{revision}",
        model=model,
        old={"revision": revision, "gpus_held": unblock.gpus_held, "pending_revision": unblock.pending_revision},
        new={"delete": revision, "uid": rev_uid, "reason": unblock.reason, "grace_seconds": grace})

    def write() -> dict:
        gateway.delete(kube.REVISIONS, revision, namespace=model.namespace, uid=rev_uid, propagation="Background")
        # The garbage collector would delete the pods with their own grace period (Knative
        # sets it to the revision timeout, 300 s by default): the GPUs would stay held, and
        # the new revision Pending, that long. Stop them now, as an operator's `kubectl delete
        # revision` is meant to. IMPORTANT: after the revision is gone, so that no
        # ReplicaSet of it replaces them. A second delete only ever shortens a grace period.
        stopped, missed = _revision_pods_stop(gateway, namespace=model.namespace, rev_uid=rev_uid)
        return {**row.new, "deleted": revision, "pods_stopped": stopped,
                **({"pods_not_stopped": missed} if missed else {})}

    _intent_carry_out(row, write=write, landed=lambda: _revision_gone(
        gateway, namespace=model.namespace, revision=revision, uid=rev_uid))
    return unblock


# --- delete a model stuck deploying -----------------------------------------------------------------
def model_delete_stuck(*, model: ServedModel, actor) -> list[str]:
    """Delete an InferenceService that never became ready, and what it left behind (its
    Knative Service, Configuration and Revisions), as the operator who asked."""
    if model.kind != ServedModel.Kind.INFERENCE_SERVICE:
        raise RunbookRefused(f"{model} is a {model.kind}, not an InferenceService")
    gateway = kube.gateway_for(model.cluster)
    isvc = _get(gateway, kube.INFERENCESERVICES, model.name, model.namespace)
    if isvc is not None:
        if planning._ready(isvc):
            raise RunbookRefused(f"{model} is Ready: it is not stuck deploying, nothing deleted")
        if model.uid and isvc["metadata"]["uid"] != model.uid:
            raise RunbookRefused(f"{model} was recreated since the registry saw it: sync and look again")
    uid = isvc["metadata"]["uid"] if isvc is not None else ""
    row = _intent_announce(action="model_delete_stuck", actor=actor, cluster=model.cluster, target=str(model),
                           model=model,
                           old={"ready": False, "uid": model.uid},
                           new={"delete": f"InferenceService/{model.name}" if isvc is not None else None, "uid": uid})

    def write() -> dict:
        deleted = []
        if isvc is not None:
            gateway.delete(kube.INFERENCESERVICES, model.name, namespace=model.namespace, uid=uid,
                           propagation="Foreground")
            deleted.append(f"InferenceService/{model.name}")
        left, missed = _leftovers_delete(gateway, model)
        return {**row.new, "deleted": deleted + left, **({"not_deleted": missed} if missed else {})}

    def landed() -> bool:
        return isvc is None or _isvc_gone(gateway, model, uid)

    row = _intent_carry_out(row, write=write, landed=landed)
    model.gone = True
    model.save(update_fields=["gone"])
    return row.new.get("deleted", [])


def _isvc_gone(gateway: kube.KubeGateway, model: ServedModel, uid: str) -> bool:
    return planning.deleted(_get(gateway, kube.INFERENCESERVICES, model.name, model.namespace), uid)


def _leftovers_delete(gateway: kube.KubeGateway, model: ServedModel) -> tuple[list[str], list[str]]:
    """What KServe and Knative left behind, should the garbage collector not get to it:
    deleted, and what could not be (the garbage collector still follows the owner)."""
    deleted, missed = [], []
    for service in (f"{model.name}-predictor", f"{model.name}-predictor-default"):
        for resource, selector in ((kube.KNATIVE_SERVICES, None), (kube.CONFIGURATIONS, None),
                                   (kube.REVISIONS, f"{KNATIVE_SERVICE_LABEL}={service}")):
            try:
                names = [service] if selector is None else \
                    [r["metadata"]["name"] for r in gateway.list(resource, namespace=model.namespace,
                                                                 label_selector=selector)]
            except KubeError as exc:
                missed.append(f"{resource.kind} of {service} ({describe_failure(exc)})")
                continue
            for name in names:
                try:
                    gateway.delete(resource, name, namespace=model.namespace, propagation="Background")
                    deleted.append(f"{resource.kind}/{name}")
                except NotFound:
                    pass
                except KubeError as exc:
                    missed.append(f"{resource.kind}/{name} ({describe_failure(exc)})")
    return deleted, missed


# --- actions whose process died: settled from the cluster ----------------------------------------
SETTLED_BY_SYNC = "the process carrying it out stopped before recording its outcome; settled from the cluster: "


def runbook_actions_settle(*, cluster: Cluster, now: datetime | None = None,
                           gateway: kube.KubeGateway | None = None) -> list[RunbookAction]:
    """Settle every action of `cluster` left `acting` past its lease, from what the cluster
    shows: done when it shows the planned change (the stamp on the object or a revision
    it made, the uid gone), else failed. Nothing announced is sent again, with one
    exception: a deleted revision's pods are asked to stop now, as the operator confirmed
    (a delete that only shortens a grace period; the action is still recorded once).

    A redeploy the cluster does not show is failed, not re-sent: it makes a new revision
    that, on scarce GPUs, waits Pending for the operator to unblock it, so it is sent only
    while the operator who asked for it is looking. Raises the gateway's errors (the
    registry task retries the transient ones); a row then stays acting under a new lease."""
    now = now or clock.now()
    gateway = gateway or kube.gateway_for(cluster)
    settled = []
    stale = RunbookAction.objects.filter(cluster=cluster, state=RunbookAction.State.ACTING,
                                        acting_expires_at__lt=now).order_by("at", "id")
    for row in stale:
        owner = lease_holder("settle")
        claimed = RunbookAction.objects.filter(pk=row.pk, state=RunbookAction.State.ACTING,
                                              acting_owner=row.acting_owner, acting_expires_at__lt=now).update(
            acting_owner=owner, acting_expires_at=now + timedelta(seconds=ACTING_LEASE_SECONDS))
        if not claimed:
            continue        # its process came back and settled it, or another sync took it
        row.refresh_from_db()
        state, new, error = _settle_from_cluster(gateway, row)
        settled.append(_intent_settle(row, state=state, new=new, error=SETTLED_BY_SYNC + error, owner=owner,
                                      first_hand=False))
        logger.info("runbook %s %s on %s settled %s: %s", row.action, row.target, cluster, state, error)
    return settled


def _settle_from_cluster(gateway: kube.KubeGateway, row: RunbookAction) -> tuple[str, dict, str]:
    """(state, new, why) for an action whose process died, read from the cluster."""
    namespace, _, name = row.target.partition("/")
    planned = row.new
    done, failed = RunbookAction.State.DONE, RunbookAction.State.FAILED
    if row.action == "model_redeploy":
        stamp = planned[REDEPLOY_ANNOTATION]
        if _redeploy_landed(gateway, kind=planned["kind"], namespace=namespace, name=name, stamp=stamp):
            return done, planned, f"its stamp {stamp} is on the model"
        return failed, planned, f"its stamp {stamp} is not on the model: nothing was changed (redeploy again)"
    if row.action == "revision_delete_old":
        if not _revision_gone(gateway, namespace=namespace, revision=name, uid=planned["uid"]):
            return failed, planned, f"{name} is still there: nothing was deleted"
        stopped, missed = _revision_pods_stop(gateway, namespace=namespace, rev_uid=planned["uid"])
        return done, {**planned, "deleted": name, "pods_stopped": stopped,
                      **({"pods_not_stopped": missed} if missed else {})},             f"{name} is gone; its remaining pods were asked to stop now"
    if row.action == "model_delete_stuck":
        isvc = _get(gateway, kube.INFERENCESERVICES, name, namespace)
        if planned.get("uid") and not planning.deleted(isvc, planned["uid"]):
            return failed, planned, f"InferenceService {name} is still there: nothing was deleted"
        ServedModel.objects.filter(cluster=row.cluster, namespace=namespace, name=name,
                                   kind=ServedModel.Kind.INFERENCE_SERVICE).update(gone=True)
        return done, {**planned, "deleted": [planned["delete"]] if planned.get("delete") else []},             f"InferenceService {name} (uid {planned.get('uid')}) is gone or being deleted; what it left behind "             "is the garbage collector's"
    if row.action == "resource_spec_apply":
        if _resources_landed(gateway, namespace=namespace, name=name, new=planned):
            return done, planned, "the InferenceService holds the spec's resources"
        return failed, planned, "the InferenceService does not hold the spec's resources: nothing was changed"
    return failed, planned, f"unknown action {row.action!r}: not checked"
