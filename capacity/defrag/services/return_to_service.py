"""Returning a node a defrag job has held to service: the uncordon under a write-ahead
intent on the job, the abort it asks for, and the intents a killed process left settled."""
from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from clusters import kube
from clusters.errors import KubeError, NotFound
from config import clock
from config.actors import acting_as, actor_label_current

from capacity.defrag.models import LIVE_STATES, DefragJob, JobState
from capacity.defrag.planning import seconds_text
from capacity.defrag.selectors import defrag_job_live_orphans
from capacity.defrag.services.abort import NODE_RETURNED
from capacity.defrag.services.jobs import defrag_job_abort
from capacity.defrag.services.record import (
    DefragError,
    RESUME_PROMISE,
    ReturnUnconfirmed,
    _audit,
    _event,
    _gateway,
    _log_write,
    _node_ref,
    _stamp,
    _who,
)

if TYPE_CHECKING:
    from clusters.models import Cluster

log = logging.getLogger(__name__)

# A job resting here has no worker acting on the node, and no longer needs it cordoned: the
# node may take pods again. A job in any other live state is emptying the node (or undoing
# its own work): uncordoning under it would let replacements land back where it is moving
# pods from.
RETURNABLE_STATES = (JobState.SAFE, JobState.BLOCKED, JobState.FAILED, JobState.DRAINED, JobState.ABORTED,
                     JobState.ABORT_STUCK)
# Resting jobs that still track orphans serving on the node and have no abort under way:
# returning the node to service also asks for the abort that ends them (each one only once
# its revision is back to scale), so no orphan holds a GPU forever and no drain can follow
# on a node that takes new pods again.
ENDED_BY_RETURN = (JobState.SAFE, JobState.BLOCKED, JobState.FAILED)


@dataclass(frozen=True)
class ReturnToService:
    """What `node_return_to_service` did, in the words the panel and the CLI print."""

    node: str
    job_id: int
    uncordoned: bool
    abort_requested: bool
    message: str


def defrag_job_holding_reason(job: DefragJob) -> str:
    """Why this job does not let the node go now, or "" when it does."""
    if job.state not in RETURNABLE_STATES:
        return f"defrag job #{job.pk} is {job.state}: a worker is acting on the node"
    if job.abort_pending:
        return f"defrag job #{job.pk} has an abort request not yet taken up"
    if job.state == JobState.SAFE and job.drain_requested_at is not None:
        return f"defrag job #{job.pk} has a drain requested"
    return ""


# A return to service announces itself on the job before its patch (`return_intent_*`,
# committed), and clears that with its audit entry. An intent found left behind on a node
# still cordoned means its patch never went out, or a newer return took over: the resume
# beat lets it lapse only after this long (seconds; a live return to service passes from
# its announcement to its patch in well under a second, and at worst waits out a few
# gateway retries of KUBE_REQUEST_TIMEOUT, 30 s, each). Ten minutes: far above both.
RETURN_INTENT_LAPSE_SECONDS = 600.0


@dataclass(frozen=True)
class _IntentSettled:
    """What became of a return to service's intent left behind, in the operator's words."""

    message: str
    recorded: bool          # its uncordon was found done and audited now
    abort_requested: bool   # the abort that return would have asked for is asked now


def _return_intent_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _return_intent_clear(row: DefragJob) -> None:
    DefragJob.objects.filter(pk=row.pk).update(return_intent_at=None, return_intent_by=None, return_intent_label="",
                                               return_intent_cause="", return_intent_owner="")
    row.return_intent_at, row.return_intent_by, row.return_intent_label = None, None, ""
    row.return_intent_cause, row.return_intent_owner = "", ""


def _abort_asked_text(row: DefragJob, orphans: int) -> str:
    if orphans:
        return (f" Abort of defrag job #{row.pk} requested: its {orphans} orphan(s) are deleted, each once its "
                f"revision is back to scale.")
    return f" Abort of defrag job #{row.pk} requested: it has no orphan left to end."


def _return_intent_settle(row: DefragJob, *, current: dict | None, gateway: kube.KubeGateway, now: datetime,
                          by: str, enqueue: bool) -> _IntentSettled | None:
    """Say and record what became of a return to service that stopped between its intent
    and its record (its process was killed, or its patch's answer was lost).

    Call inside a transaction, with the job's row locked (`select_for_update`) and the node
    (`current`, None when gone) read under that lock: a return to service holds the same
    lock from its patch to its record, so an intent seen here is not one under way past
    its patch. A schedulable node was uncordoned by it: its audit entry is written now,
    once (the intent is cleared with it), under its own operator and cause, with the
    abort it would have asked for. A cordoned node was not: the intent lapses, nothing is
    audited as changed. `by` names who records it (for the log)."""
    if row.return_intent_at is None:
        return None
    node, user, label, at = row.node_name, row.return_intent_by, row.return_intent_label, row.return_intent_at
    earlier = f"an earlier return to service (by {_who(user, label)} at {_stamp(at)})"
    cordoned = bool(((current or {}).get("spec") or {}).get("unschedulable"))
    if current is None:
        message = (f"Node {node} is gone: {earlier} stopped before it was recorded, and whether it uncordoned the "
                   f"node first is not known; nothing is recorded as changed.")
    elif cordoned:
        message = (f"{earlier[0].upper()}{earlier[1:]} had not uncordoned node {node}: nothing was changed by it "
                   f"(it stopped before its uncordon, or a newer one took it over).")
    else:
        message = f"Node {node} was uncordoned by {earlier} that was interrupted before it was recorded; recorded now."
        asks_abort = row.state in ENDED_BY_RETURN and not defrag_job_holding_reason(row)
        if asks_abort:
            message += _abort_asked_text(row, defrag_job_live_orphans(job=row))
        # The entry is dated when the uncordon was asked for (and sent), and written under
        # whoever asked, as that return to service would have written it.
        with acting_as(label):
            _audit(row, now=at, actor=user, action="node_return_to_service", target=f"Node/{node}",
                   cause=f"{row.return_intent_cause}; recorded after an interruption (its process stopped before "
                         f"recording it)", old={"unschedulable": True}, new={"unschedulable": False})
        _log_write(row.pk, [f"{message} (recorded by {by})"])
        _event(gateway, row, _node_ref(row, current), reason="DefragReturnToService", message=message, now=now)
        _return_intent_clear(row)
        if asks_abort:
            DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome=NODE_RETURNED)
            with acting_as(label):
                defrag_job_abort(job=row, actor=user, now=now, enqueue=enqueue)
        return _IntentSettled(message=message, recorded=True, abort_requested=asks_abort)
    _log_write(row.pk, [message])
    _return_intent_clear(row)
    return _IntentSettled(message=message, recorded=False, abort_requested=False)


def defrag_return_intents_settle(*, now: datetime, gateway: kube.KubeGateway | None = None,
                                 enqueue: bool = True) -> list[int]:
    """The resume beat's part in returns to service: settle each intent one left behind
    (`_return_intent_settle`) without waiting for the operator's next return to service,
    so its audit entry is written and the abort it asked for ends the orphans. An intent on
    a node still cordoned is left to its own process for RETURN_INTENT_LAPSE_SECONDS first.
    Returns the ids of the jobs settled. A job a return to service holds now is skipped
    (its row is locked): the next beat looks again."""
    settled = []
    for job_id in DefragJob.objects.filter(return_intent_at__isnull=False).order_by("pk").values_list("pk", flat=True):
        try:
            with transaction.atomic():
                row = (DefragJob.objects.select_for_update(skip_locked=True)
                       .filter(pk=job_id, return_intent_at__isnull=False).first())
                if row is None:
                    continue
                cluster_gateway = _gateway(row, gateway)
                try:
                    current = cluster_gateway.get(kube.NODES, row.node_name)
                except NotFound:
                    current = None
                cordoned = bool(((current or {}).get("spec") or {}).get("unschedulable"))
                if cordoned and now < row.return_intent_at + timedelta(seconds=RETURN_INTENT_LAPSE_SECONDS):
                    continue
                _return_intent_settle(row, current=current, gateway=cluster_gateway, now=now, by="the resume beat",
                                      enqueue=enqueue)
                settled.append(row.pk)
        except KubeError as exc:
            log.warning("defrag job %s: return to service intent not settled now (%s); the next beat tries again",
                        job_id, exc)
    return settled


def _already_schedulable(row: DefragJob, *, node: str, actor, now: datetime, enqueue: bool,
                         settled: _IntentSettled | None) -> ReturnToService:
    """The node takes pods already: by kubectl, or by an earlier return to service (then
    `settled` says so and has asked its abort). Its orphans must still end, or they hold
    their GPUs for good."""
    if settled is not None and settled.recorded:
        return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=settled.abort_requested,
                               message=settled.message)
    orphans = defrag_job_live_orphans(job=row)
    message = f"Node {node} was already schedulable; nothing to uncordon."
    if defrag_job_holding_reason(row) or not (row.state in ENDED_BY_RETURN and orphans):
        return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=False,
                               message=message + " Nothing changed.")
    message += _abort_asked_text(row, orphans)
    _log_write(row.pk, [f"{message} (by {_who(actor, actor_label_current())})"])
    DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome="already schedulable")
    defrag_job_abort(job=row, actor=actor, now=now, enqueue=enqueue)
    return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=True, message=message)


def node_return_to_service(*, cluster: Cluster, node: str, actor, job: DefragJob | None = None,
                           gateway: kube.KubeGateway | None = None, now: datetime | None = None,
                           enqueue: bool = True) -> ReturnToService:
    """Uncordon a node a defrag job has held, once no job is acting on it.

    The job is `job`, else the node's live job, else its newest. Refused, changing
    nothing, when a live job is still acting on the node (or has a request pending), when
    no defrag job ever held it (the product does not undo a cordon it never had a part
    in), or when the node is gone. A node already schedulable is left alone (idempotent).
    A safe, blocked or failed job still tracking orphans is asked to abort as well. Needs
    `capacity.return_to_service_defragjob` when `actor` is a user.

    Durable in two transactions, both under the job's row lock: the first decides and
    commits the intent (who, when, the cause); the second re-reads the node, patches it,
    and writes the audit entry, log, Event and abort request with the intent cleared. A
    process killed between the patch and that record leaves the intent: the next return to
    service of the node, or the resume beat, records the uncordon then, once.
    """
    now = now or clock.now()
    if actor is not None and not actor.has_perm("capacity.return_to_service_defragjob"):
        raise DefragError(f"user {actor} may not return nodes to service (needs "
                          f"capacity.return_to_service_defragjob)")
    if job is not None and (job.cluster_id != cluster.pk or job.node_name != node):
        raise DefragError(f"defrag job #{job.pk} is for node {job.node_name!r} of cluster {job.cluster.name!r}, "
                          f"not {node!r} of {cluster.name!r}")
    gateway = _gateway(cluster, gateway)
    who = _who(actor, actor_label_current())
    gone = f"node {node!r} is gone from cluster {cluster.name!r}: nothing to return to service"
    owner = _return_intent_owner()
    with transaction.atomic():
        live = DefragJob.objects.select_for_update().filter(cluster=cluster, node_name=node,
                                                            state__in=LIVE_STATES).first()
        if live is not None and job is not None and live.pk != job.pk:
            raise DefragError(f"node {node!r} is now held by defrag job #{live.pk} ({live.state}): return it to "
                              f"service from that job")
        row = live or (DefragJob.objects.select_for_update().get(pk=job.pk) if job is not None else
                       DefragJob.objects.filter(cluster=cluster, node_name=node).order_by("-created_at", "-pk")
                       .select_for_update().first())
        try:
            current = gateway.get(kube.NODES, node)
        except NotFound:
            raise DefragError(gone) from None
        cordoned = bool((current.get("spec") or {}).get("unschedulable"))
        if row is None:
            if not cordoned:
                raise DefragError(f"node {node!r} is schedulable and no defrag job has held it on cluster "
                                  f"{cluster.name!r}: nothing to return to service")
            raise DefragError(f"no defrag job has held node {node!r} on cluster {cluster.name!r}: its cordon is not "
                              f"the product's to undo (kubectl uncordon {node}, if it is meant)")
        if not cordoned:
            settled = _return_intent_settle(row, current=current, gateway=gateway, now=now, by=who, enqueue=enqueue)
            return _already_schedulable(row, node=node, actor=actor, now=now, enqueue=enqueue, settled=settled)
        holding = defrag_job_holding_reason(row)
        if holding:
            raise DefragError(f"node {node!r} is not returned to service: {holding}. Wait until the job rests "
                              f"(safe, failed, drained, aborted) and try again")
        # An intent left on a cordoned node did nothing: it lapses (logged), and ours replaces it.
        lapsed = _return_intent_settle(row, current=current, gateway=gateway, now=now, by=who, enqueue=enqueue)
        # IMPORTANT: the intent is committed before the patch, so a process killed right after
        # the patch leaves a record of whose uncordon it was.
        DefragJob.objects.filter(pk=row.pk).update(
            return_intent_at=now, return_intent_by=actor, return_intent_label="" if actor else actor_label_current(),
            return_intent_cause=f"returned to service by an operator; defrag job #{row.pk} was {row.state}",
            return_intent_owner=owner)
    refusal = ""
    with transaction.atomic():
        row = DefragJob.objects.select_for_update().get(pk=row.pk)
        if row.return_intent_owner != owner:
            # Settled or taken over meanwhile: the patch is not this call's to send any more.
            if row.return_intent_at is not None:
                message = (f"Nothing was done by this return to service of node {node}: a newer one (by "
                           f"{_who(row.return_intent_by, row.return_intent_label)} at {_stamp(row.return_intent_at)}) "
                           f"took it over.")
            else:
                message = (f"Nothing was done by this return to service of node {node}: it was settled by another "
                           f"meanwhile (see defrag job #{row.pk}'s log).")
            return ReturnToService(node=node, job_id=row.pk, uncordoned=False, abort_requested=False, message=message)
        # IMPORTANT: the node is re-read under the job's row lock, right before the patch.
        try:
            current = gateway.get(kube.NODES, node)
        except NotFound:
            current = None
        holding = defrag_job_holding_reason(row)
        if current is None or holding or not (current.get("spec") or {}).get("unschedulable"):
            _return_intent_clear(row)
            if current is not None and not holding:
                return _already_schedulable(row, node=node, actor=actor, now=now, enqueue=enqueue, settled=None)
            refusal = gone if current is None else (
                f"node {node!r} is not returned to service: {holding} (since this return to service was asked). "
                f"Wait until the job rests (safe, failed, drained, aborted) and try again")
        else:
            try:
                gateway.patch(kube.NODES, node, {"spec": {"unschedulable": False}}, patch_type="strategic")
            except NotFound:
                _return_intent_clear(row)
                refusal = gone
            except KubeError as exc:
                # The answer is lost, not necessarily the patch: the intent stays (this
                # transaction writes nothing), and whoever next finds it records what happened.
                raise ReturnUnconfirmed(
                    f"the uncordon of node {node!r} was sent, but its outcome is not known ({exc}). If it took "
                    f"effect, the resume beat records it within {RESUME_PROMISE} (or the next return to service "
                    f"does); if not, the node stays cordoned: return it to service again") from None
            else:
                return _uncordon_record(row, node=node, current=current, actor=actor, who=who, gateway=gateway,
                                        now=now, enqueue=enqueue, lapsed=lapsed)
    raise DefragError(refusal)


def _uncordon_record(row: DefragJob, *, node: str, current: dict, actor, who: str, gateway: kube.KubeGateway,
                     now: datetime, enqueue: bool, lapsed: _IntentSettled | None) -> ReturnToService:
    """What a return to service did, recorded in the transaction of its patch, with its
    intent cleared: the audit entry, the log, an Event, the abort it asks for."""
    orphans = defrag_job_live_orphans(job=row)
    asks_abort = row.state in ENDED_BY_RETURN
    _audit(row, now=now, actor=actor, action="node_return_to_service", target=f"Node/{node}",
           cause=row.return_intent_cause, old={"unschedulable": True}, new={"unschedulable": False})
    message = f"Node {node} uncordoned: it takes new pods again."
    if row.state == JobState.ABORT_STUCK and orphans:
        message += (f" Defrag job #{row.pk} still keeps {orphans} orphan(s) serving on it and checks them again "
                    f"every {seconds_text(settings.CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS)}: each ends once its "
                    f"revision is scaled to zero or its replacements are ready.")
    elif asks_abort:
        message += _abort_asked_text(row, orphans)
    if lapsed is not None:
        message += f" {lapsed.message}"
    _log_write(row.pk, [f"{message} (by {who})"])
    _event(gateway, row, _node_ref(row, current), reason="DefragReturnToService", message=message, now=now)
    _return_intent_clear(row)
    if asks_abort:
        DefragJob.objects.filter(pk=row.pk, abort_node_outcome="").update(abort_node_outcome=NODE_RETURNED)
        defrag_job_abort(job=row, actor=actor, now=now, enqueue=enqueue)
    return ReturnToService(node=node, job_id=row.pk, uncordoned=True, abort_requested=asks_abort, message=message)
