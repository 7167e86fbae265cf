"""Defrag jobs (empty a GPU node safely): the job, its per-revision records, the pods it
orphaned (its audit entries live in the audit trail, subject "defrag_job").

A job's `state` is the step it has reached; every side effect is recorded here before the
job moves on, so a restarted worker resumes from the recorded step (see `capacity.defrag.services`).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models

from config.actors import actor_label_current


class JobState(models.TextChoices):
    CONFIRMED = "confirmed", "confirmed (not started)"
    RECORDED = "recorded", "scales recorded"
    CORDONED = "cordoned", "node cordoned"
    WAITING = "waiting", "pods orphaned, waiting for replacements"
    SAFE = "safe", "safe to defrag/remove node"
    BLOCKED = "blocked", "models moved, other pods still block the node"
    FAILED = "failed", "failed (node stays cordoned, orphans keep serving)"
    DRAINING = "draining", "draining"
    DRAINED = "drained", "drained"
    ABORTING = "aborting", "aborting"
    ABORTED = "aborted", "aborted"
    ABORT_STUCK = "abort-stuck", "abort stuck (orphans kept: their replacements have no room)"


class AbortChoice(models.TextChoices):
    """What the operator chose for orphans an abort cannot end (their replacements have no room)."""
    WAIT = "", "wait until the deadline"
    KEEP = "keep", "keep the orphans serving"
    DELETE = "delete", "delete the orphans anyway"


# A live job holds its node (cordoned, or with orphans still tracked): one per node.
LIVE_STATES = (JobState.CONFIRMED, JobState.RECORDED, JobState.CORDONED, JobState.WAITING, JobState.SAFE,
               JobState.BLOCKED, JobState.FAILED, JobState.DRAINING, JobState.ABORTING, JobState.ABORT_STUCK)
# States in which a worker is (or should be) acting: these count against the cluster limit.
RUNNING_STATES = (JobState.CONFIRMED, JobState.RECORDED, JobState.CORDONED, JobState.WAITING,
                  JobState.DRAINING, JobState.ABORTING)
# States a step can make no progress from without an operator.
RESTING_STATES = (JobState.SAFE, JobState.BLOCKED, JobState.FAILED, JobState.DRAINED, JobState.ABORTED,
                  JobState.ABORT_STUCK)
# Final states: nothing is left to do or to track.
FINAL_STATES = (JobState.DRAINED, JobState.ABORTED)


class DefragJob(models.Model):
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="defrag_jobs",
                                help_text="The cluster the node belongs to.")
    node_name = models.CharField(max_length=253, help_text="The node to empty.")
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.CONFIRMED,
                             help_text="The step the job has reached; a restarted worker resumes from it.")
    report = models.JSONField(default=dict, blank=True,
                              help_text="The discovery report shown before confirmation (pods, revisions, blockers).")
    log_seq = models.PositiveIntegerField(
        default=0, help_text="Progress lines ever written: the sequence number of the newest (see DefragLogLine).")
    version = models.PositiveIntegerField(
        default=0, help_text="Bumped by every step's record: a step whose job changed under it re-reads and decides "
                             "again (compare-and-set).")
    error = models.TextField(blank=True, help_text="Why the job failed or is retrying, if it is.")
    timeout_seconds = models.PositiveIntegerField(
        default=1800, help_text="Seconds from start after which waiting fails the job (default 30 min).")
    poll_interval_seconds = models.FloatField(default=10.0,
                                              help_text="Seconds between checks of the revisions' scale.")
    cordoned_by_job = models.BooleanField(
        default=False, help_text="The job cordoned the node (it was schedulable before); abort uncordons only then.")
    uncordoned = models.BooleanField(default=False, help_text="Abort has uncordoned the node.")
    cordon_intent_at = models.DateTimeField(
        null=True, blank=True, help_text="Written before the cordon patch: a node schedulable at discovery and "
                                         "cordoned after this is the job's to uncordon, even if the worker died.")
    abort_node_outcome = models.CharField(
        max_length=40, blank=True, help_text="What abort did to the node: uncordoned, already schedulable, or left "
                                             "cordoned (it was cordoned before the job).")
    delete_node = models.BooleanField(default=False, help_text="Drain also deletes the Node object.")
    node_delete_intent_at = models.DateTimeField(
        null=True, blank=True, help_text="Written before the drain deletes the Node: a node gone after this was "
                                         "deleted by this job, even if the worker died or an abort came first.")
    return_intent_at = models.DateTimeField(
        null=True, blank=True, help_text="Written, and committed, before a return to service uncordons the node; "
                                         "cleared with its audit entry. Left set, its process stopped between the "
                                         "two: a node found schedulable was uncordoned by it (recorded then, under "
                                         "its operator), one still cordoned was not (it lapses).")
    return_intent_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+",
                                         help_text="The operator of that return to service (empty: the CLI).")
    return_intent_label = models.CharField(
        max_length=150, blank=True, help_text="Where that return to service was asked when not in the panel: "
                                              "cli:USER@HOST (the OS user and host).")
    return_intent_cause = models.CharField(
        max_length=200, blank=True, help_text="The cause its audit entry carries (the job's state when it was asked).")
    return_intent_owner = models.CharField(
        max_length=200, blank=True, help_text="The process carrying it out (host:pid:nonce): it uncordons only while "
                                              "the intent is still its own.")
    drain_requested_at = models.DateTimeField(null=True, blank=True,
                                              help_text="An operator asked for a drain; the next step honours it.")
    drain_requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                           on_delete=models.SET_NULL, related_name="+",
                                           help_text="Who asked for the drain (empty: the CLI).")
    abort_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="The newest abort request; the next step honours it, whatever it was doing.")
    abort_requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                           on_delete=models.SET_NULL, related_name="+",
                                           help_text="Who asked for the abort (empty: the CLI).")
    abort_choice = models.CharField(max_length=8, blank=True, choices=AbortChoice.choices, default=AbortChoice.WAIT,
                                    help_text="For orphans whose replacements have no room: wait until the "
                                              "deadline, keep them, or delete them anyway.")
    abort_started_at = models.DateTimeField(null=True, blank=True,
                                            help_text="When a step took up the newest abort request.")
    abort_deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="When an abort still waiting for room stops waiting (abort-stuck).")
    lease_owner = models.CharField(max_length=200, blank=True,
                                   help_text="The worker stepping the job now (host:pid:task); empty when none.")
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="The owner's lease ends here (at most a minute ahead); then any worker may "
                                         "take the job.")
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="The owner's last sign of life.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", help_text="The operator who confirmed the job.")
    requested_by_label = models.CharField(
        max_length=150, blank=True, default=actor_label_current, db_default="",
        help_text="Where the job was confirmed when not in the panel: cli:USER@HOST (the OS user and host).")
    operator = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+",
                                 help_text="The operator whose request the job carries out now (confirm, drain, abort).")
    created_at = models.DateTimeField(help_text="When the job was confirmed (the injected clock).")
    started_at = models.DateTimeField(null=True, blank=True,
                                      help_text="When the first side effect was made; the time limit counts from here.")
    safe_at = models.DateTimeField(null=True, blank=True, help_text="When the job saw every revision satisfied.")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When the job reached a final state.")
    next_check_at = models.DateTimeField(null=True, blank=True,
                                         help_text="Earliest time of the next check (retries back off here).")
    updated_at = models.DateTimeField(auto_now=True, help_text="Last write (a stale live job is resumed).")

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [
            ("drain_defragjob", "Can drain (evict and delete) a defragged node"),
            ("return_to_service_defragjob", "Can return a defragged node to service (uncordon it)"),
            # The dashboard and GPU map name orgs, models and nodes: more than staff status allows.
            ("view_cluster_contents", "Can view a cluster's contents (dashboard, GPU map)"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node_name"], condition=models.Q(state__in=LIVE_STATES),
                                    name="capacity_one_live_defrag_job_per_node"),
        ]

    def __str__(self) -> str:
        return f"defrag {self.node_name} ({self.cluster}) #{self.pk}: {self.state}"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def log(self) -> list[str]:
        """The kept progress lines, oldest first, with a marker where lines were dropped."""
        lines, previous = [], 0
        for seq, text in self.log_lines.values_list("seq", "text"):
            if seq > previous + 1:
                lines.append(f"… {seq - previous - 1} line(s) not kept …")
            lines.append(text)
            previous = seq
        return lines

    @property
    def abort_pending(self) -> bool:
        """An abort request no step has taken up yet."""
        return self.abort_requested_at is not None and (
            self.abort_started_at is None or self.abort_requested_at > self.abort_started_at)


class DefragLogLine(models.Model):
    """One progress line of a job, numbered. Only the first and the newest lines are kept
    (a day-long wait would otherwise grow without bound); the numbers let a follower see
    what it missed and never lose the end."""

    job = models.ForeignKey(DefragJob, on_delete=models.PROTECT, related_name="log_lines", help_text="The job.")
    seq = models.PositiveIntegerField(help_text="1 for the job's first line, then one more per line.")
    text = models.TextField(help_text="The line, as the CLI prints it.")

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="capacity_one_log_line_per_seq")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.text[:60]}"


class DefragRevision(models.Model):
    """Defrag step 2: what one revision looked like before the job touched anything."""

    job = models.ForeignKey(DefragJob, on_delete=models.PROTECT, related_name="revisions",
                            help_text="The job.")
    namespace = models.CharField(max_length=63, help_text="Namespace of the revision.")
    revision = models.CharField(max_length=253, help_text="Knative Revision (and PodAutoscaler) name.")
    replicaset = models.CharField(max_length=253, help_text="The ReplicaSet that owned the pods on the node.")
    initial_kpa_scale = models.IntegerField(help_text="PodAutoscaler status.actualScale before the job.")
    initial_replicas = models.IntegerField(help_text="ReplicaSet spec.replicas before the job.")
    overprovision = models.IntegerField(help_text="m: this revision's pods on the node (the over-provision count).")
    current_kpa_scale = models.IntegerField(null=True, blank=True, help_text="actualScale at the last check.")
    current_replicas = models.IntegerField(null=True, blank=True, help_text="ReplicaSet replicas at the last check.")
    satisfied = models.BooleanField(default=False, help_text="The safety condition (actualScale at least its target) held at the last check.")

    class Meta:
        ordering = ["namespace", "revision"]
        constraints = [models.UniqueConstraint(fields=["job", "namespace", "revision"],
                                               name="capacity_one_record_per_revision")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.revision}"


class OrphanState(models.TextChoices):
    PLANNED = "planned", "to orphan"
    ORPHANED = "orphaned", "orphaned (serving, owned by this job)"
    SKIPPED = "skipped", "not orphaned (changed or gone before the patch)"
    DELETING = "deleting", "eviction or deletion requested"
    GONE = "gone", "gone"


class OrphanEnd(models.TextChoices):
    """The request that ends an orphan: a drain evicts it (PodDisruptionBudgets honoured), an
    abort deletes it (uid precondition)."""
    EVICT = "evict", "eviction (drain)"
    DELETE = "delete", "deletion (abort)"


class DefragOrphan(models.Model):
    """A model pod the job orphaned: kept until the pod is confirmed gone (nothing else cleans it up)."""

    job = models.ForeignKey(DefragJob, on_delete=models.PROTECT, related_name="orphans", help_text="The job.")
    revision = models.ForeignKey(DefragRevision, on_delete=models.PROTECT, related_name="orphans",
                                 help_text="The revision the pod serves.")
    namespace = models.CharField(max_length=63, help_text="Pod namespace.")
    pod_name = models.CharField(max_length=253, help_text="Pod name.")
    uid = models.CharField(max_length=64, help_text="Pod UID: every write to the pod is guarded by it.")
    owner_references = models.JSONField(default=list, blank=True,
                                        help_text="The ownerReferences the patch removed (for the record).")
    template_hash = models.CharField(max_length=64, blank=True,
                                     help_text="The pod-template-hash label the patch removed.")
    gpus = models.IntegerField(default=0, help_text="GPUs the pod holds.")
    state = models.CharField(max_length=10, choices=OrphanState.choices, default=OrphanState.PLANNED,
                             help_text="Where the pod is in its life as an orphan.")
    orphaned_at = models.DateTimeField(null=True, blank=True, help_text="When the orphaning patch succeeded.")
    gone_at = models.DateTimeField(null=True, blank=True, help_text="When the pod was seen gone.")
    # One request at a time ends a pod, so one intent with its verb: a drain's eviction left
    # unrecorded and settled by a later abort is still recorded as the drain's eviction.
    end_intent = models.CharField(
        max_length=8, blank=True, choices=OrphanEnd.choices,
        help_text="Written, and committed, before the job evicts or deletes the pod; cleared with the record of "
                  "its outcome (or when the request is refused). Left set, the worker stopped in between: a pod "
                  "found gone or terminating was ended by it (recorded then, once, under its operator), one still "
                  "serving was not (the next pass decides again).")
    end_intent_at = models.DateTimeField(null=True, blank=True,
                                         help_text="When that eviction or deletion was about to be sent.")
    end_intent_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+",
                                      help_text="The operator whose drain or abort sent it (empty: the CLI).")
    end_intent_cause = models.TextField(
        blank=True, help_text="The cause its audit entry carries (why the job ends the pod).")

    class Meta:
        ordering = ["namespace", "pod_name"]
        constraints = [models.UniqueConstraint(fields=["job", "uid"], name="capacity_one_record_per_orphan")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name} ({self.state})"
