"""Write binpack deletion costs: plan from a fresh snapshot, patch only pods whose cost
changes and only as the snapshot saw them (a pod changed since is re-read and judged
again), a few writes in flight at once, record the run.

A run that writes announces itself first: its row is committed `writing` with every
change it is about to write, under a lease its process renews while writes are in
flight. It is finished (counts and audit, one transaction) by the same process. A run
whose process died mid-write keeps `writing` past its lease; `binpack_runs_settle` (run by
the next binpack run on the cluster before it plans, so by the beat too) then reads the
announced pods, audits those that carry the announced cost (one entry for the run), and
marks the run interrupted with true counts, keeping on each announced change whether it
found it. A writer that was only stalled past its lease stops starting writes; when its
writes in flight answer, it records them itself: the whole run if no settler has recorded
it yet, else (under the run's row lock) only the writes the settle did not find, in an
entry of its own. So each cost that lands is audited once.

A write whose answer was lost (no answer or a server error after it was sent, past the
gateway's retries) may have been applied: its outcome is "unknown", not "error". The run
is finished `done` with those changes kept announced and counted `unknown`; the next
settle (the same claim and row lock) reads their pods, audits those carrying the cost in
one entry for the run, and counts the rest not written. A write cleanly refused (4xx, 429)
was not applied: it stays "error" and is not kept."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from audit.services import audit
from capacity.binpack import freed, planning
from capacity.binpack.models import BinpackRun
from clusters import kube
from clusters.errors import Conflict, KubeError, NotFound, describe_failure
from clusters.labels import BINPACK_MARKER, BINPACK_OPT_OUT, DELETION_COST
from clusters.selectors import snapshot_take
from clusters.snapshot import PodView
from config import clock
from config.leases import lease_holder, lease_renew

if TYPE_CHECKING:
    from collections.abc import Callable

    from clusters.models import Cluster

logger = logging.getLogger(__name__)

# Workload kinds whose `capacity.io/binpack: "false"` opts their pods out. A Deployment's
# opt-out reaches its ReplicaSets' pods through the ReplicaSet's owner.
_OPT_OUT_KINDS = (kube.DEPLOYMENTS, kube.REPLICASETS, kube.STATEFULSETS, kube.MODELSERVINGS)
# Changes kept on the run row for its page and the command's JSON (and listed in its audit
# entry): a first costing of a large cluster is up to BINPACK_MAX_WRITES (10,000) of them.
# The write-ahead `announced` list holds all of them while the run writes.
_RECORDED_CHANGES = 1000
# Seconds a writing run's lease reaches past its last renewal. The writer renews it every
# LEASE_RENEW_SECONDS while its writes are in flight (from the thread waiting on them, so a
# write hung for KUBE_RETRY_ATTEMPTS x KUBE_REQUEST_TIMEOUT does not let it lapse); a run
# still `writing` past it lost its process, and is settled by the next run on the cluster
# (the beat's every 300 s at the latest).
LEASE_SECONDS = 60
LEASE_RENEW_SECONDS = 10
INTERRUPTED_CAUSE = "recorded after an interruption: the run's process stopped mid-write"
LATE_CAUSE = "written by its own process after the run was settled as interrupted (the writes landed after the settle)"
LOST_ANSWER_CAUSE = ("recorded when settled: the write's answer was lost (the cluster stopped answering) and it was "
                     "found applied")


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


class _Stop(threading.Event):
    """Set when the writes not yet started are not to be tried; `outcome` is what they are
    then: "untried" (the cluster stopped answering) or "lease-lost" (the run was taken to
    be settled as interrupted)."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome = "untried"
        self._first = threading.Lock()

    def stop(self, outcome: str) -> None:
        with self._first:       # the first reason stands: a write thread and the renewal may race
            if not self.is_set():
                self.outcome = outcome
                self.set()


def _apply_one(gateway: kube.KubeGateway, change: planning.CostChange, errors: list[str],
               stop: _Stop | None = None) -> str:
    """Patch one pod. Returns "written", "stale" (it changed since the snapshot in a way
    that makes the planned cost not ours to write), "error" (refused, or failed before our
    write was sent), "unknown" (sent, its answer lost: it may have been applied), or, once
    `stop` was set, its outcome ("untried": an earlier write found the cluster not
    answering; "lease-lost").

    The write is conditioned on the version the snapshot read, so it applies only to the
    pod the plan judged (same uid, not leaving, its cost as planned from) at no extra
    read. A pod changed since (a status update, a label) is read again and judged again."""
    if stop is not None and stop.is_set():
        return stop.outcome
    if change.resource_version:
        try:
            gateway.patch(kube.PODS, change.name, _cost_patch(change, change.resource_version),
                          namespace=change.namespace)
            return "written"
        except NotFound:
            return "stale"
        except Conflict as exc:
            if exc.after_unanswered_write:
                return _landed_or_stale(gateway, change, errors, stop)
            # else changed since the snapshot: judge it as it is now
        except KubeError as exc:
            return _failed(change, exc, errors, stop, maybe_applied=_may_have_applied(exc))
    pod, outcome = _pod_read(gateway, change, errors, stop)
    if pod is None:
        return outcome
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
    except Conflict as exc:
        return _landed_or_stale(gateway, change, errors, stop) if exc.after_unanswered_write else "stale"
    except NotFound:
        return "stale"
    except KubeError as exc:
        return _failed(change, exc, errors, stop, maybe_applied=_may_have_applied(exc))
    return "written"


def _landed_or_stale(gateway: kube.KubeGateway, change: planning.CostChange, errors: list[str],
                     stop: _Stop | None) -> str:
    """A conditioned write refused (409) after an earlier try of it went unanswered: that
    try may have been applied, its answer lost, the pod's version then moved by this very
    write. The pod read again says which: the same pod carrying exactly this change (cost
    and marker) was written by it ("written": audited as this run's; another run writing the
    very same cost in that same moment would be audited by both, the same value twice);
    anything else is someone else's change ("stale"). A read that fails leaves it "unknown"."""
    pod, outcome = _pod_read(gateway, change, errors, stop, landed=True)
    if pod is None:
        return outcome
    return "written" if _carries(pod, change.uid, change.new) else "stale"


def _pod_read(gateway: kube.KubeGateway, change: planning.CostChange, errors: list[str],
              stop: _Stop | None, *, landed: bool = False) -> tuple[dict | None, str]:
    """The change's pod read again, else None and what the change's outcome is then
    ("stale": the pod is gone; "error", or "unknown" when a write of ours may have `landed`
    on it: the read failed, said in `errors`)."""
    try:
        return gateway.get(kube.PODS, change.name, namespace=change.namespace), ""
    except NotFound:
        return None, "stale"
    except KubeError as exc:
        return None, _failed(change, exc, errors, stop, maybe_applied=landed)


def _may_have_applied(exc: KubeError) -> bool:
    """Whether a write that ended in `exc` may have been applied all the same: no answer
    (a timeout, a connection cut after sending), a 5xx (a 2xx with an unreadable body
    included), or any error after an earlier try went unanswered. A refusal (4xx, a 429
    throttle) says it was not; nor was a write that could not be sent (a broken config)."""
    return exc.after_unanswered_write or exc.code >= 500 or (exc.code == 0 and exc.transient)


def _failed(change: planning.CostChange, exc: KubeError, errors: list[str], stop: _Stop | None, *,
            maybe_applied: bool) -> str:
    """"unknown" when a write of ours may have been applied (its pod says, when the run is
    settled), else "error"."""
    errors.append(f"{change.namespace}/{change.name}: {exc}")
    if stop is not None and exc.transient:
        # The gateway already retried this one: the cluster is not answering (or throttles
        # every try). Each further write would wait out the same retries (up to
        # KUBE_RETRY_ATTEMPTS x KUBE_REQUEST_TIMEOUT each), so the rest wait for the next run.
        stop.stop("untried")
    return "unknown" if maybe_applied else "error"


def _apply_all(gateway: kube.KubeGateway, changes, errors: list[str], *,
               heartbeat: Callable[[], bool] | None = None) -> list[str]:
    """`_apply_one` for every change, up to BINPACK_WRITE_CONCURRENCY in flight; results in
    the plan's order. After a write the cluster did not answer, the writes not yet started
    are not tried ("untried"), and `errors` says how many.

    `heartbeat` is called every LEASE_RENEW_SECONDS while writes are in flight (from this
    thread, which only waits on them); when it returns False the run's lease was lost (it
    is being settled as interrupted) and the writes not yet started are not tried
    ("lease-lost")."""
    stop = _Stop()
    if not changes:
        return []
    width = max(1, min(settings.BINPACK_WRITE_CONCURRENCY, len(changes)))
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="binpack-write") as pool:
        futures = [pool.submit(_apply_one, gateway, change, errors, stop) for change in changes]
        pending = set(futures)
        renewed = time.monotonic()
        while pending:
            # All of them or LEASE_RENEW_SECONDS, whichever first: one pass over the futures
            # per renewal, not one per write (10,000 writes on a first costing).
            _, pending = wait(pending, timeout=LEASE_RENEW_SECONDS)
            if heartbeat is not None and pending and time.monotonic() - renewed >= LEASE_RENEW_SECONDS:
                renewed = time.monotonic()
                if not heartbeat():
                    stop.stop("lease-lost")
        results = [f.result() for f in futures]
    unknown, untried, lost = results.count("unknown"), results.count("untried"), results.count("lease-lost")
    if unknown:
        errors.append(f"{unknown} write(s) sent whose answer was lost (above): their outcome is not known; the next "
                      "run on the cluster settles them from the pods before it plans")
    if untried:
        errors.append(f"{untried} write(s) not tried after the cluster failed to answer a write (above); "
                      "the next run plans them again")
    if lost:
        errors.append(f"{lost} write(s) not tried: the run's lease lapsed while it wrote and another process "
                      "took it to settle as interrupted; the next run plans them again")
    return results


def _renew(run: BinpackRun) -> bool:
    """Push the writer's lease ahead: one conditional UPDATE. False when it was lost."""
    expires = clock.now() + timedelta(seconds=LEASE_SECONDS)
    held = lease_renew(BinpackRun.objects.filter(pk=run.pk, state=BinpackRun.State.WRITING),
                       holder=run.lease_owner, until=expires)
    if held:
        run.lease_expires_at = expires
    else:
        logger.warning("binpack run %s: lease lost (settled as interrupted); this process stops writing", run.pk)
    return bool(held)


def _run_cause(run: BinpackRun) -> str:
    return f"binpack run #{run.pk} ({run.get_trigger_display()})"


def _run_audit(run: BinpackRun, written: list[tuple[str, str | None, int | None]], *, at: datetime,
               cause: str) -> None:
    """One entry for the pods a run patched (`written`: "namespace/pod", cost before, cost
    after): each pod's deletion cost before and after (the first `_RECORDED_CHANGES`; the
    count says how many in all). A run finished by its process, a settle and a late writer
    each write theirs in this shape."""
    shown = written[:_RECORDED_CHANGES]
    more = f" ({len(written) - len(shown)} more not listed)" if len(written) > len(shown) else ""
    audit(app="binpack", action="pod_deletion_costs_write", at=at, actor=run.actor,
          actor_label=run.actor_label, cause=cause,
          target=f"{len(written)} pod(s) of cluster {run.cluster}{more}", cluster=run.cluster,
          subject=("binpack_run", run.pk), old={key: old for key, old, _ in shown},
          new={key: new for key, _, new in shown})


def _written(change: planning.CostChange) -> tuple[str, str | None, int | None]:
    return f"{change.namespace}/{change.name}", change.old, change.new


def _announced(change: planning.CostChange) -> dict:
    return {"namespace": change.namespace, "pod": change.name, "uid": change.uid, "old": change.old,
            "new": change.new}


def pod_deletion_costs_apply(*, cluster: Cluster, actor=None, trigger: str = BinpackRun.Trigger.SCHEDULE,
                             dry_run: bool = False, override_manual: bool | None = None,
                             gateway: kube.KubeGateway | None = None) -> tuple[BinpackRun, planning.BinpackPlan]:
    """Plan the costs of `cluster` and write those that change (none when `dry_run`).
    The run's `results` (not stored) holds each change's outcome in the plan's order:
    "written", "stale", "error", "unknown", "untried" or "lease-lost"; its stored `changes`
    carry theirs. The "unknown" ones stay announced on the run (`unknown` counts them) for
    the next run on the cluster to settle. Its
    `settled` (not stored) lists the earlier runs of the cluster it found interrupted and
    settled before planning.

    A cluster that cannot be read is a run too, recorded with why (whether a retry may
    help, then the API's answer) before the error is raised: the runs page is where an
    operator looks, and a refused schedule must not be silent there."""
    started = clock.now()
    try:
        gateway = gateway or kube.gateway_for(cluster)
        # IMPORTANT: before the snapshot: an interrupted run's written costs read as
        # "unchanged" to the plan, so they are audited now or never.
        settled = binpack_runs_settle(cluster=cluster, gateway=gateway, now=started)
        snapshot = snapshot_take(gateway, now=started)
        options = binpack_options(override_manual=override_manual, opted_out_owners=opted_out_owners(gateway))
    except KubeError as exc:
        BinpackRun.objects.create(cluster=cluster, started_at=started, finished_at=clock.now(), actor=actor,
                                  trigger=trigger, dry_run=dry_run,
                                  errors=[f"cluster not read, nothing written: {describe_failure(exc)}"])
        raise
    t0 = time.perf_counter()
    plan = planning.binpack_plan(snapshot, options=options)
    plan_seconds = round(time.perf_counter() - t0, 3)   # kept and shown to the millisecond
    run = BinpackRun(cluster=cluster, started_at=started, actor=actor, trigger=trigger, dry_run=dry_run,
                     planned=len(plan.changes), unchanged=plan.unchanged, skipped=len(plan.skipped),
                     over_budget=plan.over_budget, plan_seconds=plan_seconds, formula=plan.formula,
                     changes=[c.as_dict() for c in plan.changes[:_RECORDED_CHANGES]])
    run.settled = settled
    if plan.changes and not dry_run:
        # IMPORTANT: committed before the first write, with every change it may write:
        # a process killed mid-write leaves this row for `binpack_runs_settle`.
        if transaction.get_connection().in_atomic_block:
            logger.warning("binpack run on %s announced inside a transaction: not durable until it commits", cluster)
        for recorded in run.changes:
            recorded["result"] = "announced"
        run.state = BinpackRun.State.WRITING
        run.announced = [_announced(c) for c in plan.changes]
        run.lease_owner = lease_holder("writer")
        run.lease_expires_at = clock.now() + timedelta(seconds=LEASE_SECONDS)
        run.save()
    errors: list[str] = []
    written: list[planning.CostChange] = []
    unknown: list[planning.CostChange] = []
    # Each change's outcome, in the plan's order (none for a dry run): what the command
    # and the run page say of each pod, so that no planned cost reads as written.
    run.results = [] if dry_run else _apply_all(gateway, plan.changes, errors,
                                                heartbeat=lambda: _renew(run))
    for change, result in zip(plan.changes, run.results):
        if result == "written":
            run.written += 1
            written.append(change)
        elif result == "stale":
            run.stale += 1
        elif result == "unknown":
            unknown.append(change)
    for recorded, result in zip(run.changes, run.results):
        recorded["result"] = result
    if not dry_run:
        # The nodes whose pods now carry costs that send a scale-down to them first: what the
        # periodic check watches for being freed (capacity/binpack/freed.py).
        run.marked = [m.as_dict() for m in freed.nodes_to_empty_first(
            plan, snapshot, written={(c.namespace, c.name) for c in written})]
    run.errors = errors
    run.finished_at = clock.now()
    with transaction.atomic():
        # IMPORTANT: under the run's row lock, as a settler records it: whoever records the
        # run second sees what the first recorded, so no cost is audited twice.
        settled_meanwhile = run.state == BinpackRun.State.WRITING and BinpackRun.objects.select_for_update(
        ).values_list("state", flat=True).get(pk=run.pk) != BinpackRun.State.WRITING
        if not settled_meanwhile:
            # Ours, or claimed by a settler that has not recorded it yet (its lease lapsed while
            # writes were in flight): every write has answered, which says more than the
            # settler's reading of the pods can, so the run is recorded here and the settler,
            # finding it done, records nothing. Writes whose answer was lost stay announced,
            # without a lease: the next settle reads their pods.
            run.state, run.lease_owner, run.lease_expires_at = BinpackRun.State.DONE, "", None
            run.announced, run.unknown = [_announced(c) for c in unknown], len(unknown)
            run.save()
            if written:
                _run_audit(run, [_written(c) for c in written], at=run.finished_at, cause=_run_cause(run))
    if settled_meanwhile:
        results = run.results
        run = _late_writes_record(run.pk, changes=plan.changes, results=results, errors=errors, now=run.finished_at)
        run.results, run.settled = results, settled
    if errors:
        logger.warning("binpack on %s: %d write(s) failed, %d of unknown outcome, %d not tried, first: %s", cluster,
                       run.results.count("error"), run.results.count("unknown"),
                       run.results.count("untried") + run.results.count("lease-lost"), errors[0])
    return run, plan


def _carries(pod: dict | None, uid: str, new: int | None) -> bool:
    """Whether `pod` is the pod `uid` (not replaced) carrying exactly the cost `new` and
    its marker (both absent for a removal): what a run's patch of it leaves."""
    if pod is None:
        return False
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    value = None if new is None else str(new)
    return meta.get("uid") == uid and notes.get(DELETION_COST) == value and notes.get(BINPACK_MARKER) == value


def _unsettled() -> Q:
    """Runs a settle is for: one writing (past its lease, its process died or stalled), or
    one with writes whose answer was lost."""
    return Q(state=BinpackRun.State.WRITING) | Q(unknown__gt=0)


def binpack_runs_settle(*, cluster: Cluster, gateway: kube.KubeGateway | None = None,
                        now: datetime | None = None) -> list[BinpackRun]:
    """Settle the runs of `cluster` whose writes' outcomes are not known, from the pods they
    announced: every run left `writing` past its lease (its process died mid-write), and
    every run with writes whose answer was lost (`unknown`). The pods carrying the announced
    cost and marker are audited now, in one entry per run under its actor saying why they
    are recorded only now; the rest are recorded as not written. A run left writing is
    marked interrupted with true counts, each announced change keeping whether it was found
    (`found`), for its process should it answer late after all (`_late_writes_record`); a
    run with lost answers keeps its state, its counts made final.
    Returns the runs settled. Idempotent; concurrent settlers take a run one at a time (a
    conditional UPDATE claims it, the final record is made under a row lock and only by
    the claimant). A cluster that cannot be read raises its KubeError; the run stays as it
    was, for the next settler."""
    now = now or clock.now()
    lapsed = BinpackRun.objects.filter(_unsettled(), cluster=cluster).filter(
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)).order_by("pk")
    settled: list[BinpackRun] = []
    for stale in lapsed:
        holder = lease_holder("settler")
        claimed = BinpackRun.objects.filter(
            _unsettled(), pk=stale.pk, lease_owner=stale.lease_owner,
            lease_expires_at=stale.lease_expires_at).update(
            lease_owner=holder, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS))
        if not claimed:
            continue     # another settler took it (or settled it), or its writer renewed or finished just now
        try:
            gateway = gateway or kube.gateway_for(cluster)
            pods = {(p["metadata"].get("namespace"), p["metadata"].get("name")): p
                    for p in gateway.list(kube.PODS) if p.get("metadata")}
        except KubeError:
            # Let the next settler try at once: the lease it leaves is already lapsed.
            BinpackRun.objects.filter(pk=stale.pk, lease_owner=holder).update(lease_expires_at=now)
            raise
        run = _settle_one(stale.pk, holder=holder, pods=pods, now=now)
        if run is not None:
            settled.append(run)
    return settled


def _settle_one(pk: int, *, holder: str, pods: dict, now: datetime) -> BinpackRun | None:
    with transaction.atomic():
        run = BinpackRun.objects.select_for_update(of=("self",)).select_related("cluster", "actor").get(pk=pk)
        if run.lease_owner != holder or not (run.state == BinpackRun.State.WRITING or run.unknown):
            return None     # its writer finished it meanwhile, or another settler took it over
        interrupted = run.state == BinpackRun.State.WRITING
        for a in run.announced:
            # Kept on an interrupted run: what its process, should it still answer, must not audit again.
            a["found"] = _carries(pods.get((a["namespace"], a["pod"])), a["uid"], a["new"])
        written = [a for a in run.announced if a["found"]]
        at = f"{now:%Y-%m-%d %H:%M:%S %Z}"
        if written:
            why = (f"{INTERRUPTED_CAUSE}; the pods carried the announced cost when the run was settled at {at}"
                   if interrupted else f"{LOST_ANSWER_CAUSE} when the run was settled at {at}")
            _run_audit(run, [(f"{a['namespace']}/{a['pod']}", a["old"], a["new"]) for a in written], at=now,
                       cause=f"{_run_cause(run)}, {why}")
        found = {(a["namespace"], a["pod"]) for a in written}
        for recorded in run.changes:
            if interrupted or recorded.get("result") == "unknown":
                hit = (recorded.get("namespace"), recorded.get("pod")) in found
                recorded["result"] = "settled-written" if hit else "settled-not-written"
        announced, unwritten = len(run.announced), len(run.announced) - len(written)
        if interrupted:
            run.written, run.unwritten = len(written), unwritten
            run.errors = [f"interrupted: its process stopped mid-write; settled from the cluster at {at}: "
                          f"{run.written} of {announced} announced cost(s) found written and audited then, "
                          f"{run.unwritten} not written (the next run plans them again)", *run.errors]
            run.state, run.finished_at = BinpackRun.State.INTERRUPTED, now
        else:
            run.written, run.unwritten, run.unknown, run.announced = (
                run.written + len(written), run.unwritten + unwritten, 0, [])
            run.errors = [*run.errors,
                          f"{announced} write(s) whose answer was lost settled from the cluster at {at}: "
                          f"{len(written)} found written and audited then, {unwritten} not written (the next run "
                          "plans them again)"]
        run.lease_owner, run.lease_expires_at = "", None
        run.save()
    if interrupted:
        logger.warning("binpack run %s on %s settled as interrupted: %d of %d announced cost(s) written", run.pk,
                       run.cluster, run.written, run.written + run.unwritten)
    else:
        run.lost_answers_settled = (len(written), announced)
        logger.warning("binpack run %s on %s: %d write(s) whose answer was lost settled, %d found written", run.pk,
                       run.cluster, announced, len(written))
    return run


def _late_writes_record(pk: int, *, changes, results: list[str], errors: list[str], now: datetime) -> BinpackRun:
    """A writer whose run was settled as interrupted while its writes were in flight records,
    once they all answered, the costs it wrote that the settle did not find on the pods (the
    settle read them before these writes landed): audited under the run's actor in an entry
    of their own, and counted written on the run. The settle's findings stay as it recorded
    them (audited once, by it). Its writes whose answer was lost that the settle did not find
    may have landed after it: they stay announced, counted `unknown` again, for the next
    settle. Under the run's row lock, as the settle was recorded."""
    with transaction.atomic():
        run = BinpackRun.objects.select_for_update(of=("self",)).select_related("cluster", "actor").get(pk=pk)
        found = {(a["namespace"], a["pod"]): a.get("found") for a in run.announced}
        if run.state != BinpackRun.State.INTERRUPTED or not found:
            logger.warning("binpack run %s: settled as interrupted while it wrote and its settle's findings are gone "
                           "(already recorded); its %d write(s) returned here are not recorded again", pk,
                           results.count("written"))
            return run
        late = [c for c, result in zip(changes, results)
                if result == "written" and found.get((c.namespace, c.name)) is False]
        unknown = [c for c, result in zip(changes, results)
                   if result == "unknown" and found.get((c.namespace, c.name)) is False]
        if late:
            _run_audit(run, [_written(c) for c in late], at=now, cause=f"{_run_cause(run)}, {LATE_CAUSE}")
        outcome = {**{(c.namespace, c.name): "written-late" for c in late},
                   **{(c.namespace, c.name): "unknown" for c in unknown}}
        for recorded in run.changes:
            recorded["result"] = outcome.get((recorded.get("namespace"), recorded.get("pod")), recorded.get("result"))
        run.written, run.unwritten = run.written + len(late), run.unwritten - len(late) - len(unknown)
        pending = f", {len(unknown)} of unknown outcome (settled by the next run)" if unknown else ""
        run.errors = [*run.errors,
                      f"its process's writes all answered at {now:%Y-%m-%d %H:%M:%S %Z}, after the settle: "
                      f"{len(late)} more cost(s) written, audited by it; {run.written} of {len(found)} written in "
                      f"all{pending}",
                      *errors]
        # Its process has no write left in flight: nothing more can land for this run but
        # the writes whose answer was lost, if they landed after the settle read their pods.
        run.announced, run.unknown = [_announced(c) for c in unknown], len(unknown)
        run.save()
    logger.warning("binpack run %s on %s: settled as interrupted while it wrote; %d of its write(s) landed after "
                   "the settle and were recorded by its process", pk, run.cluster, len(late))
    return run
