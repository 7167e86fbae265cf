"""The seeded chaos driver: scenarios, kills, aborts, fast-forward, invariants, summary.

One `random.Random(seed)` draws every choice (which node, drain or abort, when to kill,
pool process or whole worker, when the operator aborts, which org's activity races the
sweep, the simulated cluster's fault seed), so a failing run is replayed with its seed.
Kills and aborts land at wall-clock moments, so a replay meets the same choices but not
always the same interleaving: the seed and the scenario number are in every message.

Time: the workers and beat read the product clock through CLOCK_OFFSET_FILE. When a killed
job has not been stepped for a few seconds, the driver fast-forwards that clock (5 s of
product time every half second) instead of waiting out leases and beat periods for real;
gaps are measured in product time, so they read as production would see them.
"""
from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from capacity.defrag.services import LEASE_SECONDS, defrag_discover, defrag_job_abort, defrag_job_drain, \
    defrag_job_start
from audit.selectors import entries_filter, entries_of_subject
from capacity.defrag.models import FINAL_STATES, LIVE_STATES, RESTING_STATES, DefragJob, DefragOrphan, \
    JobState
from capacity.runbook.models import RunbookAction, ServedModel
from clusters.errors import KubeError
from clusters.labels import BINPACK_MARKER, DELETION_COST
from capacity.binpack.models import BinpackRun
from config import clock, queues
from config.schedule import SCHEDULES
from orgs.activity import org_activity_record
from orgs.models import DormancySwitch, Org
from pruning.models import PruneDecision, PruneRun
from tests.celery_workers import pool_children
from tests.prometheus_fixtures import PrometheusServer, Series, gpu_labels

from .world import MODEL_NS, NODES, ORG_KINDS, PRUNE_DEPLOYMENTS, PRUNE_NODE, RUNBOOK_MODEL, SERVICES, Kube, \
    org_slug, prune_ns, pynode_min_scale, runbook_ns, scenario_objects

WORKERS = ("w1", "w2")
RESUME_EVERY_S = next(p.every_seconds for p in SCHEDULES if p.task == "capacity.tasks.defrag_jobs_resume")
# How long a killed job may stay unstepped (product seconds). A pool process's message is
# redelivered at once and takes its own lease back: within one lease. A whole worker's
# unacknowledged message waits for the broker's visibility timeout, so the resume beat
# re-queues the job once its lease has run out: a lease plus one beat period, plus the
# fast-forward's 5 s step and a beat tick.
GAP_BOUND_S = {"pool": LEASE_SECONDS, "whole": LEASE_SECONDS + RESUME_EVERY_S + 10.0}
FORWARD_STEP_S = 5.0          # product seconds added per fast-forward tick
FORWARD_AFTER_WALL_S = 4.0    # wall seconds a killed job gets before time is fast-forwarded
PHASE_LIMIT_WALL_S = 150.0    # the longest any phase may take (wall seconds) before it is a violation
SWEEP_TASK = "orgs.tasks.dormancy_sweep"
BINPACK_TASK = "capacity.binpack.tasks.binpack_cluster"
PRUNE_TASK = "pruning.tasks.prune_cluster"
REGISTRY_TASK = "capacity.runbook.tasks.registry_sync_cluster"
BEAT_TASKS = ("capacity.tasks.defrag_jobs_resume", "orgs.tasks.scale_to_zero_retry",
              "orgs.tasks.scale_to_zero_reconcile", "clusters.tasks.discovery_refresh_all",
              "capacity.binpack.tasks.binpack_all_clusters", "pruning.tasks.prune_all_clusters",
              "pruning.tasks.prune_runs_reconcile", "capacity.runbook.tasks.registry_sync_all_clusters")
# The workers' pruner settings (test_chaos.py puts them in their environment): scale down for
# real, over a 10-minute idle window with no grace beyond it.
PRUNER_ENV = {"PRUNER_RUN_MODE": "scale-down", "PRUNER_DURATION_MINUTES": "10", "PRUNER_GRACE_SECONDS": "0"}
PRUNE_WINDOW_S = 600
# How far past the prune phase's start the GPU history reaches (product seconds): beyond any
# fast-forward a phase can do within PHASE_LIMIT_WALL_S.
PRUNE_HISTORY_AHEAD_S = 3 * 3600
PRESSES = 6   # how often the operator presses a panel button whose action failed before it counts as lost


class ChaosStuck(Exception):
    """A wait ran past its deadline: recorded as a violation, the scenario moves on."""


@dataclass
class Stats:
    seed: int
    scenarios: int = 0
    kills: Counter = field(default_factory=Counter)        # "pool" / "whole"
    aborts: int = 0
    drains: int = 0
    activities: int = 0
    prune_acted: int = 0     # scale-downs that took effect (decisions succeeded)
    restores: int = 0        # of those, restored from the panel
    runbook_actions: int = 0  # redeploys and unblocks done from the panel
    panel_presses: int = 0   # panel buttons pressed (a press a fault failed is pressed again)
    faults: Counter = field(default_factory=Counter)       # from simcluster's injected counts
    violations: list[str] = field(default_factory=list)
    gaps: dict = field(default_factory=lambda: {"pool": [], "whole": []})   # product seconds after a kill
    longest_span: float = 0.0    # first kill to next step, across back-to-back kills
    forwarded_s: float = 0.0
    wall_s: float = 0.0

    def table(self) -> str:
        def longest(kind):
            return f"{max(self.gaps[kind]):.1f} s (n={len(self.gaps[kind])})" if self.gaps[kind] else "-"
        rows = [
            ("seed", str(self.seed)),
            ("scenarios run", str(self.scenarios)),
            ("worker kills (pool process / whole worker)", f"{self.kills['pool']} / {self.kills['whole']}"),
            ("aborts sent / drains sent", f"{self.aborts} / {self.drains}"),
            ("activity racing the sweep", str(self.activities)),
            ("prune scale-downs acted / restored", f"{self.prune_acted} / {self.restores}"),
            ("runbook actions done (panel presses)", f"{self.runbook_actions} ({self.panel_presses})"),
            ("faults injected (5xx / 409 / 429 / watches cut)",
             f"{self.faults['internal_error']} / {self.faults['conflict']} / {self.faults['throttled']} / "
             f"{self.faults['watch_dropped']}"),
            ("requests delayed (latency)", str(self.faults["delayed"])),
            ("invariant violations", str(len(self.violations))),
            ("longest unstepped gap after a pool-process kill (bound)",
             f"{longest('pool')} ({GAP_BOUND_S['pool']:.0f} s)"),
            ("longest unstepped gap after a whole-worker kill (bound)",
             f"{longest('whole')} ({GAP_BOUND_S['whole']:.0f} s)"),
            ("longest unstepped span across back-to-back kills", f"{self.longest_span:.1f} s"),
            ("product time fast-forwarded", f"{self.forwarded_s:.0f} s"),
            ("wall time", f"{self.wall_s:.0f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)} | {v}" for k, v in rows]
        lines += [f"  violation: {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass
class PendingGap:
    """A job whose stepping process was killed, not stepped since. Another kill before it is
    stepped again (the worker that got its message, or the one that would run the resume)
    starts the bound again from that kill, and a whole-worker kill makes it a whole kill;
    `first_killed_at` keeps the whole unstepped span."""
    kind: str
    job_id: int
    killed_at: object        # product time of the latest kill
    killed_wall: float
    first_killed_at: object = None


class ChaosDriver:
    def __init__(self, *, seed: int, procs, make_cluster, send_task, say=print, panel=None, workdir=None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.procs = procs
        self.make_cluster = make_cluster      # (objects, name) -> SimClusterHandle, running clock
        self.send_task = send_task            # (name, args) -> None, on the workers' broker
        self.say = say
        self.stats = Stats(seed=seed)
        self.index = 0
        self.kill_times: list[float] = []
        self.restarts: dict[str, float] = {}
        self.pending: list[PendingGap] = []
        self.job: DefragJob | None = None
        self.log_marks: dict[str, int] = {}     # where each worker's log was when it last started
        self.panel = panel                      # a logged-in django.test.Client: the operator's browser
        self.workdir = Path(workdir) if workdir else None
        self.prometheus: PrometheusServer | None = None

    # ---- naming and reporting ---------------------------------------------------------------
    def where(self) -> str:
        return f"[chaos seed={self.seed} scenario={self.index}]"

    def violation(self, text: str) -> None:
        message = f"{self.where()} {text}"
        self.stats.violations.append(message)
        self.say(f"VIOLATION {message}")

    # ---- workers ------------------------------------------------------------------------------
    def worker_start(self, name: str) -> None:
        log = self.procs.tmp_path / f"{name}.log"
        self.log_marks[name] = log.stat().st_size if log.exists() else 0
        # Every queue, as the product's workers consume them between them (config/queues.py).
        self.procs.start(name, "worker", "-Q", ",".join(queues.ALL), "--pool=prefork", "--concurrency=1",
                         "--without-gossip", "--without-mingle", "--without-heartbeat",
                         "-n", f"chaos-{name}-{os.getpid()}@%h", "--loglevel=INFO")

    def workers_start(self, beat_schedule: str) -> None:
        for name in WORKERS:
            self.worker_start(name)
        self.procs.start("beat", "beat", "--loglevel=INFO", "--pidfile=", "-s", beat_schedule)
        for name in WORKERS:
            self._wait_ready(name)

    def _wait_ready(self, name: str) -> None:
        deadline = time.monotonic() + 60
        while "ready." not in self.procs.log(name)[self.log_marks[name]:]:
            if time.monotonic() > deadline:
                raise ChaosStuck(f"{self.where()} worker {name} not ready within 60 s\n{self.procs.logs()}")
            time.sleep(0.2)

    def _holder_pid(self) -> int | None:
        """The PID of the pool process stepping the job now (from the workers' logs)."""
        if self.job is None:
            return None
        owner = DefragJob.objects.filter(pk=self.job.pk).values_list("lease_owner", flat=True).first()
        if not owner:
            return None
        marker = f"stepped by {owner} on "
        for name in WORKERS:
            if name not in self.procs.procs:
                continue
            text = self.procs.log(name)
            at = text.rfind(marker)
            if at >= 0:
                return int(text[at:].split("\n", 1)[0].rsplit(" ", 1)[1])
        return None

    def kill(self) -> None:
        alive = [n for n in WORKERS if n in self.procs.procs]
        if not alive:
            return
        holder = self._holder_pid()
        owner_of = {n: pool_children(self.procs.pid(n)) for n in alive}
        target = next((n for n, kids in owner_of.items() if holder in kids), None)
        if target is None or self.rng.random() < 0.3:
            target = self.rng.choice(alive)
        kind = self.rng.choice(("pool", "whole"))
        job = DefragJob.objects.filter(pk=self.job.pk).first() if self.job else None
        needs_step = job is not None and _needs_step(job)
        killed_at = clock.now()
        if kind == "pool":
            pids = owner_of[target] or pool_children(self.procs.pid(target))
            if not pids:
                return   # still starting: no pool process yet
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            pids = self.procs.kill(target)
            self.restarts[target] = time.monotonic() + self.rng.uniform(0.5, 3.0)
        self.stats.kills[kind] += 1
        held = holder is not None and holder in pids
        self.say(f"{self.where()} SIGKILL {kind} {target} pids {pids}"
                 + (f" (stepping job #{job.pk} in {job.state})" if held else ""))
        for gap in self.pending:
            gap.killed_at, gap.killed_wall = killed_at, time.monotonic()
            gap.kind = "whole" if kind == "whole" else gap.kind
        if held and needs_step and not any(g.job_id == job.pk for g in self.pending):
            self.pending.append(PendingGap(kind, job.pk, killed_at, time.monotonic(), killed_at))

    # ---- the loop every wait runs -------------------------------------------------------------
    def forward(self, seconds: float) -> None:
        offset = float(self.procs.offset_file.read_text() or 0) + seconds
        self.procs.offset_file.write_text(f"{offset:.3f}")
        self.stats.forwarded_s += seconds

    def tick(self) -> None:
        now_wall = time.monotonic()
        while self.kill_times and self.kill_times[0] <= now_wall:
            self.kill_times.pop(0)
            self.kill()
        for name, at in list(self.restarts.items()):
            if at <= now_wall:
                del self.restarts[name]
                self.worker_start(name)
        if "beat" in self.procs.procs and self.procs.procs["beat"][0].poll() is not None:
            raise ChaosStuck(f"{self.where()} celery beat exited\n{self.procs.logs()}")
        forward = False
        for gap in list(self.pending):
            job = DefragJob.objects.get(pk=gap.job_id)
            if job.heartbeat_at and job.heartbeat_at > gap.killed_at:
                seconds = (job.heartbeat_at - gap.killed_at).total_seconds()
                self.stats.gaps[gap.kind].append(seconds)
                self.stats.longest_span = max(self.stats.longest_span,
                                              (job.heartbeat_at - gap.first_killed_at).total_seconds())
                self.pending.remove(gap)
                if seconds > GAP_BOUND_S[gap.kind]:
                    self.violation(f"job #{job.pk} went {seconds:.0f} s unstepped after a {gap.kind} kill "
                                   f"(bound {GAP_BOUND_S[gap.kind]:.0f} s)")
                continue
            if not _needs_step(job) and job.finished_at is not None and job.finished_at <= gap.killed_at:
                # The killed step had already ended the job (its last record landed between the
                # driver's read of the state and the kill): nothing is left to step.
                self.pending.remove(gap)
                continue
            unstepped = (clock.now() - gap.killed_at).total_seconds()
            if unstepped > 3 * GAP_BOUND_S["whole"]:
                self.pending.remove(gap)
                self.violation(f"job #{job.pk} ({job.state}) not stepped {unstepped:.0f} s after a {gap.kind} kill")
            elif now_wall - gap.killed_wall > FORWARD_AFTER_WALL_S and not _resume_beat_passed(job):
                # Past the lapsed lease and one resume beat, time runs at its own pace again:
                # a worker's pickup, fast-forwarded, would read ten times as long as it is.
                forward = True
        if forward:
            self.forward(FORWARD_STEP_S)
        time.sleep(0.5 if forward else 0.2)

    def wait(self, predicate, what: str, *, limit_s: float = PHASE_LIMIT_WALL_S, forward_after: float | None = None):
        """Poll `predicate` while the chaos goes on; fast-forward product time after
        `forward_after` wall seconds (waiting for a beat); a violation past `limit_s`."""
        started = time.monotonic()
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() - started > limit_s:
                raise ChaosStuck(f"{self.where()} not within {limit_s:.0f} s: {what}")
            if forward_after is not None and time.monotonic() - started > forward_after and not self.pending:
                self.forward(FORWARD_STEP_S)
            self.tick()

    def schedule_kills(self, count: int, within_s: float) -> None:
        """`count` kills at random moments of the next `within_s` wall seconds (those the
        phase outlives); moments already drawn stay."""
        start = time.monotonic()
        self.kill_times = sorted(self.kill_times + [start + self.rng.uniform(0.0, within_s) for _ in range(count)])

    def settle(self) -> None:
        """No kill left pending; every killed worker back up and ready."""
        self.kill_times = []
        while self.restarts:
            self.tick()
        for name in WORKERS:
            self._wait_ready(name)

    # ---- one scenario -------------------------------------------------------------------------
    def run(self, scenarios: int) -> Stats:
        started = time.monotonic()
        try:
            for _ in range(scenarios):
                self.index += 1
                self.scenario()
                self.stats.scenarios += 1
        finally:
            self.stats.wall_s = time.monotonic() - started
        return self.stats

    def scenario(self) -> None:
        sub_seed = self.rng.randrange(2 ** 31)
        # The simulated cluster's clock runs 5-50 times faster than the wall: the slower, the
        # longer replacements take to start, so kills and aborts land mid-wait more often.
        handle = self.make_cluster(scenario_objects(self.index), f"chaos-{self.index}",
                                   self.rng.choice((5.0, 20.0, 50.0)))
        kube = Kube(handle.kubeconfig_path)
        try:
            self._scenario(handle, kube, sub_seed)
        except ChaosStuck as exc:
            self.violation(str(exc).removeprefix(self.where() + " "))
        finally:
            handle.control.clear_faults()
            self.job = None
            self.pending = []
            self.settle()
            handle.server.stop()
            if self.prometheus is not None:
                self.prometheus.stop()
                self.prometheus = None
            self.cluster_retire(handle.cluster)

    @staticmethod
    def cluster_retire(cluster) -> None:
        """The scenario's cluster is gone: retire it (with its orgs), as an operator does, so
        the schedules (retry, discovery, binpack, the defrag resume) do not spend the next
        scenarios' workers on a cluster that no longer answers."""
        from clusters.services import cluster_retire

        cluster_retire(cluster=cluster, actor=None, now=clock.now(), cause="the chaos scenario ended")

    def _scenario(self, handle, kube: Kube, sub_seed: int) -> None:
        from orgs.services import orgs_sync

        cluster = handle.cluster
        self.wait(lambda: _model_pods_running(kube), "the model pods run", limit_s=60)
        orgs_sync(cluster=cluster, now=clock.now())
        node = _busiest_node(kube)
        latency = self.rng.choice((5, 20, 50))
        handle.control.set_faults(seed=sub_seed, error_rate=0.10, throttle_rate=0.05, conflict_rate=0.05,
                                  latency_ms=latency, drop_watch_after=round(self.rng.uniform(0.3, 2.0), 1))
        mode = self.rng.choice(("drain", "abort-early", "abort-after-safe"))
        self.say(f"{self.where()} defrag {node} then {mode}; faults seed {sub_seed}, latency {latency} ms")
        try:
            self.defrag_phase(cluster, node, mode)
            self.sweep_phase(cluster)
            self.binpack_phase(cluster)
            self.prune_phase(cluster, kube)
            self.runbook_phase(cluster, kube)
        finally:
            injected = handle.control.faults().get("injected", {})
            self.stats.faults.update(injected)
            handle.control.clear_faults()
        self.settle()
        self.check_defrag(cluster, kube)
        self.check_orgs(cluster, kube)
        self.check_binpack(cluster, kube)
        self.check_prune(cluster, kube)
        self.check_runbook(cluster, kube)

    # ---- defrag ------------------------------------------------------------------------------
    def defrag_phase(self, cluster, node: str, mode: str) -> None:
        plan = defrag_discover(cluster=cluster, node_name=node)
        poll = self.rng.choice((0.5, 1.0, 3.0))
        job = defrag_job_start(cluster=cluster, node_name=node, plan=plan, poll_interval_seconds=poll,
                               timeout_seconds=3600)   # queued on commit, to the workers' broker
        self.job = job
        self.aborts_sent = self.drains_sent = 0
        self.schedule_kills(self.rng.randint(1, 3), 4.0)
        if mode == "abort-early":
            abort_at = time.monotonic() + self.rng.uniform(0.0, 2.5)
            self.wait(lambda: time.monotonic() >= abort_at or _state(job) in RESTING_STATES, "the abort moment")
            self.abort(job)
        else:
            state = self.wait(lambda: (s := _state(job)) in RESTING_STATES and s, f"job #{job.pk} reaches safe")
            if state != JobState.SAFE:
                raise ChaosStuck(f"{self.where()} job #{job.pk} ended {state}, not safe "
                                 f"(log tail: {DefragJob.objects.get(pk=job.pk).log[-3:]})")
            self.schedule_kills(self.rng.randint(0, 2), 2.0)
            if mode == "drain":
                defrag_job_drain(job=job, actor=None, delete_node=self.rng.random() < 0.3)
                self.drains_sent += 1
                self.stats.drains += 1
            else:
                self.abort(job)
        final = (JobState.DRAINED,) if mode == "drain" else (JobState.ABORTED, JobState.ABORT_STUCK)
        self.wait(lambda: _state(job) in final and not self.pending, f"job #{job.pk} ends {'/'.join(final)}")

    def abort(self, job: DefragJob) -> None:
        choice = self.rng.choice(("", "", "delete"))
        defrag_job_abort(job=DefragJob.objects.get(pk=job.pk), actor=None, orphans=choice)
        self.aborts_sent += 1
        self.stats.aborts += 1
        self.say(f"{self.where()} abort job #{job.pk} (orphans={choice or 'wait'}) in {_state(job)}")

    def check_defrag(self, cluster, kube: Kube) -> None:
        job = DefragJob.objects.get(pk=self.job.pk) if self.job else None
        for node in kube.core.list_node().items:
            if node.spec.unschedulable:
                jobs = DefragJob.objects.filter(cluster=cluster, node_name=node.metadata.name)
                if not jobs.filter(state__in=LIVE_STATES).exists() and not jobs.filter(state=JobState.DRAINED):
                    self.violation(f"node {node.metadata.name} cordoned without a live job")
        orphans = {o.pod_name: o for o in DefragOrphan.objects.filter(job__cluster=cluster).select_related("job")}
        for pod in kube.core.list_pod_for_all_namespaces().items:
            labels = pod.metadata.labels or {}
            if "serving.knative.dev/revision" not in labels or pod.metadata.owner_references:
                continue
            orphan = orphans.get(pod.metadata.name)
            if orphan is None:
                self.violation(f"pod {pod.metadata.namespace}/{pod.metadata.name} orphaned without a record")
            elif orphan.job.state in FINAL_STATES:
                self.violation(f"pod {pod.metadata.name}: orphan of job #{orphan.job.pk} ({orphan.job.state}) "
                               f"left behind ({orphan.state})")
        if job is None:
            return
        if job.state not in FINAL_STATES and job.state != JobState.ABORT_STUCK:
            self.violation(f"job #{job.pk} neither terminal nor progressing: {job.state}")
        audits = list(entries_of_subject(subject_type="defrag_job", subject_id=job.pk).order_by("pk")
                      .values_list("action", "target"))
        actions = [a for a, _ in audits]
        if self.aborts_sent:
            if job.state not in (JobState.ABORTED, JobState.ABORT_STUCK):
                self.violation(f"abort of job #{job.pk} lost: it ended {job.state}")
            after = actions[actions.index("abort_request"):] if "abort_request" in actions else []
            for late in ("job_safe", "job_blocked", "job_fail", "job_drain"):
                if late in after:
                    self.violation(f"job #{job.pk} recorded {late} after the abort request: {actions}")
        if actions.count("abort_request") != self.aborts_sent or actions.count("drain_request") != self.drains_sent:
            self.violation(f"job #{job.pk}: requests recorded {actions.count('abort_request')} abort / "
                           f"{actions.count('drain_request')} drain, sent {self.aborts_sent} / {self.drains_sent}")
        repeated = {k: n for k, n in Counter(audits).items()
                    if n > 1 and k[0] not in ("abort_request", "drain_request", "pod_skip")}
        if repeated:
            self.violation(f"job #{job.pk}: side effects audited more than once: {repeated}")
        self._check_events(kube, "gpu-capacity-defrag", f"job #{job.pk}")

    # ---- the dormancy sweep with activity racing it -------------------------------------------
    def sweep_phase(self, cluster) -> None:
        now = clock.now()
        slugs = {kind: org_slug(self.index, kind) for kind in ORG_KINDS}
        idle = [slugs[k] for k in ORG_KINDS if k.startswith("idle")]
        for slug in idle:
            Org.objects.filter(slug=slug).update(last_activity_at=now - timedelta(hours=25))
        Org.objects.filter(slug=slugs["busy"]).update(last_activity_at=now - timedelta(hours=1))
        roles = ["none", "race", "after"]
        self.rng.shuffle(roles)
        self.org_roles = dict(zip(idle, roles)) | {slugs["busy"]: "busy"}
        self.kill_times = []
        self.schedule_kills(self.rng.randint(0, 2), 2.0)
        race_at = time.monotonic() + self.rng.uniform(0.0, 1.5)
        self.send_task(SWEEP_TASK, [])
        racer = next(s for s, r in self.org_roles.items() if r == "race")
        self.wait(lambda: time.monotonic() >= race_at, "the racing activity's moment")
        org_activity_record(racer)
        self.stats.activities += 1
        self.say(f"{self.where()} sweep queued, activity of {racer} racing it")
        late = next(s for s, r in self.org_roles.items() if r == "after")
        self.wait(lambda: Org.objects.filter(slug=late, dormant=True).exists(), f"the sweep makes {late} dormant",
                  forward_after=None)
        org_activity_record(late)
        self.stats.activities += 1
        # Converged: every org's row and its pynode agree with what its activity says.
        self.wait(lambda: self._orgs_converged(cluster), "the orgs' pynodes follow their state", forward_after=8.0)

    def _orgs_converged(self, cluster) -> bool:
        for slug, role in self.org_roles.items():
            org = Org.objects.get(slug=slug)
            if org.dormant != (role == "none") or org.applied != ("enabled" if org.dormant else "disabled"):
                return False
        return True

    def check_orgs(self, cluster, kube: Kube) -> None:
        for slug, role in self.org_roles.items():
            org = Org.objects.get(slug=slug)
            wanted_dormant = role == "none"
            if org.dormant and not wanted_dormant:
                self.violation(f"org {slug} ({role}) wrongly dormant")
            if wanted_dormant and not org.dormant:
                self.violation(f"org {slug} idle 25 h without activity left warm (not dormant)")
            scale = pynode_min_scale(kube, org.namespace)
            if scale != ("0" if org.dormant else "1"):
                self.violation(f"org {slug} ({role}, dormant={org.dormant}): pynode min-scale {scale!r}")
            switches = Counter(DormancySwitch.objects.filter(org=org).values_list("direction", flat=True))
            if any(n > 1 for n in switches.values()):
                self.violation(f"org {slug}: switches repeated {dict(switches)}")


    # ---- binpack ------------------------------------------------------------------------------
    def binpack_phase(self, cluster) -> None:
        """A binpack run queued as the schedule does, its worker killed at a random moment:
        the costs end as planned (a redelivered message or the 5-minute beat runs again)."""
        self.kill_times = []
        self.schedule_kills(self.rng.randint(0, 2), 1.0)
        self.binpack_sent_at = clock.now()
        self.send_task(BINPACK_TASK, [cluster.pk])
        self.say(f"{self.where()} binpack queued")
        self.wait(lambda: _binpack_settled(cluster, self.binpack_sent_at), "binpack writes the planned costs",
                  forward_after=8.0)

    def check_binpack(self, cluster, kube: Kube) -> None:
        if not BinpackRun.objects.filter(cluster=cluster, dry_run=False, started_at__gte=self.binpack_sent_at,
                                         finished_at__isnull=False).exists():
            self.violation("binpack run lost: no finished run recorded")
        # That the costs matched the plan was waited for in the phase (pods moved since, by
        # the pynodes' rollouts, are the next run's work, not a lost write).
        for pod in kube.core.list_namespaced_pod(MODEL_NS).items:
            notes = pod.metadata.annotations or {}
            if BINPACK_MARKER in notes and notes.get(DELETION_COST) != notes[BINPACK_MARKER]:
                self.violation(f"pod {pod.metadata.name}: deletion cost {notes.get(DELETION_COST)!r} half-written "
                               f"(marker {notes[BINPACK_MARKER]!r})")

    # ---- prune scale-down and restore ----------------------------------------------------------
    def prune_phase(self, cluster, kube: Kube) -> None:
        """A prune run queued as the schedule does, its worker killed at random moments; then
        the operator restores every scale-down from the panel.

        Time: the pruner judges pod ages by the product clock against the cluster's creation
        stamps, and idleness by the GPU history at the product's "now". So the product clock
        is first moved past the pods' idle window, and the history Prometheus holds (a real
        one, backfilled) is laid along the product clock from a window before it to hours
        after, so whatever moment a run is evaluated at (after a kill, a reconcile, a beat,
        a fast-forward) finds the same history."""
        ns = prune_ns(self.index)
        pods = self.wait(lambda: _prune_pods_running(kube, ns), "the prune Deployments' pods run", limit_s=60)
        newest = max(created for _, created in pods.values())
        behind = (newest + timedelta(seconds=PRUNE_WINDOW_S + 60) - clock.now()).total_seconds()
        if behind > 0:
            self.forward(behind)
        self.prometheus_start(ns, pods)
        cluster.prometheus_url = self.prometheus.url
        cluster.save(update_fields=["prometheus_url"])
        self.kill_times = []
        self.schedule_kills(self.rng.randint(1, 3), 2.0)
        self.send_task(PRUNE_TASK, [cluster.pk])
        self.say(f"{self.where()} prune queued ({len(pods)} pods, Prometheus {self.prometheus.url})")
        # A run whose worker was killed is completed by the reconcile beat once its lease
        # lapses; owners it never reached are the next scheduled run's (fast-forwarded to).
        self.wait(lambda: _prune_settled(cluster, kube, ns), "the idle Deployments are scaled to zero, no run "
                  "left running", forward_after=8.0)
        cluster.prometheus_url = ""     # no further scheduled runs: the operator restores now
        cluster.save(update_fields=["prometheus_url"])
        self.prune_restore(cluster)
        wanted = {name: replicas for name, replicas, _ in PRUNE_DEPLOYMENTS}
        self.wait(lambda: _deployment_replicas(kube, ns) == wanted, "the restored Deployments are back")

    def prometheus_start(self, ns: str, pods: dict) -> None:
        now = clock.now()
        first, last = now - timedelta(seconds=PRUNE_WINDOW_S + 600), now + timedelta(seconds=PRUNE_HISTORY_AHEAD_S)
        moments = [first + timedelta(minutes=m) for m in range(int((last - first).total_seconds() // 60) + 1)]
        utilization = {name: float(util) for name, _, util in PRUNE_DEPLOYMENTS}   # DCGM percent
        history = [Series("DCGM_FI_DEV_GPU_UTIL", gpu_labels(ns, pod, 0, node=PRUNE_NODE),
                          [(t, utilization[owner]) for t in moments])
                   for pod, (owner, _) in pods.items()]
        server = PrometheusServer(self.workdir / f"prometheus-{self.index}")
        server.backfill(history)
        self.prometheus = server.start()

    def prune_restore(self, cluster) -> None:
        """The operator selects every acted decision in the panel, presses Restore and confirms
        the page that lists what it does; a press whose restore a fault failed is pressed again."""
        acted = PruneDecision.objects.filter(run__cluster=cluster, result=PruneDecision.Result.SUCCEEDED)
        self.stats.prune_acted += acted.count()
        for _ in range(PRESSES):
            todo = [d.pk for d in acted if d.restore != PruneDecision.Restore.RESTORED]
            if not todo:
                break
            form = {"action": "restore_selected", "_selected_action": todo}
            page = self.panel.post("/admin/pruning/prunedecision/", form)   # the confirmation page
            if page.status_code == 200 and 'name="confirm"' in page.content.decode():
                page = self.panel.post("/admin/pruning/prunedecision/", {**form, "confirm": "yes"})
            self.stats.panel_presses += 1
            if page.status_code not in (200, 302):
                self.violation(f"the panel's restore answered {page.status_code}")
                return
            acted = acted.all()
        self.stats.restores += acted.filter(restore=PruneDecision.Restore.RESTORED).count()

    def check_prune(self, cluster, kube: Kube) -> None:
        ns = prune_ns(self.index)
        running = list(PruneRun.objects.filter(cluster=cluster, status=PruneRun.Status.RUNNING)
                       .values_list("pk", flat=True))
        if running:
            self.violation(f"prune run(s) {running} left running")
        decisions = PruneDecision.objects.filter(run__cluster=cluster)
        for d in decisions.filter(result=PruneDecision.Result.ACTING):
            self.violation(f"prune decision #{d.pk} ({d.owner_name}) left acting")
        replicas = _deployment_replicas(kube, ns) or {}
        acted = Counter(decisions.filter(result=PruneDecision.Result.SUCCEEDED).values_list("owner_name", flat=True))
        for name, asked, util in PRUNE_DEPLOYMENTS:
            wanted = 1 if util == "0" else 0
            if acted[name] != wanted:
                self.violation(f"Deployment {name}: {acted[name]} acted prune decision(s), wanted {wanted}")
            if replicas.get(name) != asked:
                self.violation(f"Deployment {ns}/{name} at {replicas.get(name)} replicas, its owner asked {asked}")
        originals = {name: asked for name, asked, _ in PRUNE_DEPLOYMENTS}
        for d in decisions.filter(result=PruneDecision.Result.SUCCEEDED):
            if d.restore_state != {"replicas": originals[d.owner_name]}:
                self.violation(f"prune decision #{d.pk} ({d.owner_name}) holds restore state {d.restore_state}, "
                               f"the Deployment had {originals[d.owner_name]}")
            if d.restore != PruneDecision.Restore.RESTORED:
                self.violation(f"prune decision #{d.pk} ({d.owner_name}) not restorable: restore {d.restore!r}, "
                               f"{d.error}")
        self._check_events(kube, "gpu-capacity-pruner", "prune")

    def _check_events(self, kube: Kube, component: str, what: str) -> None:
        events = Counter()
        for event in kube.core.list_event_for_all_namespaces().items:
            if (event.source and event.source.component) == component:
                events[(event.reason, event.involved_object.name)] += event.count or 1
        repeated = {k: n for k, n in events.items() if n > 1}
        if repeated:
            self.violation(f"{what}: Events posted more than once: {repeated}")

    # ---- a runbook action from the panel ---------------------------------------------------------
    def runbook_phase(self, cluster, kube: Kube) -> None:
        """The operator redeploys a 1-GPU model from the panel: its new revision waits for the
        GPU the old one holds; the registry (synced by a worker task, killed at random) shows
        it blocked, and the operator deletes the old revision from the panel to unblock it.
        Each press a fault failed is pressed again, as an operator would."""
        ns = runbook_ns(self.index)
        old = f"{RUNBOOK_MODEL}-predictor-00001"
        self.wait(lambda: _revision_pods(kube, ns) == {old: "Running"}, "the runbook model runs", limit_s=60)
        self.kill_times = []
        self.schedule_kills(self.rng.randint(1, 2), 2.0)
        self.send_task(REGISTRY_TASK, [cluster.pk])
        model = self.wait(lambda: ServedModel.objects.filter(cluster=cluster, namespace=ns, name=RUNBOOK_MODEL,
                                                             ready=True, gone=False).first(),
                          "a registry sync lists the model", forward_after=8.0)
        self.press(lambda: self.panel.post("/admin/capacity/servedmodel/", {
            "action": "redeploy", "_selected_action": [model.pk], "confirm": "yes"}),
            done=lambda: RunbookAction.objects.filter(cluster=cluster, action="model_redeploy",
                                                     state=RunbookAction.State.DONE).exists(),
            what="redeploy")
        self.schedule_kills(self.rng.randint(0, 2), 2.0)
        self.send_task(REGISTRY_TASK, [cluster.pk])
        self.wait(lambda: any(b["old_revision"] == old for b in ServedModel.objects.get(pk=model.pk).blocked),
                  "a registry sync shows the new revision blocked by the old one", forward_after=8.0)
        self.press(lambda: self.panel.post(f"/admin/capacity/servedmodel/{model.pk}/unblock/{old}/",
                                           {"confirm": "yes"}),
                   done=lambda: RunbookAction.objects.filter(cluster=cluster, action="revision_delete_old",
                                                             state=RunbookAction.State.DONE).exists(),
                   what="unblock")
        new = f"{RUNBOOK_MODEL}-predictor-00002"
        self.wait(lambda: _revision_pods(kube, ns) == {new: "Running"}, "the new revision runs on the freed GPU")

    def press(self, action, *, done, what: str) -> None:
        for _ in range(PRESSES):
            self.stats.panel_presses += 1
            try:
                page = action()
            except KubeError as exc:      # the page failed: what did the press do?
                self.violation(f"the panel's {what} answered an error page ({exc}); done: {done()}")
            else:
                if page.status_code not in (200, 302):
                    raise ChaosStuck(f"{self.where()} the panel's {what} answered {page.status_code}")
            if done():
                self.stats.runbook_actions += 1
                return
            self.tick()
        raise ChaosStuck(f"{self.where()} the panel's {what} not done after {PRESSES} presses")

    def check_runbook(self, cluster, kube: Kube) -> None:
        ns = runbook_ns(self.index)
        # A press a fault failed leaves a truthful `failed` row and is pressed again; what must
        # hold is that each action was done once.
        audits = Counter(RunbookAction.objects.filter(cluster=cluster, state=RunbookAction.State.DONE)
                         .values_list("action", "target"))
        wanted = {("model_redeploy", f"{ns}/{RUNBOOK_MODEL}"): 1,
                  ("revision_delete_old", f"{ns}/{RUNBOOK_MODEL}-predictor-00001"): 1}
        if dict(audits) != wanted:
            self.violation(f"runbook actions {dict(audits)}, wanted each action done once: {wanted}")
        entries = Counter(entries_filter(app="runbook", cluster=cluster, action__in=[a for a, _ in wanted])
                          .values_list("action", "target"))
        if dict(entries) != wanted:
            self.violation(f"runbook audit entries {dict(entries)}, wanted each action done audited once: {wanted}")
        revisions = sorted(r["metadata"]["name"] for r in kube.custom.list_namespaced_custom_object(
            "serving.knative.dev", "v1", ns, "revisions")["items"])
        if revisions != [f"{RUNBOOK_MODEL}-predictor-00002"]:
            self.violation(f"runbook model revisions {revisions}: wanted only the redeployed one")


def _binpack_changes(cluster) -> list | None:
    """The cost changes a binpack run would write now (None: the cluster did not answer)."""
    from capacity.binpack import planning
    from capacity.binpack.services import binpack_options, opted_out_owners
    from clusters.errors import KubeError
    from clusters.kube import gateway_for
    from clusters.selectors import snapshot_take

    gateway = gateway_for(cluster)
    try:
        snapshot = snapshot_take(gateway, now=clock.now())
        plan = planning.binpack_plan(snapshot, options=binpack_options(opted_out_owners=opted_out_owners(gateway)))
    except KubeError:
        return None
    return [c.as_dict() for c in plan.changes]


def _binpack_settled(cluster, since) -> bool:
    finished = BinpackRun.objects.filter(cluster=cluster, dry_run=False, started_at__gte=since,
                                         finished_at__isnull=False).exists()
    return finished and _binpack_changes(cluster) == []


def _quietly(read, default=None):
    """A read of the faulty cluster, as a poll: a fault answers `default`, the next poll tries again."""
    try:
        return read()
    except ApiException:
        return default


def _prune_pods_running(kube: Kube, ns: str) -> dict | None:
    """{pod: (Deployment, created)} once every prune Deployment's pods run, else None."""
    items = _quietly(lambda: kube.core.list_namespaced_pod(ns).items)
    if items is None:
        return None
    pods = {p.metadata.name: (p.metadata.labels["app"], p.metadata.creation_timestamp) for p in items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
    return pods if len(pods) == sum(replicas for _, replicas, _ in PRUNE_DEPLOYMENTS) else None


def _deployment_replicas(kube: Kube, ns: str) -> dict | None:
    items = _quietly(lambda: kube.apps.list_namespaced_deployment(ns).items)
    return None if items is None else {d.metadata.name: d.spec.replicas for d in items}


def _prune_settled(cluster, kube: Kube, ns: str) -> bool:
    if PruneRun.objects.filter(cluster=cluster, status=PruneRun.Status.RUNNING).exists():
        return False
    decisions = PruneDecision.objects.filter(run__cluster=cluster)
    if decisions.filter(result=PruneDecision.Result.ACTING).exists():
        return False
    idle = {name for name, _, util in PRUNE_DEPLOYMENTS if util == "0"}
    acted = set(decisions.filter(result=PruneDecision.Result.SUCCEEDED).values_list("owner_name", flat=True))
    replicas = _deployment_replicas(kube, ns)
    return acted >= idle and replicas is not None and all(replicas[name] == 0 for name in idle)


def _revision_pods(kube: Kube, ns: str) -> dict | None:
    items = _quietly(lambda: kube.core.list_namespaced_pod(
        ns, label_selector=f"serving.kserve.io/inferenceservice={RUNBOOK_MODEL}").items)
    if items is None:
        return None
    return {p.metadata.labels["serving.knative.dev/revision"]: p.status.phase for p in items
            if not p.metadata.deletion_timestamp}


def _resume_beat_passed(job: DefragJob) -> bool:
    """The job's lease lapsed a whole resume-beat period (and a beat tick) ago: the beat has
    re-queued it by now, by the product clock."""
    return job.lease_expires_at is not None and \
        clock.now() >= job.lease_expires_at + timedelta(seconds=RESUME_EVERY_S + 1)


def _state(job: DefragJob) -> str:
    return DefragJob.objects.filter(pk=job.pk).values_list("state", flat=True).first()


def _needs_step(job: DefragJob) -> bool:
    return job.state not in RESTING_STATES or job.abort_pending or (
        job.state == JobState.SAFE and bool(job.drain_requested_at))


def _model_pods_running(kube: Kube) -> bool:
    pods = kube.core.list_namespaced_pod(MODEL_NS).items
    wanted = sum(min_scale for _, min_scale, _ in SERVICES)
    return sum(1 for p in pods if p.status.phase == "Running" and p.spec.node_name) >= wanted


def _busiest_node(kube: Kube) -> str:
    gpus = Counter()
    for pod in kube.core.list_namespaced_pod(MODEL_NS).items:
        if pod.spec.node_name:
            limits = pod.spec.containers[0].resources.limits or {}
            gpus[pod.spec.node_name] += int(limits.get("nvidia.com/gpu", 0))
    return max(NODES, key=lambda n: (gpus[n], n))
