"""Pure decisions for defrag jobs: no ORM, no HTTP, no clock.

The rules are those of the defrag procedure the product automates (1 report the node's
pods, 2 record each revision's scales, 3 cordon, 4 orphan the model pods so their
ReplicaSets replace them elsewhere, 5 wait until each revision serves enough without
them) plus what `kubectl drain`, Karpenter and cluster-autoscaler honour
(shared/KUBERNETES.md).
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from clusters.labels import (
    DO_NOT_DISRUPT,
    GPU_PRODUCT_LABEL,
    MIRROR_ANNOTATION,
    REVISION_LABEL,
    SAFE_TO_EVICT,
    TEMPLATE_HASH_LABEL,
)
from clusters.snapshot import NodeView, PodView


class Role:
    MODEL = "model"      # a Knative revision's pod: the job orphans it
    IGNORED = "ignored"  # DaemonSet, mirror and finished pods: kubectl drain skips them too
    BLOCKER = "blocker"  # would be hurt by removing the node, or says so itself


@dataclass(frozen=True)
class PodEntry:
    namespace: str
    name: str
    uid: str
    gpus: int
    phase: str
    role: str
    reason: str
    owner_chain: tuple[str, ...]
    revision: str | None = None
    replicaset: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class RevisionScale:
    """What discovery read for one revision: PodAutoscaler actualScale and ReplicaSet replicas."""

    kpa_scale: int
    replicas: int


@dataclass(frozen=True)
class RevisionEntry:
    namespace: str
    revision: str
    replicaset: str
    kpa_scale: int
    replicas: int
    pods: tuple[str, ...]

    @property
    def overprovision(self) -> int:
        """`m` in the defrag report: how many of this revision's pods sit on the node."""
        return len(self.pods)


@dataclass(frozen=True)
class DefragPlan:
    node: str
    gpu_product: str
    unschedulable: bool
    pods: tuple[PodEntry, ...]
    revisions: tuple[RevisionEntry, ...]

    @property
    def model_pods(self) -> tuple[PodEntry, ...]:
        return tuple(p for p in self.pods if p.role == Role.MODEL)

    @property
    def blockers(self) -> tuple[PodEntry, ...]:
        return tuple(p for p in self.pods if p.role == Role.BLOCKER)

    @property
    def ignored(self) -> tuple[PodEntry, ...]:
        return tuple(p for p in self.pods if p.role == Role.IGNORED)

    @property
    def fingerprint(self) -> str:
        """What the report shows an operator to confirm, as a short digest: which pods, in
        which role, under which revision. Two readings of the node with one fingerprint
        would be reported alike (scales aside, which the job reads again when it starts)."""
        seen = sorted((p.uid, p.role, p.revision or "", p.reason) for p in self.pods)
        return hashlib.sha256(repr((self.node, self.unschedulable, seen)).encode()).hexdigest()[:16]

    def revision_of(self, pod: PodEntry) -> RevisionEntry | None:
        return next((r for r in self.revisions if r.namespace == pod.namespace and r.revision == pod.revision), None)

    def report_lines(self) -> list[str]:
        """The defrag procedure's report, then what it did not show: blockers and ignored pods."""
        lines = ["Found pods to defrag:"] if self.model_pods else [f"No model pods to defrag on {self.node}."]
        for pod in self.model_pods:
            rev = self.revision_of(pod)
            lines.append(f"\t{pod.key}")
            lines.append(f"\t\t- {pod.gpus}x {self.gpu_product or 'unknown'} GPUs")
            lines.append(f"\t\t- STATUS=[{pod.phase}] REPLICAS={rev.replicas if rev else '?'} "
                         f"KPA_SCALE={rev.kpa_scale if rev else '?'}")
        if self.blockers:
            lines.append("Blockers (the job will not move these; the node is not safe while they run):")
            lines.extend(f"\t{p.key} - {p.reason}" for p in self.blockers)
        if self.ignored:
            lines.append("Ignored: " + ", ".join(f"{p.key} ({p.reason})" for p in self.ignored))
        return lines

    def to_dict(self) -> dict:
        return {
            "node": self.node, "gpu_product": self.gpu_product, "unschedulable": self.unschedulable,
            "pods": [{"namespace": p.namespace, "name": p.name, "uid": p.uid, "gpus": p.gpus, "phase": p.phase,
                      "role": p.role, "reason": p.reason, "owner_chain": list(p.owner_chain),
                      "revision": p.revision, "replicaset": p.replicaset} for p in self.pods],
            "revisions": [{"namespace": r.namespace, "revision": r.revision, "replicaset": r.replicaset,
                           "kpa_scale": r.kpa_scale, "replicas": r.replicas, "pods": list(r.pods),
                           "overprovision": r.overprovision} for r in self.revisions],
            "lines": self.report_lines(),
        }


def _owner_chain(pod: PodView) -> tuple[str, ...]:
    owner = pod.controller
    if owner is None:
        return ()
    chain = [f"{owner.kind}/{owner.name}"]
    template_hash = pod.labels.get(TEMPLATE_HASH_LABEL)
    if owner.kind == "ReplicaSet" and template_hash and owner.name.endswith(f"-{template_hash}"):
        chain.append(f"Deployment/{owner.name[: -len(template_hash) - 1]}")
    if pod.labels.get(REVISION_LABEL):
        chain.append(f"Revision/{pod.labels[REVISION_LABEL]}")
    return tuple(chain)


def pod_classify(pod: PodView) -> tuple[str, str]:
    """(role, why) of a pod on the node being emptied."""
    owner = pod.controller
    if pod.annotations.get(MIRROR_ANNOTATION):
        return Role.IGNORED, "mirror pod"
    if owner is not None and owner.kind == "DaemonSet":
        return Role.IGNORED, "DaemonSet pod"
    if pod.phase in ("Succeeded", "Failed"):
        return Role.IGNORED, f"finished ({pod.phase})"
    if pod.terminating:
        return Role.IGNORED, "already terminating"
    if pod.annotations.get(DO_NOT_DISRUPT) == "true":
        return Role.BLOCKER, f'{DO_NOT_DISRUPT}: "true"'
    if pod.annotations.get(SAFE_TO_EVICT) == "false":
        return Role.BLOCKER, f'{SAFE_TO_EVICT}: "false"'
    if owner is None:
        return Role.BLOCKER, "bare pod (no controller would replace it)"
    if owner.kind == "ReplicaSet" and pod.labels.get(REVISION_LABEL):
        if not pod.labels.get(TEMPLATE_HASH_LABEL):
            return Role.BLOCKER, f"no {TEMPLATE_HASH_LABEL} label: orphaning would not release it"
        return Role.MODEL, f"Knative revision {pod.labels[REVISION_LABEL]}"
    if owner.kind == "ReplicaSet":
        return Role.BLOCKER, "ReplicaSet pod outside Knative (no PodAutoscaler counts an orphan)"
    if owner.kind == "StatefulSet":
        return Role.BLOCKER, "StatefulSet pod (a notebook or stateful workload)"
    return Role.BLOCKER, f"owned by {owner.kind} {owner.name}"


def blockers_remaining(pods: Iterable[PodView], *, node: str, own_orphans: Collection[str]) -> list[str]:
    """Pods on `node` that still keep it unsafe once every revision is covered, as
    "ns/name (why)". The job's own orphans (by uid) are not blockers: they have no
    controller precisely because the job released them, and the job tracks them until
    they are gone (drain evicts them, abort deletes them). A model pod still under its
    ReplicaSet is one the job did not orphan (it landed after the report, or its revision
    had no PodAutoscaler): nothing covers it, so it blocks like any other."""
    blockers = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.node_name != node or pod.uid in own_orphans:
            continue
        role, why = pod_classify(pod)
        if role == Role.MODEL:
            blockers.append(f"{pod.namespace}/{pod.name} (model pod this job did not orphan: {why})")
        elif role == Role.BLOCKER:
            blockers.append(f"{pod.namespace}/{pod.name} ({why})")
    return blockers


def defrag_plan(*, node: NodeView, pods: Iterable[PodView],
                scales: Mapping[tuple[str, str], RevisionScale]) -> DefragPlan:
    """The discovery report of step 1: every pod on the node, and per revision its scales.

    `scales[(namespace, revision)]` holds what was read for each revision of a model pod;
    a model pod whose revision has no entry (no PodAutoscaler) becomes a blocker.
    """
    entries: list[PodEntry] = []
    by_revision: dict[tuple[str, str], list[PodEntry]] = {}
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.node_name != node.name:
            continue
        role, reason = pod_classify(pod)
        revision = pod.labels.get(REVISION_LABEL) if role == Role.MODEL else None
        if role == Role.MODEL and (pod.namespace, revision) not in scales:
            role, reason, revision = Role.BLOCKER, f"no PodAutoscaler found for revision {revision}", None
        entry = PodEntry(namespace=pod.namespace, name=pod.name, uid=pod.uid, gpus=pod.gpus, phase=pod.phase,
                         role=role, reason=reason, owner_chain=_owner_chain(pod), revision=revision,
                         replicaset=pod.controller.name if role == Role.MODEL else None)
        entries.append(entry)
        if role == Role.MODEL:
            by_revision.setdefault((pod.namespace, revision), []).append(entry)
    revisions = []
    for (namespace, revision), members in sorted(by_revision.items()):
        replicasets = {m.replicaset for m in members}
        if len(replicasets) != 1:
            # Two ReplicaSets for one revision means a rollout in flight; the RS count would lie.
            raise ValueError(f"revision {namespace}/{revision} has pods of several ReplicaSets on "
                             f"{node.name}: {sorted(replicasets)}; retry when the rollout is done")
        scale = scales[(namespace, revision)]
        revisions.append(RevisionEntry(namespace=namespace, revision=revision, replicaset=replicasets.pop(),
                                       kpa_scale=scale.kpa_scale, replicas=scale.replicas,
                                       pods=tuple(m.name for m in members)))
    return DefragPlan(node=node.name, gpu_product=node.labels.get(GPU_PRODUCT_LABEL, ""),
                      unschedulable=node.unschedulable, pods=tuple(entries), revisions=tuple(revisions))


def replicaset_ready_pods(pods: Iterable[Mapping], *, replicaset: str) -> int:
    """Pods (API dicts) the ReplicaSet itself controls that are Running, Ready and not
    terminating: what a revision serves without any orphan. Read from the pods, not from
    the ReplicaSet's `status.readyReplicas`, which still counts a just-released orphan
    until the ReplicaSet controller next syncs (abort right after orphaning)."""
    count = 0
    for pod in pods:
        owner = next((o for o in (pod.get("metadata") or {}).get("ownerReferences") or () if o.get("controller")),
                     None)
        if owner is None or owner.get("kind") != "ReplicaSet" or owner.get("name") != replicaset:
            continue
        count += pod_serving(pod)
    return count


def pod_serving(pod: Mapping) -> bool:
    """A pod (API dict) that serves: Running, Ready and not terminating."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (status.get("phase") == "Running" and not meta.get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()))


def revision_satisfied(*, current_kpa_scale: int, current_replicas: int, initial_replicas: int,
                       overprovision: int) -> bool:
    """Defrag step 5: the revision serves enough without the node's pods.

    The first condition covers a static or growing model, the second one that scaled down
    meanwhile (its ReplicaSet now wants fewer than it had).
    """
    return (current_kpa_scale >= initial_replicas + overprovision
            or current_kpa_scale >= current_replicas + overprovision)


def revision_asleep(*, desired_scale: int | None, current_replicas: int) -> bool:
    """The revision wants no pod at all: its autoscaler's desired scale is 0 and its ReplicaSet
    keeps none (scaled to zero by its owner, an org's dormancy or the idle-GPU pruner). It
    needs no replacement, so the orphans serve nothing the job must wait for, and nothing
    the job does may bring a pod back for it. An absent desired scale (not reported yet) is
    not 0: the autoscaler has said nothing."""
    return desired_scale == 0 and current_replicas == 0


def asleep_line(*, revision: str, orphans: Sequence[str], during_wait: bool) -> str:
    """The log line of a revision that went to zero: why it needs no replacement, and what
    becomes of its orphans."""
    when = "was scaled to zero during the wait" if during_wait else "is scaled to zero"
    return (f"Revision {revision} {when} (desired scale 0, replicas 0): no replacement needed; its orphan(s) "
            f"{', '.join(orphans) or 'none'} go with the drain or the abort")


def progress_line(*, revision: str, overprovision: int, current_kpa_scale: int, current_replicas: int,
                  initial_kpa_scale: int) -> str:
    """The defrag procedure's progress line, word for word."""
    return (f"Revision {revision} - {overprovision} extra needed - current_scale={current_kpa_scale} "
            f"replicas={current_replicas} initial_scale={initial_kpa_scale}")


def orphan_patch(*, uid: str, owner_references: list, has_template_hash: bool) -> list[dict]:
    """Step 4 as one JSON patch: the `test` ops make it fail (409/422) if the pod was
    replaced (uid) or its owners changed since it was read, so nothing is orphaned by mistake."""
    ops: list[dict] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
    if owner_references:
        ops.append({"op": "test", "path": "/metadata/ownerReferences", "value": owner_references})
        ops.append({"op": "remove", "path": "/metadata/ownerReferences"})
    if has_template_hash:
        # "/" in a label key is escaped as "~1" in a JSON pointer (RFC 6901); this key has none.
        ops.append({"op": "remove", "path": f"/metadata/labels/{TEMPLATE_HASH_LABEL}"})
    return ops


# ---- the job's log, the CLI's view of it, and the abort that cannot finish ---------------

# Progress lines kept per job: the first LOG_HEAD (the report and the first steps) and the
# newest LOG_TAIL (where it is now). A 30-minute wait at 1 s polls writes ~3,600 lines.
LOG_HEAD = 100
LOG_TAIL = 400


def log_lines_to_drop(*, log_seq: int, head: int = LOG_HEAD, tail: int = LOG_TAIL) -> tuple[int, int] | None:
    """The (first, last) sequence numbers to drop once the job has written `log_seq` lines,
    or None while everything fits. The head and the tail are always kept."""
    if log_seq <= head + tail:
        return None
    return head + 1, log_seq - tail


class LogFolder:
    """Folds repeated blocks of lines for a terminal, as lines stream in.

    A wait prints the same two lines every poll ("---", "Revision … current_scale=1 …");
    after the first copy of a block that repeats, the copies are counted and shown as one
    line "… ×N (the N line(s) above, N times in all)" when something new arrives or the
    job ends. Blocks up to `max_period` lines are recognised.
    """

    def __init__(self, max_period: int = 8):
        self.max_period = max_period
        self.recent: list[str] = []   # the lines printed, newest last (a window)
        self.period = 0               # >0: inside a repeat of the last `period` printed lines
        self.count = 1                # copies of the block seen, the printed one included
        self.partial: list[str] = []  # lines of the next copy seen so far

    def _printed(self, line: str) -> list[str]:
        self.recent = (self.recent + [line])[-2 * self.max_period:]
        return [line]

    def _close(self) -> list[str]:
        out = []
        if self.period and self.count > 1:
            out.append(f"… ×{self.count} (the {self.period} line(s) above, {self.count} times in all)")
        pending, self.partial, self.period, self.count = self.partial, [], 0, 1
        for line in pending:
            out.extend(self._printed(line))
        return out

    def feed(self, line: str) -> list[str]:
        """The lines to print now for one new line (often none, while a block repeats)."""
        if self.period:
            block = self.recent[-self.period:]
            if block[len(self.partial)] == line:
                self.partial.append(line)
                if len(self.partial) == self.period:
                    self.count += 1
                    self.partial = []
                return []
            return self._close() + self.feed(line)
        # Not in a repeat: does this line start a second copy of the block just printed?
        for period in range(1, min(self.max_period, len(self.recent)) + 1):
            if self.recent[-period] == line:
                self.period, self.partial = period, [line]
                if period == 1:
                    self.count, self.partial = 2, []
                return []
        return self._printed(line)

    def flush(self) -> list[str]:
        """The lines still held back (call when the job ends)."""
        return self._close()


def seconds_text(seconds: float) -> str:
    """A cadence as an operator reads it: whole minutes as minutes, the rest in seconds."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g}s"


def recheck_sentence(*, every_seconds: float) -> str:
    """What an abort-stuck job does on its own: said wherever the job is shown stuck."""
    return (f"Checked again every {seconds_text(every_seconds)}: an orphan that can end by then (its revision scaled "
            f"to zero, or its replacements ready) is deleted; the abort ends when none is left.")


def abort_stuck_message(*, node: str, waited_seconds: float, kept: Sequence[Mapping], cordoned: Sequence[Mapping],
                        chosen_keep: bool, recheck_seconds: float) -> str:
    """Why an abort cannot end its orphans, what holds the room, the operator's choice, and
    when the job looks again (it does on its own, every `recheck_seconds`).

    `kept`: per revision {"revision", "ready", "wanted", "orphans": [ns/name], "gpus", "pending": [(pod, why)]};
    `cordoned`: other cordoned nodes with free GPUs {"node", "free", "holder"} (holder: "defrag job #7 (safe)"
    or "an operator (no defrag job)").
    """
    parts = []
    for entry in kept:
        pending = "; ".join(f"{pod} is Pending ({why})" if why else f"{pod} is not ready yet"
                            for pod, why in entry["pending"]) or "no replacement pod exists yet"
        parts.append(f"revision {entry['revision']} has {entry['ready']}/{entry['wanted']} ready without its "
                     f"orphan(s) {', '.join(entry['orphans'])} ({entry['gpus']} GPU(s) on {node}): {pending}")
    room = [f"node {node} (its free GPUs are held by the orphans)"]
    room += [f"node {c['node']} ({c['free']} free GPU(s), cordoned by {c['holder']})" for c in cordoned]
    head = ("Abort stopped, orphans kept as the operator chose" if chosen_keep
            else f"Abort stuck after {waited_seconds:.0f}s: the replacements cannot become ready")
    lines = [f"{head}. " + ". ".join(parts) + ".",
             "The room they need: " + ", ".join(room) + "."]
    recheck = recheck_sentence(every_seconds=recheck_seconds)
    if chosen_keep:
        lines.append(f"The orphans keep serving and this job keeps tracking them (state abort-stuck). {recheck} "
                     f"Abort again to wait for room now, or delete them anyway.")
    else:
        # An Event's message is cut at 1,000 characters (services._abort_stuck): this stays short.
        lines.append(f"The orphans keep serving. {recheck} Or keep the orphans, or delete them anyway (capacity "
                     f"drops to the ready counts above): `manage.py defrag {node} --abort --keep-orphans` or "
                     f"`manage.py defrag {node} --abort --delete-orphans`.")
    return " ".join(lines)


def abort_terminating_message(*, waited_seconds: float, terminating: Sequence[str], recheck_seconds: float) -> str:
    """An abort whose orphans were deleted but have not gone yet (their grace period)."""
    return (f"Abort stuck after {waited_seconds:.0f}s: orphan(s) {', '.join(terminating) or '?'} were deleted but "
            f"are still terminating. The job keeps tracking them (state abort-stuck) and checks again every "
            f"{seconds_text(recheck_seconds)} until they are gone.")


def abort_recheck_line(*, ended: Sequence[tuple[str, str]], left: int, chosen_keep: bool) -> str:
    """What one check of an abort-stuck job found that changed: each orphan it ended or saw
    gone, and why; whether the abort can end now. `ended`: (ns/name, what became of it)."""
    line = "Checked again (abort-stuck): " + "; ".join(f"{pod} {what}" for pod, what in ended) + "."
    if chosen_keep and any(what.startswith("deleted") for _, what in ended):
        line += (" The operator chose to keep the orphans that cannot end; these could end (no replacement is "
                 "needed for them now), so they were deleted.")
    if left:
        line += f" {left} orphan(s) still tracked."
    else:
        line += " No orphan is left: the abort ends now."
    return line


def abort_recheck_counts_line(*, changed: Sequence[tuple[str, tuple[int, int], tuple[int, int]]]) -> str:
    """A check of an abort-stuck job that ended nothing but found a revision's ready count
    changed (a replacement became ready, or one stopped being): the stuck message is written
    again with the new counts. `changed`: (ns/revision, (ready, wanted) it said, (ready, wanted) now)."""
    return "Checked again (abort-stuck): " + "; ".join(
        f"revision {revision} has {ready}/{wanted} ready without its orphan(s) (was {was_ready}/{was_wanted})"
        for revision, (was_ready, was_wanted), (ready, wanted) in changed) + "; no orphan can end yet."


class EndSettle:
    """What became of an orphan's eviction or deletion whose worker stopped between sending
    it and recording it (its intent is still on the orphan)."""
    GONE = "gone"                # it went out, and the pod has finished terminating since
    TERMINATING = "terminating"  # it went out: the pod is in its grace period
    REPLACED = "replaced"        # the name now holds another pod: not the job's, no end recorded as done
    NOT_SENT = "not sent"        # the pod serves on: it never took effect (the job decides again)


def orphan_end_settle(*, orphan_uid: str, pod_uid: str | None, terminating: bool) -> str:
    """`pod_uid`: the uid of the pod now under the orphan's name, None when there is none."""
    if pod_uid is None:
        return EndSettle.GONE
    if pod_uid != orphan_uid:
        return EndSettle.REPLACED
    return EndSettle.TERMINATING if terminating else EndSettle.NOT_SENT


class OrphanEndChoice:
    """Whether an abort ends an orphan it finds serving, and on what grounds."""
    DELETE = "delete"    # its revision needs it no longer
    KEEP = "keep"        # its revision still needs it: the abort waits (or stops, abort-stuck)
    FORCE = "force"      # its revision still needs it, and the operator chose to delete anyway


@dataclass(frozen=True)
class OrphanEndDecision:
    choice: str
    why: str        # why it may be deleted, as the deletion's Event and audit cause say it ("" when kept)
    context: str    # what asked for the deletion: the abort, its later check, the operator's choice

    @property
    def keep(self) -> bool:
        return self.choice == OrphanEndChoice.KEEP


def orphan_end_decide(*, revision: str, ready: int, wanted: int, model_deleted: bool, asleep: bool,
                      force: bool, checked_again: bool) -> OrphanEndDecision:
    """What an abort does with an orphan still serving: `ready` pods of its revision's
    ReplicaSet are ready without it, `wanted` (its replicas; 0 once the model was deleted or
    the revision scaled to zero) are wanted. `force`: the operator chose to delete orphans
    even where capacity drops; `checked_again`: a later check of an abort-stuck job."""
    if model_deleted:
        why = "its model was deleted"
    elif asleep:
        # Nothing is kept or brought back for it: it sleeps as whoever scaled it chose.
        why = f"revision {revision} is scaled to zero, no replacement needed"
    else:
        why = "its revision is back to scale"
    context = "abort-stuck, checked again" if checked_again else "abort"
    if ready >= wanted:
        return OrphanEndDecision(choice=OrphanEndChoice.DELETE, why=why, context=context)
    if not force:
        return OrphanEndDecision(choice=OrphanEndChoice.KEEP, why="", context=context)
    return OrphanEndDecision(choice=OrphanEndChoice.FORCE, why=f"its revision has {ready}/{wanted} ready without it",
                             context="abort, operator chose to delete anyway")


def interval_validate(value, *, field: str, minimum: float, maximum: float, whole: bool = False) -> str | None:
    """None when `value` is a usable number of seconds, else the error naming `field`."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{field} must be a number of seconds, got {value!r}"
    if not math.isfinite(value):
        return f"{field} must be a finite number of seconds, got {value!r}"
    if whole and value != int(value):
        return f"{field} must be a whole number of seconds, got {value!r}"
    if not minimum <= value <= maximum:
        return f"{field} must be between {minimum:g} and {maximum:g} seconds, got {value!r}"
    return None


# ---- the next step of a job: decided from its record, then carried out -------------------

class Step:
    """What the next step of a job does; `services.defrag_job_step` carries it out."""
    TAKE_UP_ABORT = "take up abort"  # an operator's abort request, before anything else
    TAKE_UP_DRAIN = "take up drain"  # a drain request on a safe job
    NOT_DUE = "not due"              # the next check (or a retry) is later
    REST = "rest"                    # nothing to do without an operator
    RECORD = "record"                # step 2: record the scales
    CORDON = "cordon"                # step 3
    ORPHAN = "orphan"                # step 4
    CHECK = "check"                  # step 5: one check of every revision
    DRAIN = "drain"                  # evict the orphans, then delete the Node if asked
    ABORT = "abort"                  # undo the cordon, end the orphans, or stop as abort-stuck
    RECHECK = "recheck"              # an abort-stuck job, looked at again: end the orphans that can end now


_STATE_STEPS = {"confirmed": Step.RECORD, "recorded": Step.CORDON, "cordoned": Step.ORPHAN, "waiting": Step.CHECK,
                "draining": Step.DRAIN, "aborting": Step.ABORT}
_FINAL = ("drained", "aborted")


def defrag_step_decide(*, state: str, now: datetime, next_check_at: datetime | None, abort_pending: bool,
                       drain_requested: bool) -> str:
    """The next step of a job from its record: an operator's request wins over the job's own
    progress (an abort over everything but a finished job, a drain only on a safe job), and
    nothing happens before the job's next check."""
    if state in _FINAL:
        return Step.REST
    if abort_pending:
        return Step.TAKE_UP_ABORT
    if drain_requested and state == "safe":
        return Step.TAKE_UP_DRAIN
    if state == "abort-stuck":
        # Its orphans may end on their own terms later (revision scaled to zero, room freed):
        # it is looked at again when due, and rests in between. A job stuck before it had a
        # next check (None) is due now.
        return Step.RECHECK if next_check_at is None or now >= next_check_at else Step.REST
    step = _STATE_STEPS.get(state, Step.REST)
    if step != Step.REST and next_check_at is not None and now < next_check_at:
        return Step.NOT_DUE
    return step
