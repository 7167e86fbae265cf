"""Ending orphans (a drain evicts them, an abort deletes them), each request announced on its
orphan as a write-ahead intent before it is sent, and the intent a killed worker left settled."""
from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from clusters import kube
from clusters.errors import Conflict, NotFound, TooManyRequests
from clusters.labels import REVISION_LABEL

from capacity.defrag.models import DefragJob, DefragOrphan, OrphanEnd, OrphanState
from capacity.defrag.planning import (
    EndSettle,
    OrphanEndChoice,
    asleep_line,
    orphan_end_decide,
    orphan_end_settle,
    replicaset_ready_pods,
)
from capacity.defrag.selectors import defrag_revision_orphan_names
from capacity.defrag.services.record import (
    _append_log,
    _cause,
    _commit,
    _event,
    _get_pod,
    _is_orphaned,
    _pod_named,
    _pod_ref,
    _revision_asleep,
    _scale,
    _stamp,
)


# kubectl drain waits this long before retrying an eviction a PodDisruptionBudget refused.
EVICTION_RETRY_SECONDS = 5.0


def _settle_planned(job: DefragJob, gateway: kube.KubeGateway, now: datetime) -> None:
    """Planned pods at drain/abort time: one found orphaned was patched before a crash, so it
    is ours to end; the others were never touched."""
    for orphan in job.orphans.filter(state=OrphanState.PLANNED):
        pod = _get_pod(gateway, orphan)
        orphan.state = OrphanState.ORPHANED if pod is not None and _is_orphaned(pod) else OrphanState.SKIPPED
        _commit(job, orphans=[orphan], now=now)


EVICTION_REFUSED = "Eviction refused by a PodDisruptionBudget: "


def eviction_retry_seconds(job: DefragJob) -> float:
    """Seconds until a refused eviction is tried again: kubectl's 5 s, or the job's poll
    interval when that is shorter (what the log line must say)."""
    return min(job.poll_interval_seconds, EVICTION_RETRY_SECONDS)


class _Ending(NamedTuple):
    """What one pass over the orphans left: how many are not gone yet, the (orphan, ready,
    wanted) an abort keeps because its revision needs it still, and (ns/name, what became
    of it) for each orphan this pass deleted, evicted or saw gone."""
    waiting: int
    kept: list
    ended: list


# An eviction or deletion whose answer was lost (the connection dropped after it was sent),
# and the gateway's try again found the pod gone: the first one went out, and the pod is gone
# after it. Recorded as the job's, as a killed worker's request is (`_end_intent_settle`):
# taken for a pod that went by itself, the job's own end of it would go unaudited.
ANSWER_LOST_GONE = "its answer was lost; asked again, the pod was gone"

# What the cause of an orphan's eviction or deletion starts with when a later pass records
# it: first and short, so the audit trail's 200 characters never cut it off.
END_INTERRUPTED = "recorded after an interruption"


def _end_words(end: str) -> tuple[str, str, str]:
    """(audit action, what was done, the request) for an orphan's end."""
    if end == OrphanEnd.EVICT:
        return "pod_evict", "evicted", "eviction"
    return "pod_delete", "deleted", "deletion"


def _end_event_message(job: DefragJob, end: str, cause: str) -> str:
    """The Event an orphan's end posts: the same text whoever records it, so an Event posted
    before a worker died is not posted twice (its name is derived from it)."""
    return f"Evicted by defrag job #{job.pk} (drain of {job.node_name})" if end == OrphanEnd.EVICT else cause


def _end_intent_clear(orphan: DefragOrphan) -> None:
    orphan.end_intent, orphan.end_intent_at, orphan.end_intent_by, orphan.end_intent_cause = "", None, None, ""


def _end_intent_settle(job: DefragJob, gateway: kube.KubeGateway, now: datetime, orphan: DefragOrphan,
                       named: dict | None) -> tuple[str, str]:
    """Record what became of an eviction or deletion a worker announced on `orphan` and
    stopped before recording (`named`: the pod now under its name, None when none is).

    Gone or terminating: the request went out; it is audited now, once (the intent is cleared
    in the same record), dated when it was sent, under the operator it was sent for. Another
    pod under the name: that one is not the job's, and the end of the old one is not recorded
    as the job's doing. Still serving: it never took effect; the caller decides again.
    Returns (EndSettle outcome, what became of the pod for the abort-stuck check's line)."""
    meta = (named or {}).get("metadata") or {}
    outcome = orphan_end_settle(orphan_uid=orphan.uid, pod_uid=meta.get("uid") if named is not None else None,
                                terminating=bool(meta.get("deletionTimestamp")))
    if outcome == EndSettle.NOT_SENT:
        return outcome, ""
    key = f"{orphan.namespace}/{orphan.pod_name}"
    action, done, request = _end_words(orphan.end_intent)
    audits: list[dict] = []
    if outcome == EndSettle.REPLACED:
        what = f"gone (replaced by a new pod of the same name, not this job's; its {request} is not recorded)"
        _append_log(job, f"Pod {key} is gone; the pod now under its name (uid {meta.get('uid')}) is a new one, not "
                         f"this job's: left alone. This job's interrupted {request} of the old pod is not recorded "
                         f"as done (the old pod may have gone before it).")
    else:
        what = f"{done} before its worker stopped; " + ("gone" if outcome == EndSettle.GONE else "is terminating")
        audits.append(dict(action=action, target=f"Pod/{key}", now=orphan.end_intent_at,
                           actor=orphan.end_intent_by, new={"pod": outcome, "recorded_after_interruption": True},
                           cause=f"{END_INTERRUPTED}: {orphan.end_intent_cause}"))
        _event(gateway, job, _pod_ref(orphan), reason="DefragEvict" if action == "pod_evict" else "DefragDelete",
               message=_end_event_message(job, orphan.end_intent, orphan.end_intent_cause), now=now)
        _append_log(job, f"Pod {key} {done} by this job (sent at {_stamp(orphan.end_intent_at)}); its worker "
                         f"stopped before recording it: recorded now")
    _end_intent_clear(orphan)
    if outcome == EndSettle.TERMINATING:
        orphan.state = OrphanState.DELETING
    else:
        orphan.state, orphan.gone_at = OrphanState.GONE, now
        _append_log(job, f"Pod {key} gone")
        audits.append(dict(action="pod_gone", target=f"Pod/{key}",
                           new={"replaced_by_uid": meta.get("uid")} if outcome == EndSettle.REPLACED else None))
    _commit(job, orphans=[orphan], now=now, audits=audits)
    return outcome, what


class _Readiness(NamedTuple):
    """A revision as an abort finds it: pods of its ReplicaSet ready without the orphans, the
    replicas it wants (0 once its model was deleted), and why it may want none."""
    ready: int
    wanted: int
    model_deleted: bool
    asleep: bool   # scaled to zero (`revision_asleep`)


def _revision_readiness(job: DefragJob, gateway: kube.KubeGateway, orphan: DefragOrphan) -> _Readiness:
    """Read the orphan's revision (its ReplicaSet, its pods, its PodAutoscaler when scaled to 0)."""
    model_deleted = False
    try:
        rs = gateway.get(kube.REPLICASETS, orphan.revision.replicaset, namespace=orphan.namespace)
    except NotFound:
        # The model was deleted: it wants no pod, and an orphan has no owner for the
        # garbage collector to follow, so ending it is the abort's to do.
        rs = {"spec": {"replicas": 0}}
        model_deleted = True
        _append_log(job, f"ReplicaSet {orphan.namespace}/{orphan.revision.replicaset} is gone "
                         f"(its model was deleted): its orphans are deleted")
    pods = gateway.list(kube.PODS, namespace=orphan.namespace,
                        label_selector=f"{REVISION_LABEL}={orphan.revision.revision}")
    ready = replicaset_ready_pods(pods, replicaset=orphan.revision.replicaset)
    wanted = _scale((rs.get("spec") or {}).get("replicas"))
    asleep = not model_deleted and _revision_asleep(gateway, orphan.revision, replicas=wanted)
    if asleep:
        _append_log(job, asleep_line(revision=orphan.revision.revision, during_wait=False,
                                     orphans=defrag_revision_orphan_names(revision=orphan.revision)))
    return _Readiness(ready=ready, wanted=wanted, model_deleted=model_deleted, asleep=asleep)


def _end_orphans(job: DefragJob, gateway: kube.KubeGateway, now: datetime, *, evict: bool,
                 force: bool = False, checked_again: bool = False) -> _Ending:
    """Evict (drain) or delete (abort) the orphans. Whether an abort deletes an orphan or keeps
    it is `orphan_end_decide`'s (planning); this carries it out. `checked_again`: a check of
    an abort-stuck job (`_step_recheck`), said in each deletion's audit cause.

    Each request is announced on its orphan (`end_intent`, committed) before it is sent, and
    recorded with the intent cleared after: a worker killed in between leaves the intent,
    and the next pass records that end from what the pod shows (`_end_intent_settle`)."""
    waiting = 0
    refused = False
    kept: list = []
    ended: list[tuple[str, str]] = []
    readiness: dict[int, _Readiness] = {}  # revision id -> what its ReplicaSet has and wants, read once per pass
    end = OrphanEnd.EVICT if evict else OrphanEnd.DELETE
    for orphan in job.orphans.filter(state__in=[OrphanState.ORPHANED, OrphanState.DELETING]).select_related(
            "revision"):
        target = f"Pod/{orphan.namespace}/{orphan.pod_name}"
        named = _pod_named(gateway, orphan)
        if orphan.end_intent:
            outcome, what = _end_intent_settle(job, gateway, now, orphan, named)
            if outcome != EndSettle.NOT_SENT:
                ended.append((f"{orphan.namespace}/{orphan.pod_name}", what))
                waiting += outcome == EndSettle.TERMINATING
                continue
        pod = named if named is not None and (named.get("metadata") or {}).get("uid") == orphan.uid else None
        if pod is None:
            ended.append((f"{orphan.namespace}/{orphan.pod_name}",
                          "gone (its deletion finished)" if orphan.state == OrphanState.DELETING else "gone"))
            orphan.state, orphan.gone_at = OrphanState.GONE, now
            _append_log(job, f"Pod {orphan.namespace}/{orphan.pod_name} gone")
            _commit(job, orphans=[orphan], now=now, audits=[dict(action="pod_gone", target=target)])
            continue
        waiting += 1
        if orphan.state == OrphanState.DELETING:
            continue  # terminating: wait for its grace period
        pod_key = f"{orphan.namespace}/{orphan.pod_name}"
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            # Terminating, and no intent says the job asked for it: someone else deleted it.
            # It is waited for like the job's own; its deletion is not audited as the job's.
            orphan.state = OrphanState.DELETING
            _end_intent_clear(orphan)
            ended.append((pod_key, "is terminating (deleted outside this job)"))
            _append_log(job, f"Pod {pod_key} is terminating: deleted outside this job")
            _commit(job, orphans=[orphan], now=now)
            continue
        new: dict = {}
        action, done, _ = _end_words(end)
        line = f"Pod {pod_key} {done}"
        if evict:
            cause = _cause(job)
            _end_intent_write(job, orphan, end=end, cause=cause, now=now)
            try:
                gateway.evict(orphan.pod_name, namespace=orphan.namespace)
            except TooManyRequests as exc:
                _append_log(job, f"Eviction of {pod_key} refused (PodDisruptionBudget): retrying in "
                                 f"{eviction_retry_seconds(job):g}s")
                job.error, refused = f"{EVICTION_REFUSED}{exc}", True
                _end_intent_refused(job, orphan, now)
                continue
            except NotFound as exc:
                if not exc.after_unanswered_write:
                    _end_intent_refused(job, orphan, now)
                    continue  # gone meanwhile: seen as gone on the next pass
                line, new = f"{line} ({ANSWER_LOST_GONE})", {"answer_lost": True}
        else:
            if orphan.revision_id not in readiness:
                readiness[orphan.revision_id] = _revision_readiness(job, gateway, orphan)
            ready, wanted, model_deleted, asleep = readiness[orphan.revision_id]
            decision = orphan_end_decide(revision=orphan.revision.revision, ready=ready, wanted=wanted,
                                         model_deleted=model_deleted, asleep=asleep, force=force,
                                         checked_again=checked_again)
            if decision.keep:
                _append_log(job, f"Pod {pod_key} kept: revision {orphan.revision.revision} has "
                                 f"{ready}/{wanted} ready without it")
                kept.append((orphan, ready, wanted))
                if orphan.end_intent:
                    _end_intent_refused(job, orphan, now)  # an earlier request never took effect
                continue
            # Why the abort may end it: the Event's message and the audit entry's cause say it.
            context, why = decision.context, decision.why
            if decision.choice == OrphanEndChoice.FORCE:
                line = (f"Pod {pod_key} deleted as the operator chose: revision {orphan.revision.revision} has "
                        f"{ready}/{wanted} ready without it (capacity drops)")
                new = {"forced": True, "ready": ready, "wanted": wanted}
            cause = f"Deleted by defrag job #{job.pk} ({context}): {why}"
            _end_intent_write(job, orphan, end=end, cause=cause, now=now)
            try:
                gateway.delete(kube.PODS, orphan.pod_name, namespace=orphan.namespace, uid=orphan.uid)
            except NotFound as exc:
                if not exc.after_unanswered_write:
                    _end_intent_refused(job, orphan, now)
                    continue  # gone meanwhile: seen as gone on the next pass
                line, new = f"{line} ({ANSWER_LOST_GONE})", {**new, "answer_lost": True}
            except Conflict:
                # The uid precondition failed: the name holds a new pod, which is not this job's.
                _append_log(job, f"Pod {pod_key} was replaced by a new pod of the same name before its "
                                 f"deletion: the new one is not this job's and is left alone")
                _end_intent_refused(job, orphan, now)
                continue
            ended.append((pod_key, f"deleted: {why}"))
        orphan.state = OrphanState.DELETING
        _end_intent_clear(orphan)
        _event(gateway, job, _pod_ref(orphan), reason="DefragEvict" if evict else "DefragDelete",
               message=_end_event_message(job, end, cause), now=now)
        _append_log(job, line)
        _commit(job, orphans=[orphan], now=now, audits=[dict(action=action, target=f"Pod/{pod_key}", new=new,
                                                             cause=cause)])
    if not refused and job.error.startswith(EVICTION_REFUSED):
        job.error = ""  # no budget refused this pass: the job must not go on showing an old 429
    return _Ending(waiting=waiting, kept=kept, ended=ended)


def _end_intent_write(job: DefragJob, orphan: DefragOrphan, *, end: str, cause: str, now: datetime) -> None:
    """IMPORTANT: committed before the eviction or deletion is sent, so a worker dying right
    after it leaves a record that the pod's end is the job's (and why, and for whom)."""
    orphan.end_intent, orphan.end_intent_at, orphan.end_intent_cause = end, now, cause
    orphan.end_intent_by_id = job.operator_id
    _commit(job, orphans=[orphan], now=now)


def _end_intent_refused(job: DefragJob, orphan: DefragOrphan, now: datetime) -> None:
    """The request was refused (a PodDisruptionBudget, the pod gone or replaced before it):
    nothing was ended, so nothing is left to be recorded as ended later."""
    _end_intent_clear(orphan)
    _commit(job, orphans=[orphan], now=now)
