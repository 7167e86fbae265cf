"""Write binpack deletion costs: plan from a fresh snapshot, patch only pods whose cost
changes and only as the snapshot saw them (a pod changed since is re-read and judged
again), a few writes in flight at once, record the run."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from audit.services import audit
from capacity.binpack import planning
from capacity.binpack.models import BinpackRun
from clusters import kube
from clusters.errors import Conflict, KubeError, NotFound, describe_failure
from clusters.labels import BINPACK_MARKER, BINPACK_OPT_OUT, DELETION_COST
from clusters.selectors import snapshot_take
from config import clock

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)

# Workload kinds whose `capacity.io/binpack: "false"` opts their pods out. A Deployment's
# opt-out reaches its ReplicaSets' pods through the ReplicaSet's owner.
_OPT_OUT_KINDS = (kube.DEPLOYMENTS, kube.REPLICASETS, kube.STATEFULSETS, kube.MODELSERVINGS)
_RECORDED_CHANGES = 1000


def binpack_options(*, override_manual: bool | None = None, opted_out_owners=frozenset()) -> planning.BinpackOptions:
    return planning.BinpackOptions(
        group_label=settings.BINPACK_GROUP_LABEL,
        override_manual=settings.BINPACK_OVERRIDE_MANUAL if override_manual is None else override_manual,
        max_writes=settings.BINPACK_MAX_WRITES,
        opted_out_owners=frozenset(opted_out_owners))


def opted_out_owners(gateway: kube.KubeGateway) -> frozenset[str]:
    """Uids of workloads that opted out, and of ReplicaSets whose Deployment did."""
    out: set[str] = set()
    replicasets = []
    for resource in _OPT_OUT_KINDS:
        try:
            objects = gateway.list(resource)
        except NotFound:
            continue   # the kind is not installed (no Kthena, say)
        for obj in objects:
            meta = obj.get("metadata") or {}
            if str((meta.get("annotations") or {}).get(BINPACK_OPT_OUT, "")).lower() == "false":
                out.add(meta.get("uid", ""))
            if resource is kube.REPLICASETS:
                replicasets.append(meta)
    for meta in replicasets:
        if any(ref.get("uid") in out for ref in meta.get("ownerReferences") or ()):
            out.add(meta.get("uid", ""))
    return frozenset(out)


def _cost_patch(change: planning.CostChange, resource_version: str) -> dict:
    value = None if change.new is None else str(change.new)
    # metadata.resourceVersion in a patch is a precondition: the API server answers 409
    # Conflict unless the pod is still at that version.
    return {"metadata": {"resourceVersion": resource_version,
                         "annotations": {DELETION_COST: value, BINPACK_MARKER: value}}}


def _apply_one(gateway: kube.KubeGateway, change: planning.CostChange, errors: list[str]) -> str:
    """Patch one pod. Returns "written", "stale" (it changed since the snapshot in a way
    that makes the planned cost not ours to write) or "error".

    The write is conditioned on the version the snapshot read, so it applies only to the
    pod the plan judged (same uid, not leaving, its cost as planned from) at no extra
    read. A pod changed since (a status update, a label) is read again and judged again."""
    if change.resource_version:
        try:
            gateway.patch(kube.PODS, change.name, _cost_patch(change, change.resource_version),
                          namespace=change.namespace)
            return "written"
        except NotFound:
            return "stale"
        except Conflict:
            pass   # changed since the snapshot: judge it as it is now
        except KubeError as exc:
            errors.append(f"{change.namespace}/{change.name}: {exc}")
            return "error"
    try:
        pod = gateway.get(kube.PODS, change.name, namespace=change.namespace)
    except NotFound:
        return "stale"
    except KubeError as exc:
        errors.append(f"{change.namespace}/{change.name}: {exc}")
        return "error"
    meta = pod.get("metadata") or {}
    current = (meta.get("annotations") or {}).get(DELETION_COST)
    # IMPORTANT: a recreated pod, a pod now leaving, or a cost someone set since the
    # snapshot are not ours to overwrite.
    if meta.get("uid") != change.uid or meta.get("deletionTimestamp") or current != change.old:
        return "stale"
    try:
        gateway.patch(kube.PODS, change.name, _cost_patch(change, meta.get("resourceVersion")),
                      namespace=change.namespace)
    except (Conflict, NotFound):
        return "stale"
    except KubeError as exc:
        errors.append(f"{change.namespace}/{change.name}: {exc}")
        return "error"
    return "written"


def _apply_all(gateway: kube.KubeGateway, changes, errors: list[str]) -> list[str]:
    """`_apply_one` for every change, up to BINPACK_WRITE_CONCURRENCY in flight; results in
    the plan's order."""
    width = min(settings.BINPACK_WRITE_CONCURRENCY, len(changes))
    if width < 2:
        return [_apply_one(gateway, change, errors) for change in changes]
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="binpack-write") as pool:
        return list(pool.map(lambda change: _apply_one(gateway, change, errors), changes))


def _run_audit(run: BinpackRun, written: list[planning.CostChange]) -> None:
    """One entry per run that patched pods: each pod's deletion cost before and after (the
    first `_RECORDED_CHANGES`; the count says how many in all)."""
    shown = written[:_RECORDED_CHANGES]
    more = f" ({len(written) - len(shown)} more not listed)" if len(written) > len(shown) else ""
    audit(app="binpack", action="pod_deletion_costs_write", at=run.finished_at, actor=run.actor,
          actor_label=run.actor_label, cause=f"binpack run #{run.pk} ({run.get_trigger_display()})",
          target=f"{len(written)} pod(s) of cluster {run.cluster}{more}", cluster=run.cluster,
          subject=("binpack_run", run.pk), old={f"{c.namespace}/{c.name}": c.old for c in shown},
          new={f"{c.namespace}/{c.name}": c.new for c in shown})


def pod_deletion_costs_apply(*, cluster: Cluster, actor=None, trigger: str = BinpackRun.Trigger.SCHEDULE,
                             dry_run: bool = False, override_manual: bool | None = None,
                             gateway: kube.KubeGateway | None = None) -> tuple[BinpackRun, planning.BinpackPlan]:
    """Plan the costs of `cluster` and write those that change (none when `dry_run`).

    A cluster that cannot be read is a run too, recorded with why (whether a retry may
    help, then the API's answer) before the error is raised: the runs page is where an
    operator looks, and a refused schedule must not be silent there."""
    started = clock.now()
    try:
        gateway = gateway or kube.gateway_for(cluster)
        snapshot = snapshot_take(gateway, now=started)
        options = binpack_options(override_manual=override_manual, opted_out_owners=opted_out_owners(gateway))
    except KubeError as exc:
        BinpackRun.objects.create(cluster=cluster, started_at=started, finished_at=clock.now(), actor=actor,
                                  trigger=trigger, dry_run=dry_run,
                                  errors=[f"cluster not read, nothing written: {describe_failure(exc)}"])
        raise
    t0 = time.perf_counter()
    plan = planning.binpack_plan(snapshot, options=options)
    plan_seconds = time.perf_counter() - t0
    run = BinpackRun(cluster=cluster, started_at=started, actor=actor, trigger=trigger, dry_run=dry_run,
                     planned=len(plan.changes), unchanged=plan.unchanged, skipped=len(plan.skipped),
                     over_budget=plan.over_budget, plan_seconds=plan_seconds, formula=plan.formula,
                     changes=[c.as_dict() for c in plan.changes[:_RECORDED_CHANGES]])
    errors: list[str] = []
    written: list[planning.CostChange] = []
    if not dry_run:
        for change, result in zip(plan.changes, _apply_all(gateway, plan.changes, errors)):
            if result == "written":
                run.written += 1
                written.append(change)
            elif result == "stale":
                run.stale += 1
    run.errors = errors
    run.finished_at = clock.now()
    with transaction.atomic():
        run.save()
        if written:
            _run_audit(run, written)
    if errors:
        logger.warning("binpack on %s: %d write(s) failed, first: %s", cluster, len(errors), errors[0])
    return run, plan
