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
from datetime import timedelta
from pathlib import Path

from audit.selectors import entries_of_subject
from capacity.binpack.models import BinpackRun
from capacity.defrag.models import FINAL_STATES, LIVE_STATES, RESTING_STATES, DefragJob, DefragOrphan, \
    JobState
from capacity.defrag.services import defrag_discover, defrag_job_abort, defrag_job_drain, defrag_job_start
from clusters.labels import BINPACK_MARKER, DELETION_COST
from config import clock, queues
from orgs.activity import org_activity_record
from orgs.models import DormancySwitch, Org
from tests.celery_workers import pool_children
from tests.prometheus_fixtures import PrometheusServer

from .serving import PRUNER_ENV, ServingPhases
from .stats import GAP_BOUND_S, RESUME_EVERY_S, ChaosStuck, PendingGap, Stats
from .world import MODEL_NS, NODES, ORG_KINDS, SERVICES, Kube, org_slug, pynode_min_scale, scenario_objects

__all__ = ["BEAT_TASKS", "GAP_BOUND_S", "PRUNER_ENV", "ChaosDriver", "ChaosStuck", "Stats"]

WORKERS = ("w1", "w2")
FORWARD_STEP_S = 5.0          # product seconds added per fast-forward tick
FORWARD_AFTER_WALL_S = 4.0    # wall seconds a killed job gets before time is fast-forwarded
PHASE_LIMIT_WALL_S = 150.0    # the longest any phase may take (wall seconds) before it is a violation
SWEEP_TASK = "orgs.tasks.dormancy_sweep"
BINPACK_TASK = "capacity.binpack.tasks.binpack_cluster"
BEAT_TASKS = ("capacity.tasks.defrag_jobs_resume", "capacity.tasks.campaigns_resume",
              "orgs.tasks.scale_to_zero_retry", "orgs.tasks.scale_to_zero_reconcile",
              "clusters.tasks.discovery_refresh_all", "capacity.binpack.tasks.binpack_all_clusters",
              "pruning.tasks.prune_all_clusters", "pruning.tasks.prune_runs_reconcile",
              "capacity.runbook.tasks.registry_sync_all_clusters")


class ChaosDriver(ServingPhases):
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

    def lease_owner(self) -> str | None:
        """Who holds the lease on what the scenario steps now (its defrag job)."""
        if self.job is None:
            return None
        return DefragJob.objects.filter(pk=self.job.pk).values_list("lease_owner", flat=True).first()

    def _holder_pid(self) -> int | None:
        """The PID of the pool process stepping the scenario's work now (from the workers' logs)."""
        owner = self.lease_owner()
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
                 + (f" (stepping {f'job #{job.pk} in {job.state}' if job else 'it'})" if held else ""))
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

    # The simulated cluster's clock runs 5-50 times faster than the wall: the slower, the
    # longer replacements take to start, so kills and aborts land mid-wait more often.
    SPEEDS = (5.0, 20.0, 50.0)

    def objects(self) -> list[dict]:
        """The scenario's cluster."""
        return scenario_objects(self.index)

    def scenario(self) -> None:
        sub_seed = self.rng.randrange(2 ** 31)
        handle = self.make_cluster(self.objects(), f"chaos-{self.index}", self.rng.choice(self.SPEEDS))
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

    def _check_events(self, kube: Kube, component: str, what: str) -> None:
        events = Counter()
        for event in kube.core.list_event_for_all_namespaces().items:
            if (event.source and event.source.component) == component:
                events[(event.reason, event.involved_object.name)] += event.count or 1
        repeated = {k: n for k, n in events.items() if n > 1}
        if repeated:
            self.violation(f"{what}: Events posted more than once: {repeated}")


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
