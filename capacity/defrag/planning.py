"""Pure decisions for defrag jobs: no ORM, no HTTP, no clock.

The rules are those of the defrag procedure the product automates (1 report the node's
pods, 2 record each revision's scales, 3 cordon, 4 orphan the model pods so their
ReplicaSets replace them elsewhere, 5 wait until each revision serves enough without
them) plus what `kubectl drain`, Karpenter and cluster-autoscaler honour
(shared/KUBERNETES.md).
"""
from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from clusters.labels import (
    DO_NOT_DISRUPT,
    GPU_PRODUCT_LABEL,
    MIRROR_ANNOTATION,
    NODE_POOL_LABELS,
    REVISION_LABEL,
    SAFE_TO_EVICT,
    TEMPLATE_HASH_LABEL,
)
from clusters.snapshot import ClusterSnapshot, NodeView, PodView


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
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
        if owner is None or owner.get("kind") != "ReplicaSet" or owner.get("name") != replicaset:
            continue
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()):
            count += 1
    return count


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


# ---- where to defrag: what emptying nodes frees, one after the other ---------------------
#
# A job on one node orphans its model pods; their ReplicaSets make replacements, which
# need room on other nodes of the same GPU product. So whether a node can be freed depends
# on the room left by the nodes freed before it: two half-full nodes can each be emptied
# into the other, but not both. The advice simulates the candidates in order over one
# snapshot, reserving the room each one's pods take, and says how many can be freed
# together and why the others cannot.
#
# Where a replacement lands is the cluster scheduler's choice, not ours, so the simulation
# places each pod where that scheduler would. kube-scheduler's NodeResourcesFit plugin
# scores the nodes that fit with one strategy (KubeSchedulerConfiguration
# `pluginConfig[NodeResourcesFit].args.scoringStrategy.type`):
#   - LeastAllocated, the default when nothing is configured (SetDefaults_NodeResourcesFitArgs
#     in kubernetes pkg/scheduler/apis/config/v1/defaults.go): the node with the most room
#     left wins, so a pod spreads onto the emptiest node that fits. An empty node beats any
#     partly used node of its size: emptying a node then fills another one and frees nothing.
#   - MostAllocated, or RequestedToCapacityRatio shaped to favour full nodes: the
#     bin-packing strategies of the "Resource Bin Packing" page (kubernetes.io/docs/concepts/
#     configuration/resource-bin-packing/); the fullest node that fits wins.
# The default scores cpu and memory (weight 1 each), not GPUs; on GPU nodes a model pod's
# cpu and memory follow its GPUs, so GPU allocation is what the simulation scores. Among
# equal scores kube-scheduler picks one at random: the simulation then assumes the empty
# node (the replacement *may* land there, and the advice must not promise a free node).
#
# Under MostAllocated, room is the free GPUs of Ready, schedulable, non-empty nodes that no
# defrag job holds, and pods go largest first onto the fullest node that fits (best fit).
# An empty node is never room: a whole free node is what defrag makes, and filling one to
# free another only moves the fragment. Under LeastAllocated the empty nodes are room too,
# since the scheduler will use them: a candidate any of whose pods would go to an empty
# node frees no net node, and the advice says so and what the operator can do about it.

class Scoring:
    """The cluster scheduler's NodeResourcesFit scoring strategy, as kube-scheduler names it."""
    LEAST_ALLOCATED = "LeastAllocated"   # kube-scheduler's default: spread
    MOST_ALLOCATED = "MostAllocated"     # bin-packing
    ALL = (LEAST_ALLOCATED, MOST_ALLOCATED)


def scoring_check(value: str) -> str:
    """The scoring strategy, or ValueError naming the setting and the values it takes."""
    if value not in Scoring.ALL:
        raise ValueError(f"CAPACITY_SCHEDULER_SCORING must be one of {', '.join(Scoring.ALL)} (the cluster "
                         f"scheduler's NodeResourcesFit scoringStrategy type), not {value!r}")
    return value


class Freeing:
    """What emptying a candidate node does, given the ones freed before it."""
    TOGETHER = "together"        # freed, with every node before it freed too
    CONTENDED = "contended"      # could be freed alone, but needs room the nodes before it use
    FILLS_EMPTY = "fills-empty"  # the scheduler would put its pods on an empty node: nothing freed
    NEEDS_EMPTY = "needs-empty"  # its pods fit only if an empty node takes them
    NO_ROOM = "no-room"          # its pods fit nowhere, not even on empty nodes


_FREEING_ORDER = {Freeing.TOGETHER: 0, Freeing.CONTENDED: 1, Freeing.FILLS_EMPTY: 2, Freeing.NEEDS_EMPTY: 3,
                  Freeing.NO_ROOM: 4}


def node_pool(node: NodeView) -> str:
    return next((node.labels[k] for k in NODE_POOL_LABELS if node.labels.get(k)),
                node.labels.get(GPU_PRODUCT_LABEL, "default"))


@dataclass(frozen=True)
class Move:
    """One pod's GPUs, placed on a node by the simulation (`pod` is ns/name; a replacement
    made for a pod moved from an earlier node is named after the pod it replaces)."""
    pod: str
    gpus: int
    to: str


@dataclass(frozen=True)
class FreeingStep:
    node: str
    pool: str
    gpu_product: str
    gpus_moved: int          # GPUs of the pods that would move (the node's own, and replacements it received)
    pods_moved: int
    outcome: str             # a `Freeing` value
    why: str
    moves: tuple[Move, ...] = ()   # where its pods go (TOGETHER only)
    position: int | None = None    # 1.. within the nodes freed together (TOGETHER only)

    @property
    def frees_whole_node(self) -> bool:
        return self.outcome == Freeing.TOGETHER

    @property
    def outcome_label(self) -> str:
        if self.outcome == Freeing.TOGETHER:
            return f"frees a whole node (#{self.position} together)"
        return {Freeing.CONTENDED: "instead of an earlier one, not as well",
                Freeing.FILLS_EMPTY: "frees nothing: its pods would fill an empty node",
                Freeing.NEEDS_EMPTY: "only by using an empty node",
                Freeing.NO_ROOM: "no room for its pods"}[self.outcome]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class DefragAdvice:
    steps: tuple[FreeingStep, ...]   # freed together first (in order), then the rest
    scoring: str = Scoring.LEAST_ALLOCATED   # the scheduler scoring the simulation assumed

    def count(self, outcome: str) -> int:
        return sum(1 for s in self.steps if s.outcome == outcome)

    def only(self, keep: Collection[str]) -> "DefragAdvice":
        """The same steps, limited to the named nodes (a pool's): the simulation stays the
        cluster's, since replacements may land in any pool of the GPU product."""
        return DefragAdvice(steps=tuple(s for s in self.steps if s.node in keep), scoring=self.scoring)

    @property
    def summary(self) -> str:
        if not self.steps:
            return "No node to empty: every GPU node is empty, cordoned, held by a defrag job or blocked."
        together, contended = self.count(Freeing.TOGETHER), self.count(Freeing.CONTENDED)
        fills_empty = self.count(Freeing.FILLS_EMPTY)
        needs_empty, no_room = self.count(Freeing.NEEDS_EMPTY), self.count(Freeing.NO_ROOM)
        if together == 0:
            parts = ["No node can be emptied into the free GPUs of other non-empty nodes"]
        elif together == 1:
            parts = ["1 node can be freed"]
        else:
            parts = [f"{together} nodes can be freed together"]
        if contended:
            first = "the first one uses" if together == 1 else "the first ones use"
            parts.append(f"the next {contended} each need the room {first}" if contended > 1
                         else f"1 more needs the room {first}")
        if fills_empty:
            parts.append(f"{fills_empty} would only move {'its' if fills_empty == 1 else 'their'} pods onto an "
                         f"empty node under the scheduler's {self.scoring} scoring (no whole node freed)")
        if needs_empty:
            parts.append(f"{needs_empty} cannot be freed without using an empty node")
        if no_room:
            parts.append(f"{no_room} cannot be freed at all (no room for "
                         f"{'its' if no_room == 1 else 'their'} pods, even on empty nodes)")
        return "; ".join(parts) + "."


class _Room:
    """Free GPUs per node, kept sorted as (free GPUs, rank, node), and where the scheduler
    would place a pod in it. Among nodes with the same free GPUs the lowest rank is filled
    first: (under LeastAllocated, empty nodes: see above), nodes that are no candidate, then
    candidates tried last, so the pods of one freed node do not land on the next one to be
    freed (moving them twice). Under LeastAllocated the score depends on the node's size, so
    the room is kept sorted per size (a GPU product has few); under MostAllocated as one list
    (best fit on free GPUs, as before sizes mattered). Changed in place: a fleet of 5,000
    nodes is not copied per node."""

    NOT_A_CANDIDATE = -(10 ** 9)
    EMPTY = NOT_A_CANDIDATE - 1

    def __init__(self, entries: Iterable[tuple[int, int, str]], *, scoring: str, size: Mapping[str, int]):
        self.scoring, self.size = scoring, size
        self.entry = {e[2]: e for e in entries}    # every node in the room, full ones too
        self.groups: dict[int | None, list[tuple[int, int, str]]] = {}
        for e in sorted(e for e in self.entry.values() if e[0] > 0):
            self.groups.setdefault(self._group(e[2]), []).append(e)

    def _group(self, node: str) -> int | None:
        return self.size[node] if self.scoring == Scoring.LEAST_ALLOCATED else None

    def take(self, node: str) -> tuple[int, int, str] | None:
        """Take the node out (it is being freed, or it is the one whose pods look for room)."""
        entry = self.entry.pop(node, None)
        if entry is not None and entry[0] > 0:
            items = self.groups[self._group(node)]
            del items[bisect_left(items, entry)]
        return entry

    def put(self, entry: tuple[int, int, str] | None) -> None:
        if entry is not None:
            self.entry[entry[2]] = entry
            if entry[0] > 0:
                insort(self.groups.setdefault(self._group(entry[2]), []), entry)

    def _pick(self, gpus: int) -> tuple[int, int, str] | None:
        if self.scoring == Scoring.MOST_ALLOCATED:
            items = self.groups.get(None, [])
            at = bisect_left(items, (gpus, -float("inf"), ""))
            return items[at] if at < len(items) else None
        # LeastAllocated: per size, the node with the most free GPUs (lowest rank among
        # equals); across sizes the highest share left free once the pod is placed.
        best, best_key = None, None
        for size, items in self.groups.items():
            if not items or items[-1][0] < gpus:
                continue
            entry = items[bisect_left(items, (items[-1][0], -float("inf"), ""))]
            left = entry[0] - gpus
            if best is None or left * best_key[1] > best_key[0] * size or \
                    (left * best_key[1] == best_key[0] * size and entry[1:] < best[1:]):
                best, best_key = entry, (left, size)
        return best

    def place(self, requests: Sequence[tuple[str, int]]) -> list[Move] | None:
        """Largest pod first, each where the scheduler would put it: the moves (their room
        taken), or None (the room as it was)."""
        moves: list[Move] = []
        for pod, gpus in sorted(requests, key=lambda r: (-r[1], r[0])):
            entry = self._pick(gpus)
            if entry is None:
                self.give_back(moves)
                return None
            self.take(entry[2])
            free, rank, node = entry
            self.put((free - gpus, rank, node))
            moves.append(Move(pod=pod, gpus=gpus, to=node))
        return moves

    def give_back(self, moves: Sequence[Move]) -> None:
        for move in reversed(moves):
            free, rank, node = self.take(move.to)
            self.put((free + move.gpus, rank, node))

    @property
    def spare(self) -> str:
        frees = [e[0] for items in self.groups.values() for e in items]
        return f"other non-empty nodes have {sum(frees)} free GPU(s), at most {max(frees, default=0)} on one"


def _where(moves: Iterable[Move]) -> str:
    per_node: dict[str, int] = {}
    for move in moves:
        per_node[move.to] = per_node.get(move.to, 0) + move.gpus
    return ", ".join(f"{node} ({_plural(gpus, 'GPU', 'GPUs')})" for node, gpus in per_node.items())


def _gpus(requests: Iterable[tuple[str, int]]) -> int:
    return sum(gpus for _, gpus in requests)


def _gpu_count(requests: Iterable[tuple[str, int]]) -> str:
    return _plural(_gpus(requests), "GPU", "GPUs")


def _names(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _fills_empty_why(*, moves: Sequence[Move], empty_names: Collection[str], scoring: str, empties: Sequence[str],
                     instead: Sequence[Move] | None, before: str = "") -> str:
    """What the operator reads when the scheduler would fill an empty node, and what to do."""
    onto = [m for m in moves if m.to in empty_names]
    nodes = {m.to for m in onto}
    why = (f"{before}its {'pod' if len(onto) == 1 else 'pods'} would go to empty "
           f"{'node' if len(nodes) == 1 else 'nodes'} {_where(onto)} under the scheduler's {scoring} scoring "
           "(kube-scheduler's default spreads onto the emptiest node): no whole node freed. To free it, set the "
           "scheduler's NodeResourcesFit scoringStrategy to MostAllocated (and CAPACITY_SCHEDULER_SCORING="
           f"MostAllocated here), or cordon the {'empty node' if len(empties) == 1 else f'{len(empties)} empty nodes'} "
           f"{_names(empties)} while the job runs and return {'it' if len(empties) == 1 else 'them'} to service "
           "after")
    if instead:
        why += f"; then its pods would go to {_where(instead)}"
    return why


def defrag_advice(snapshot: ClusterSnapshot, *, held_nodes: Collection[str] = (),
                  scoring: str = Scoring.LEAST_ALLOCATED) -> DefragAdvice:
    """Which nodes emptying frees, simulated in order over one snapshot, each replacement
    placed where the cluster scheduler's `scoring` (a `Scoring` value) would put it.

    A candidate has GPU pods, is schedulable, is held by no defrag job and has no blocker
    (`pod_classify`, the rule the job itself applies). Candidates whose pods fit alone are
    tried fewest GPUs first (smaller first frees the most nodes out of the same room): each
    one freed takes the room its pods (and any replacements it received) are placed in, and
    stops being room itself (the job cordons it).
    """
    scoring = scoring_check(scoring)
    spread = scoring == Scoring.LEAST_ALLOCATED
    gpu_nodes = sorted((n for n in snapshot.nodes if n.gpus_allocatable > 0), key=lambda n: n.name)
    used = {n.name: snapshot.gpus_requested(n.name) for n in gpu_nodes}
    size = {n.name: n.gpus_allocatable for n in gpu_nodes}
    by_product: dict[str, list[NodeView]] = {}
    for node in gpu_nodes:
        by_product.setdefault(node.labels.get(GPU_PRODUCT_LABEL, ""), []).append(node)
    steps: list[FreeingStep] = []
    for product, nodes in sorted(by_product.items()):
        pool = {n.name: node_pool(n) for n in nodes}
        open_nodes = [n for n in nodes if not n.unschedulable and n.name not in held_nodes]
        own: dict[str, list[tuple[str, int]]] = {}
        for node in open_nodes:
            pods = [p for p in snapshot.pods_on(node.name) if p.live]
            if used[node.name] > 0 and not any(pod_classify(p)[0] == Role.BLOCKER for p in pods):
                own[node.name] = [(f"{p.namespace}/{p.name}", p.gpus) for p in pods if p.gpus > 0]
        order = sorted(own, key=lambda n: (_gpus(own[n]), len(own[n]), n))
        rank = {name: -i for i, name in enumerate(order)}
        partly_used = [(n.gpus_allocatable - used[n.name], rank.get(n.name, _Room.NOT_A_CANDIDATE), n.name)
                       for n in open_nodes if n.ready and 0 < used[n.name] < n.gpus_allocatable]
        empty_rank = _Room.EMPTY if spread else _Room.NOT_A_CANDIDATE
        empties = [(n.gpus_allocatable, empty_rank, n.name) for n in open_nodes if n.ready and used[n.name] == 0]
        empty_names = [name for _, _, name in empties]

        def step(name: str, outcome: str, why: str, requests, **extra) -> FreeingStep:
            return FreeingStep(node=name, pool=pool[name], gpu_product=product, gpus_moved=_gpus(requests),
                               pods_moved=len(requests), outcome=outcome, why=why, **extra)

        # Each candidate on its own: where its pods would go with every other node as it is
        # now; when they fit nowhere but on an empty node, that it needs one; and under
        # LeastAllocated, when the scheduler would prefer an empty node, that it frees nothing.
        alone: dict[str, list[Move] | None] = {}
        room = _Room(partly_used, scoring=scoring, size=size)
        with_empty = _Room(partly_used + empties, scoring=scoring, size=size)
        for name in order:
            mine, also_mine = room.take(name), with_empty.take(name)
            alone[name] = room.place(own[name])
            if alone[name] is not None:
                room.give_back(alone[name])
                if spread and empties:
                    chosen = with_empty.place(own[name])
                    with_empty.give_back(chosen or ())
                    if chosen and any(m.to in empty_names for m in chosen):
                        steps.append(step(name, Freeing.FILLS_EMPTY, _fills_empty_why(
                            moves=chosen, empty_names=empty_names, scoring=scoring, empties=empty_names,
                            instead=alone[name]), own[name]))
                        alone[name] = None
            else:
                spare = room.spare
                filled = with_empty.place(own[name])
                if filled is not None:
                    with_empty.give_back(filled)
                    steps.append(step(name, Freeing.NEEDS_EMPTY, "cannot be freed without using an empty node: "
                                      f"its pods need {_gpu_count(own[name])} ({spare}); they would go to "
                                      f"{_where(m for m in filled if m.to in empty_names)}", own[name]))
                else:
                    steps.append(step(name, Freeing.NO_ROOM, f"its pods need {_gpu_count(own[name])} and fit "
                                      f"nowhere, not even on an empty node ({spare})", own[name]))
            with_empty.put(also_mine)
            room.put(mine)

        # Then together, in order: a node freed takes the room its pods (and any
        # replacements it received) go to, and stops being room itself (the job cordons it).
        # Under LeastAllocated the scheduler sees the empty nodes too: once the nodes before
        # it took the partly used room, a later node's pods may go to an empty one instead.
        room = with_empty if spread else room
        position: dict[str, int] = {}                            # node freed -> its place in the order
        received: dict[str, list[tuple[str, int, str]]] = {}   # node -> (pod, GPUs, node it came from)
        for name in (n for n in order if alone[n] is not None):
            extra = received.get(name, [])
            requests = own[name] + [(pod, gpus) for pod, gpus, _ in extra]
            also = (f", {sum(g for _, g, _ in extra)} of them replacements from "
                    f"{', '.join(sorted({src for _, _, src in extra}))}" if extra else "")
            mine = room.take(name)
            moves = room.place(requests)
            before = (f"with the {_plural(len(position), 'node', 'nodes')} before it freed too, "
                      if position else "")
            if moves is not None and not any(m.to in empty_names for m in moves):
                position[name] = len(position) + 1
                for move in moves:
                    received.setdefault(move.to, []).append((move.pod, move.gpus, name))
                fit = "fits" if len(requests) == 1 else "fit"
                steps.append(step(name, Freeing.TOGETHER, f"{before}its {_plural(len(requests), 'pod', 'pods')} "
                                  f"({_gpu_count(requests)}{also}) {fit} on {_where(moves)}",
                                  requests, moves=tuple(moves), position=position[name]))
                continue
            if moves is not None:
                room.give_back(moves)
                room.put(mine)
                steps.append(step(name, Freeing.CONTENDED, _fills_empty_why(
                    moves=moves, empty_names=empty_names, scoring=scoring, empties=empty_names, instead=None,
                    before=f"on its own its pods ({_gpu_count(own[name])}) would fit on {_where(alone[name])}, "
                           f"but {before}"), own[name]))
                continue
            room.put(mine)
            targets = {m.to for m in alone[name]}
            # The nodes freed before it that are its room, or whose pods took its room.
            users = sorted({t for t in targets if t in position} | {src for t in targets
                                                                     for _, _, src in received.get(t, ())},
                           key=position.__getitem__)
            why = f"on its own its pods ({_gpu_count(own[name])}) would fit on {_where(alone[name])}, but "
            if users:
                why += (f"{', '.join(users)} (freed before it) {'uses' if len(users) == 1 else 'use'} that room: "
                        "it can be freed instead, not as well")
                if extra:
                    why += f"; it would also hold replacements from {', '.join(sorted({s for _, _, s in extra}))}"
            else:
                why += (f"with the nodes before it freed it also holds their replacements "
                        f"({_gpu_count(requests)}{also}) and no room is left for them all")
            steps.append(step(name, Freeing.CONTENDED, why, own[name]))
    steps.sort(key=lambda s: (_FREEING_ORDER[s.outcome], s.gpu_product, s.position or 0, s.gpus_moved,
                              s.pods_moved, s.node))
    return DefragAdvice(steps=tuple(steps), scoring=scoring)
