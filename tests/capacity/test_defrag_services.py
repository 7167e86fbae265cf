"""Defrag jobs on the simulated cluster, through the real client over HTTP.

The clock is the simulated cluster's: tests move it with `advance` and hand it to the
job as `now`; nothing sleeps.
"""
from __future__ import annotations

import importlib
import pkgutil
from datetime import timedelta

import pytest

from audit.selectors import entries_of_subject
from capacity.defrag import services
from capacity.defrag.models import DefragJob, JobState, OrphanState
from capacity.defrag.services import record
from capacity.defrag.services import (
    SAFE_MESSAGE,
    DefragError,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_start,
    defrag_job_step,
)
from defrag_builders import make_pod
from defrag_cluster import NS, REVISION, SERVICE, knative_service, run_until, scenario

pytestmark = pytest.mark.django_db


def job_audit(job):
    """The job's entries in the audit trail, oldest first."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)


def start_job(world, node: str, **kwargs) -> DefragJob:
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    kwargs.setdefault("poll_interval_seconds", 2.0)
    return defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now(), enqueue=False,
                            **kwargs)


def step(world, job) -> DefragJob:
    return defrag_job_step(job=job, gateway=world.gateway, now=world.now())


def test_seed_scenario_three_replicas_one_orphaned_scale_reaches_four_then_safe(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    [pod] = world.kube.pods(node=node)
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    assert plan.report_lines()[:4] == [
        "Found pods to defrag:", f"\t{NS}/{pod.metadata.name}",
        "\t\t- 1x NVIDIA-H100-80GB-HBM3 GPUs", "\t\t- STATUS=[Running] REPLICAS=3 KPA_SCALE=3"]
    job = defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now(), enqueue=False,
                           poll_interval_seconds=2.0)

    job = step(world, job)                                  # record
    [revision] = job.revisions.all()
    assert (revision.initial_kpa_scale, revision.initial_replicas, revision.overprovision) == (3, 3, 1)
    job = step(world, job)                                  # cordon
    assert world.kube.node_cordoned(node)
    job = step(world, job)                                  # orphan
    orphaned = world.kube.core.read_namespaced_pod(pod.metadata.name, NS)
    assert not orphaned.metadata.owner_references
    assert "pod-template-hash" not in orphaned.metadata.labels
    assert orphaned.status.phase == "Running"               # it keeps serving
    assert job.state == JobState.WAITING

    world.advance(0)                                        # the ReplicaSet makes a replacement
    job = step(world, job)
    assert job.state == JobState.WAITING
    assert job.log[-1] == f"Revision {REVISION} - 1 extra needed - current_scale=3 replicas=3 initial_scale=3"

    job = run_until(world, job, {JobState.SAFE})
    assert world.kube.actual_scale() == 4
    assert job.log[-2] == f"Revision {REVISION} - 1 extra needed - current_scale=4 replicas=3 initial_scale=3"
    assert job.log[-1] == SAFE_MESSAGE
    assert [p.metadata.name for p in world.kube.pods(node=node)] == [pod.metadata.name]  # orphan still there
    assert {e.reason for e in world.kube.events("default")} >= {"DefragCordon", "DefragSafe"}
    assert [e.involved_object.name for e in world.kube.events(NS, "DefragOrphan")] == [pod.metadata.name]
    assert list(job_audit(job).values_list("action", flat=True)) == [
        "job_confirm", "scales_record", "node_cordon", "pod_orphan", "job_safe"]


def test_the_wait_costs_the_same_api_calls_per_check_whatever_the_pods(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=6, annotations={
        "autoscaling.knative.dev/max-scale": "12"}), nodes=2))
    node = world.kube.node_with_pods(count=3)
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    before = world.gateway.calls_total()
    job = step(world, job)
    assert world.gateway.calls_total() - before == 2        # one PodAutoscaler, one ReplicaSet


def test_model_scaling_down_mid_job_is_safe_on_current_replicas(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    # The model scales down (min-scale 3 → 1) while the job waits: initial_replicas + m is out
    # of reach, current_replicas + m is what counts.
    world.kube.custom.patch_namespaced_custom_object(
        "serving.knative.dev", "v1", NS, "services", SERVICE,
        {"spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "1"}}}}})
    job = run_until(world, job, {JobState.SAFE}, dt=5)
    [revision] = job.revisions.all()
    assert revision.current_replicas < revision.initial_replicas
    assert job.log[-1] == SAFE_MESSAGE


def test_two_revisions_on_one_node(defrag_world):
    world = defrag_world(scenario(knative_service("alpha", min_scale=2), knative_service("beta", min_scale=1),
                                  nodes=1))
    world.kube.core.create_node(kubernetes_node("n2"))
    world.kube.core.create_node(kubernetes_node("n3"))
    job = start_job(world, "n1")
    assert sorted((r["revision"], r["overprovision"]) for r in job.report["revisions"]) == [
        ("alpha-00001", 2), ("beta-00001", 1)]
    job = run_until(world, job, {JobState.SAFE})
    assert {r.revision: r.current_kpa_scale for r in job.revisions.all()} == {"alpha-00001": 4, "beta-00001": 2}
    assert job.orphans.filter(state=OrphanState.ORPHANED).count() == 3
    assert all(p.spec.node_name != "n1" for p in world.kube.pods() if p.metadata.owner_references)


def kubernetes_node(name: str) -> dict:
    from defrag_builders import make_node

    return make_node(name)


def test_blockers_are_reported_before_confirmation_and_keep_the_node_unsafe(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=1), nodes=1))
    world.kube.core.create_namespaced_pod(NS, make_pod("scratch", namespace=NS, node="n1", gpus=1))
    world.kube.core.create_namespaced_pod(NS, make_pod("ds", namespace=NS, node="n1", gpus=0,
                                                       owner=("DaemonSet", "dcgm-exporter")))
    world.kube.core.create_node(kubernetes_node("n2"))
    world.advance(10)
    plan = defrag_discover(cluster=world.cluster, node_name="n1", gateway=world.gateway)
    assert [(p.name, p.reason) for p in plan.blockers] == [("scratch", "bare pod (no controller would replace it)")]
    assert [p.name for p in plan.ignored] == ["ds"]
    assert any("scratch" in line for line in plan.report_lines())
    job = defrag_job_start(cluster=world.cluster, node_name="n1", plan=plan, now=world.now(), enqueue=False,
                           poll_interval_seconds=2.0)
    job = run_until(world, job, {JobState.BLOCKED, JobState.SAFE})
    assert job.state == JobState.BLOCKED
    assert "scratch" in job.log[-1]
    assert world.kube.pod_exists(NS, "scratch")            # never touched
    # The pod the job orphaned itself has no controller either, but it is a tracked orphan, not a blocker.
    [orphan] = job.orphans.all()
    assert orphan.state == OrphanState.ORPHANED and orphan.pod_name not in job.log[-1]
    assert job_audit(job).get(action="job_blocked").new == {
        "blockers": [f"{NS}/scratch (bare pod (no controller would replace it))"]}


def test_conflicts_while_orphaning_are_retried_and_each_pod_orphaned_once(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.CORDONED}, dt=0)
    world.control.set_faults(seed=1, conflict_rate=1.0, match={"verbs": ["patch"], "resources": ["pods"]})
    job = step(world, job)
    assert job.state == JobState.CORDONED and "changed while orphaning" in job.error
    assert job.orphans.get().state == OrphanState.PLANNED
    world.control.clear_faults()
    job = run_until(world, job, {JobState.SAFE})
    assert world.gateway.calls[("patch", "pods")] == 2      # the refused try and the good one
    assert job.orphans.get().state == OrphanState.ORPHANED


def test_api_5xx_is_recorded_and_the_job_carries_on(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)
    world.control.set_faults(seed=3, error_rate=1.0)
    job = step(world, job)
    assert job.state == JobState.CONFIRMED and "500" in job.error
    world.control.clear_faults()
    job = run_until(world, job, {JobState.SAFE})
    assert world.kube.node_cordoned(node)


def patch_in_every_module(monkeypatch, name: str, replacement) -> None:
    """Replace `name` in every module of the defrag services package that uses it (each
    module imports it by name, so a patch of one module would not reach the others)."""
    for info in pkgutil.iter_modules(services.__path__):
        module = importlib.import_module(f"{services.__name__}.{info.name}")
        if hasattr(module, name):
            monkeypatch.setattr(module, name, replacement)


class WorkerKilled(BaseException):
    """A worker dying between a side effect and the record of it (not an Exception: nothing catches it)."""


def crash_at(monkeypatch, n: int):
    """Make the n-th record of a side effect (0-based) die before it is written."""
    real = record._commit
    calls = {"n": 0}

    def commit(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] - 1 == n:
            raise WorkerKilled
        return real(*args, **kwargs)

    patch_in_every_module(monkeypatch, "_commit", commit)
    return calls


@pytest.mark.parametrize("crash_index", range(7))
def test_a_worker_killed_at_any_step_resumes_without_repeating_a_side_effect(defrag_world, monkeypatch,
                                                                            crash_index):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job_id = start_job(world, node).pk
    crash_at(monkeypatch, crash_index)
    job = DefragJob.objects.get(pk=job_id)
    crashed = False
    for _ in range(100):
        try:
            job = step(world, job)
        except WorkerKilled:
            crashed = True
            job = DefragJob.objects.get(pk=job_id)          # a new worker loads the recorded state
        if job.state == JobState.SAFE:
            break
        world.advance(1)
    assert job.state == JobState.SAFE, (job.state, job.log[-3:])
    assert crashed or crash_index >= 6
    assert world.gateway.calls[("patch", "nodes")] == 1                  # cordoned once
    assert world.gateway.calls[("patch", "pods")] == 1                   # orphaned once
    assert job.orphans.get().state == OrphanState.ORPHANED
    assert job_audit(job).filter(action="pod_orphan").count() == 1
    assert len(world.kube.events(NS, "DefragOrphan")) == 1
    assert len(world.kube.events("default", "DefragCordon")) == 1


def test_abort_uncordons_and_deletes_each_orphan_once_its_revision_is_back(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = step(world, job)
    assert not world.kube.node_cordoned(node)
    # The replacement is not Ready yet: the orphan is still needed and still tracked.
    assert world.kube.pod_exists(NS, orphan.pod_name)
    assert job.state == JobState.ABORTING and job.orphans.get().state == OrphanState.ORPHANED
    job = run_until(world, job, {JobState.ABORTED}, dt=2)
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert job.orphans.get().state == OrphanState.GONE
    assert world.kube.actual_scale() == 3


def world_without_room(defrag_world):
    """One 8-GPU model pod on n1, and n2 full with a hog: the replacement of an orphan
    cannot be scheduled anywhere, so the scale never reaches initial + m."""
    world = defrag_world(scenario(knative_service(min_scale=1, gpus=8), nodes=1))
    world.kube.core.create_node(kubernetes_node("n2"))
    world.kube.core.create_namespaced_pod(NS, make_pod("hog", namespace=NS, node="n2", gpus=8))
    world.advance(10)
    return world


def test_time_limit_fails_the_job_leaving_node_cordoned_and_orphans_serving(defrag_world):
    world = world_without_room(defrag_world)
    job = run_until(world, start_job(world, "n1", timeout_seconds=300, poll_interval_seconds=10),
                    {JobState.WAITING}, dt=0)
    job = run_until(world, job, {JobState.FAILED}, dt=30)
    assert "Timed out after 300s" in job.error
    assert (job.started_at is not None) and world.now() - job.started_at >= timedelta(
        seconds=300)
    assert world.kube.node_cordoned("n1")
    [orphan] = job.orphans.all()
    assert world.kube.core.read_namespaced_pod(orphan.pod_name, NS).status.phase == "Running"
    assert job.is_live                                      # still holds the node and its orphan



def budget_refusing_every_eviction(world) -> None:
    """A PodDisruptionBudget that allows no disruption at all: the first evictions get 429.
    It counts the orphan too (it keeps the revision's labels): 4 healthy of 4 wanted. Not
    `maxUnavailable: 0`: the disruption controller expects the owners' scale (3; the orphan
    has no owner), so 4 healthy against 3 expected would allow one eviction."""
    world.kube.policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "model"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"serving.knative.dev/revision": REVISION}}}})
    world.advance(1)

def test_drain_needs_permission_and_retries_a_pdb_that_first_refuses(defrag_world, django_user_model):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    [pod] = world.kube.pods(node=node)
    job = run_until(world, start_job(world, node), {JobState.SAFE})

    nobody = django_user_model.objects.create_user("viewer", is_staff=True)
    with pytest.raises(DefragError, match="may not drain"):
        defrag_job_drain(job=job, actor=nobody, now=world.now(), enqueue=False)

    budget_refusing_every_eviction(world)
    job = defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
    job = step(world, job)
    assert job.state == JobState.DRAINING and "PodDisruptionBudget" in job.log[-1]
    assert job.log[-1].endswith("retrying in 2s")            # the job's 2 s poll, not kubectl's 5 s
    assert world.kube.pod_exists(NS, pod.metadata.name)
    assert job.error.startswith("Eviction refused by a PodDisruptionBudget: ")
    world.kube.policy.patch_namespaced_pod_disruption_budget("model", NS, {"spec": {"minAvailable": 3}})
    job = run_until(world, job, {JobState.DRAINED}, dt=5)
    assert job.error == ""                                   # the refusal is over, and so is its message
    assert not world.kube.pod_exists(NS, pod.metadata.name)
    assert node not in [n.metadata.name for n in world.kube.core.list_node().items]
    assert world.gateway.calls[("evict", "pods")] >= 2
    assert job.orphans.get().state == OrphanState.GONE


def crash_on(monkeypatch, what: str):
    """Kill the worker as it records `what` (an audit action, or the move to state `what`),
    after the side effect it records was made. Once only: the next worker runs normally."""
    real_audit, real_commit = record._audit, record._commit
    fired = []

    def fire():
        if not fired:
            fired.append(what)
            raise WorkerKilled

    def audit(job, **kwargs):
        if kwargs["action"] == what:
            fire()
        return real_audit(job, **kwargs)

    def commit(job, *, fields=(), orphans=(), audits=(), now):
        if "state" in fields and job.state == what:
            fire()
        return real_commit(job, fields=fields, orphans=orphans, audits=audits, now=now)

    patch_in_every_module(monkeypatch, "_audit", audit)
    patch_in_every_module(monkeypatch, "_commit", commit)
    return fired


def drive(world, job_id: int, until: str, *, on_rest=None, dt: float = 1.0, max_steps: int = 200) -> DefragJob:
    """Step job `job_id` as workers would, a killed worker's successor reloading the recorded
    state; `on_rest(job)` is the operator acting on a resting job (drain, abort)."""
    job = DefragJob.objects.get(pk=job_id)
    for _ in range(max_steps):
        try:
            if on_rest is not None and job.state in (JobState.SAFE, JobState.WAITING, JobState.FAILED):
                job = on_rest(job)
            job = step(world, job)
        except WorkerKilled:
            job = DefragJob.objects.get(pk=job_id)
        if job.state == until:
            return job
        world.advance(dt)
    raise AssertionError(f"job stuck in {job.state}: {job.log[-5:]} {job.error}")


def audit_counts(job) -> dict[str, int]:
    counts: dict[str, int] = {}
    for action in job_audit(job).values_list("action", flat=True):
        counts[action] = counts.get(action, 0) + 1
    return counts


@pytest.mark.parametrize("killed_at", ["scales_record", "node_cordon", "pod_orphan", JobState.WAITING, "job_safe",
                                       "drain_request", "pod_evict", "pod_gone", "node_delete"])
def test_a_worker_killed_in_every_step_up_to_drain_resumes_without_repeating_a_side_effect(
        defrag_world, monkeypatch, killed_at):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    [pod] = world.kube.pods(node=node)
    job_id = start_job(world, node).pk
    fired = crash_on(monkeypatch, killed_at)

    def drain(job):
        if job.state == JobState.SAFE:
            job = defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
        return job

    job = drive(world, job_id, JobState.DRAINED, on_rest=drain, dt=2)
    assert fired == [killed_at]
    assert node not in [n.metadata.name for n in world.kube.core.list_node().items]
    assert not world.kube.pod_exists(NS, pod.metadata.name)
    assert job.orphans.get().state == OrphanState.GONE
    assert world.gateway.calls[("patch", "nodes")] == 1                  # cordoned once
    assert world.gateway.calls[("patch", "pods")] == 1                   # orphaned once
    assert world.gateway.calls[("evict", "pods")] == 1                   # evicted once
    assert audit_counts(job) == {"job_confirm": 1, "scales_record": 1, "node_cordon": 1, "pod_orphan": 1,
                                 "job_safe": 1, "drain_request": 1, "pod_evict": 1, "pod_gone": 1,
                                 "node_delete": 1, "job_drain": 1}
    assert len(world.kube.events(NS, "DefragOrphan")) == 1
    assert len(world.kube.events(NS, "DefragEvict")) == 1
    assert len(world.kube.events("default", "DefragCordon")) == 1


@pytest.mark.parametrize("killed_at", ["abort_request", "node_uncordon", "pod_delete", "pod_gone", JobState.ABORTED])
def test_a_worker_killed_in_every_step_of_an_abort_resumes_without_repeating_a_side_effect(
        defrag_world, monkeypatch, killed_at):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()
    fired = crash_on(monkeypatch, killed_at)

    def abort(job):
        return defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)

    job = drive(world, job.pk, JobState.ABORTED, on_rest=abort, dt=2)
    assert fired == [killed_at]
    assert not world.kube.node_cordoned(node)
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert job.orphans.get().state == OrphanState.GONE
    assert world.kube.actual_scale() == 3
    assert world.gateway.calls[("patch", "nodes")] == 2                  # cordon, uncordon
    assert world.gateway.calls[("delete", "pods")] == 1                  # the orphan, once
    assert audit_counts(job) == {"job_confirm": 1, "scales_record": 1, "node_cordon": 1, "pod_orphan": 1,
                                 "abort_request": 1, "node_uncordon": 1, "pod_delete": 1, "pod_gone": 1,
                                 "job_abort": 1}
    assert len(world.kube.events(NS, "DefragDelete")) == 1
    assert len(world.kube.events("default", "DefragAbort")) == 1


def test_a_timed_out_job_can_be_aborted_once_its_replacement_finds_room(defrag_world):
    world = world_without_room(defrag_world)
    job = run_until(world, start_job(world, "n1", timeout_seconds=60, poll_interval_seconds=10),
                    {JobState.WAITING}, dt=0)
    job = run_until(world, job, {JobState.FAILED}, dt=30)
    [orphan] = job.orphans.all()
    assert orphan.state == OrphanState.ORPHANED
    assert world.kube.pod_exists(NS, orphan.pod_name)       # still serving after the time-out
    world.kube.core.delete_namespaced_pod("hog", NS)        # room appears on n2
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert not world.kube.node_cordoned("n1")
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert job.orphans.get().state == OrphanState.GONE
    [replacement] = world.kube.pods(revision=REVISION)
    assert replacement.spec.node_name == "n2" and replacement.metadata.owner_references


def test_one_live_job_per_node_and_a_per_cluster_limit(defrag_world, settings):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    start_job(world, node)
    with pytest.raises(DefragError, match="already has a live defrag job"):
        start_job(world, node)
    settings.CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER = 1
    other = next(n.metadata.name for n in world.kube.core.list_node().items if n.metadata.name != node)
    with pytest.raises(DefragError, match="the limit is 1"):
        start_job(world, other)


def test_discovery_of_an_unknown_node_names_it(defrag_world):
    world = defrag_world(scenario(nodes=1))
    with pytest.raises(DefragError, match="node 'nope' not found in cluster 'sim'"):
        defrag_discover(cluster=world.cluster, node_name="nope", gateway=world.gateway)
