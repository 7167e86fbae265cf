"""Write binpack deletion costs: plan from a fresh snapshot, patch only pods whose cost
changes and only as the snapshot saw them (a pod changed since is re-read and judged
again), a few writes in flight at once, record the run."""
from __future__ import annotations

import logging
import threading
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
from clusters.snapshot import PodView
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


def _apply_one(gateway: kube.KubeGateway, change: planning.CostChange, errors: list[str],
               stop: threading.Event | None = None) -> str:
    """Patch one pod. Returns "written", "stale" (it changed since the snapshot in a way
    that makes the planned cost not ours to write), "error", or "untried" (`stop` was set:
    an earlier write found the cluster not answering).

    The write is conditioned on the version the snapshot read, so it applies only to the
    pod the plan judged (same uid, not leaving, its cost as planned from) at no extra
    read. A pod changed since (a status update, a label) is read again and judged again."""
    if stop is not None and stop.is_set():
        return "untried"
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
            return _failed(change, exc, errors, stop)
    try:
        pod = gateway.get(kube.PODS, change.name, namespace=change.namespace)
    except NotFound:
        return "stale"
    except KubeError as exc:
        return _failed(change, exc, errors, stop)
    meta = pod.get("metadata") or {}
    current = (meta.get("annotations") or {}).get(DELETION_COST)
    # IMPORTANT: a recreated pod, a pod now leaving, or a cost someone set since the
    # snapshot are not ours to overwrite; nor is a pod opted out since, or one that left
    # its workload (a defrag job orphaned it): the plan's cost was for its place there.
    if meta.get("uid") != change.uid or meta.get("deletionTimestamp") or current != change.old:
        return "stale"
    if change.new is not None:
        try:
            view = PodView.from_object(pod)
        except ValueError:
            return "stale"
        if planning.pod_opts_out(view) or planning.workload_of(view) != change.workload:
            return "stale"
    try:
        gateway.patch(kube.PODS, change.name, _cost_patch(change, meta.get("resourceVersion")),
                      namespace=change.namespace)
    except (Conflict, NotFound):
        return "stale"
    except KubeError as exc:
        return _failed(change, exc, errors, stop)
    return "written"


def _failed(change: planning.CostChange, exc: KubeError, errors: list[str], stop: threading.Event | None) -> str:
    errors.append(f"{change.namespace}/{change.name}: {exc}")
    if stop is not None and exc.transient:
        # The gateway already retried this one: the cluster is not answering (or throttles
        # every try). Each further write would wait out the same retries (up to
        # KUBE_RETRY_ATTEMPTS x KUBE_REQUEST_TIMEOUT each), so the rest wait for the next run.
        stop.set()
    return "error"


def _apply_all(gateway: kube.KubeGateway, changes, errors: list[str]) -> list[str]:
    """`_apply_one` for every change, up to BINPACK_WRITE_CONCURRENCY in flight; results in
    the plan's order. After a write the cluster did not answer, the writes not yet started
    are not tried ("untried"), and `errors` says how many."""
    stop = threading.Event()
    width = min(settings.BINPACK_WRITE_CONCURRENCY, len(changes))
    if width < 2:
        results = [_apply_one(gateway, change, errors, stop) for change in changes]
    else:
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix="binpack-write") as pool:
            results = list(pool.map(lambda change: _apply_one(gateway, change, errors, stop), changes))
    untried = results.count("untried")
    if untried:
        errors.append(f"{untried} write(s) not tried after the cluster failed to answer a write (above); "
                      "the next run plans them again")
    return results


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
    The run's `results` (not stored) holds each change's outcome in the plan's order:
    "written", "stale", "error" or "untried"; its stored `changes` carry theirs.

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
    # Each change's outcome, in the plan's order (none for a dry run): what the command
    # and the run page say of each pod, so that no planned cost reads as written.
    run.results = [] if dry_run else _apply_all(gateway, plan.changes, errors)
    for change, result in zip(plan.changes, run.results):
        if result == "written":
            run.written += 1
            written.append(change)
        elif result == "stale":
            run.stale += 1
    for recorded, result in zip(run.changes, run.results):
        recorded["result"] = result
    run.errors = errors
    run.finished_at = clock.now()
    with transaction.atomic():
        run.save()
        if written:
            _run_audit(run, written)
    if errors:
        logger.warning("binpack on %s: %d write(s) failed, %d not tried, first: %s", cluster,
                       run.results.count("error"), run.results.count("untried"), errors[0])
    return run, plan
