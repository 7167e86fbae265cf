"""Defrag end to end on both backends: simcluster and the real control plane (upstream
controllers, Knative Serving 1.15's PodAutoscaler counting a Ready orphan).

The product is driven as in tests/capacity/test_defrag_services.py: its services called
directly with a Cluster row, stepping the job with the backend's `now`. simcluster's
manual clock is advanced a second between steps; on the real tier the steps follow each
other in real time until the condition holds or its deadline passes.

Every test's nodes are its own (see pool.py) and live well under 50 s: the real tier's
controller-manager marks every pod of a KWOK node NotReady once that node's heartbeat is
50 s old (node-monitor-grace-period), and KWOK v0.7 without node leases heartbeats about
every 45-55 s; no test here may depend on a node older than that.
"""
from __future__ import annotations

import pytest

from capacity.defrag.services import (
    SAFE_MESSAGE,
    DefragError,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_start,
    defrag_job_step,
)
from audit.selectors import entries_of_subject
from capacity.defrag.models import DefragJob, JobState, OrphanState
from clusters import kube

from .pool import GpuPool

SERVICE = "model"
REVISION = f"{SERVICE}-00001"
# Deadlines: seconds of simulated time on simcluster, of wall time on the real tier.
MODEL_READY_SECONDS = 30
JOB_SECONDS = 30
# simcluster keeps a deleted or evicted pod Terminating for its 30 s grace period (and its
# GPU taken); KWOK deletes it at once. Room for two in turn (the hog, then the orphan).
TERMINATING_SECONDS = 120


def job_audit(job):
    """The job's entries in the audit trail, oldest first."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)


@pytest.fixture
def pool(tier_cluster):
    _, backend = tier_cluster
    pools = []

    def make(prefix: str) -> GpuPool:
        pools.append(GpuPool(backend, prefix))
        return pools[-1]

    yield make
    for made in pools:
        made.close()


def model_up(pool: GpuPool, *, min_scale: int) -> None:
    pool.knative_service(SERVICE, min_scale=min_scale)
    pool.backend.settle(lambda: pool.model_ready(REVISION, min_scale), what=f"{REVISION} at {min_scale} ready pods",
                        seconds=MODEL_READY_SECONDS)


def start_job(cluster, backend, node: str, **kwargs) -> DefragJob:
    plan = defrag_discover(cluster=cluster, node_name=node, gateway=kube.gateway_for(cluster))
    kwargs.setdefault("poll_interval_seconds", 2.0)
    return defrag_job_start(cluster=cluster, node_name=node, plan=plan, now=backend.now(), enqueue=False, **kwargs)


def step(cluster, backend, job) -> DefragJob:
    return defrag_job_step(job=job, gateway=kube.gateway_for(cluster), now=backend.now())


def run_until(cluster, backend, job, states, *, seconds: float = JOB_SECONDS) -> DefragJob:
    """Step the job until it reaches `states`: each settle check is one step."""
    current = [job]

    def reached():
        current[0] = step(cluster, backend, current[0])
        return current[0].state in states

    try:
        backend.settle(reached, what=f"job in {sorted(states)}", seconds=seconds)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: job stuck in {current[0].state}: {current[0].log[-12:]} "
                             f"{current[0].error}") from None
    return current[0]


def test_defrag_to_safe_orphans_the_model_pod_and_waits_for_the_autoscaler(tier_cluster, pool):
    cluster, backend = tier_cluster
    gpus = pool("defrag-safe")
    for suffix in ("n1", "n2", "n3"):
        gpus.node_add(suffix)
    model_up(gpus, min_scale=3)
    node = backend.settle(lambda: gpus.node_with_pods(REVISION, 1), what="a node with one model pod")
    [pod] = gpus.pods(node=node)
    plan = defrag_discover(cluster=cluster, node_name=node, gateway=kube.gateway_for(cluster))
    assert plan.report_lines()[:4] == [
        "Found pods to defrag:", f"\t{gpus.ns}/{pod.metadata.name}",
        "\t\t- 1x NVIDIA-H100-80GB-HBM3 GPUs", "\t\t- STATUS=[Running] REPLICAS=3 KPA_SCALE=3"]
    job = defrag_job_start(cluster=cluster, node_name=node, plan=plan, now=backend.now(), enqueue=False,
                           poll_interval_seconds=2.0)

    job = step(cluster, backend, job)                       # record
    [revision] = job.revisions.all()
    assert (revision.initial_kpa_scale, revision.initial_replicas, revision.overprovision) == (3, 3, 1)
    job = step(cluster, backend, job)                       # cordon
    assert gpus.node_cordoned(node)
    job = step(cluster, backend, job)                       # orphan
    orphaned = gpus.core.read_namespaced_pod(pod.metadata.name, gpus.ns)
    assert not orphaned.metadata.owner_references
    assert "pod-template-hash" not in orphaned.metadata.labels
    assert orphaned.status.phase == "Running"               # it keeps serving
    assert job.state == JobState.WAITING

    job = run_until(cluster, backend, job, {JobState.SAFE})
    # The PodAutoscaler counts the orphan (it still carries the revision's labels) beside
    # the ReplicaSet's replacement: 3 + 1.
    assert gpus.actual_scale(REVISION) == 4
    assert job.log[-2] == f"Revision {REVISION} - 1 extra needed - current_scale=4 replicas=3 initial_scale=3"
    assert job.log[-1] == SAFE_MESSAGE
    assert [p.metadata.name for p in gpus.pods(node=node)] == [pod.metadata.name]  # orphan still there
    assert {e.reason for e in gpus.events("default", "DefragCordon", involving=node)
            + gpus.events("default", "DefragSafe", involving=node)} == {"DefragCordon", "DefragSafe"}
    assert [e.involved_object.name for e in gpus.events(gpus.ns, "DefragOrphan")] == [pod.metadata.name]
    assert list(job_audit(job).values_list("action", flat=True)) == [
        "job_confirm", "scales_record", "node_cordon", "pod_orphan", "job_safe"]


def test_drain_needs_permission_and_retries_a_pdb_that_first_refuses(tier_cluster, pool, django_user_model):
    cluster, backend = tier_cluster
    gpus = pool("defrag-drain")
    for suffix in ("n1", "n2", "n3"):
        gpus.node_add(suffix)
    model_up(gpus, min_scale=3)
    node = backend.settle(lambda: gpus.node_with_pods(REVISION, 1), what="a node with one model pod")
    [pod] = gpus.pods(node=node)
    job = run_until(cluster, backend, start_job(cluster, backend, node), {JobState.SAFE})

    nobody = django_user_model.objects.create_user("viewer", is_staff=True)
    with pytest.raises(DefragError, match="may not drain"):
        defrag_job_drain(job=job, actor=nobody, now=backend.now(), enqueue=False)

    # A PDB that allows no disruption at all: the first evictions get 429. It counts the
    # orphan too (it keeps the revision's labels): 4 healthy of 4 wanted. Not `maxUnavailable:
    # 0`: upstream's disruption controller takes the expected count from the owners' scale
    # (3, the orphan has no owner), so 4 healthy against 3 wanted allows one eviction.
    gpus.policy.create_namespaced_pod_disruption_budget(gpus.ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "model"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"serving.knative.dev/revision": REVISION}}}})
    backend.settle(lambda: budget_observed(gpus, "model"), what="the budget observed")
    job = defrag_job_drain(job=job, actor=None, delete_node=True, now=backend.now(), enqueue=False)
    job = step(cluster, backend, job)
    assert job.state == JobState.DRAINING and "PodDisruptionBudget" in job.log[-1]
    assert job.log[-1].endswith("retrying in 2s")            # the job's 2 s poll, not kubectl's 5 s
    assert gpus.pod_exists(pod.metadata.name)
    gpus.policy.patch_namespaced_pod_disruption_budget("model", gpus.ns, {"spec": {"minAvailable": 3}})
    job = run_until(cluster, backend, job, {JobState.DRAINED}, seconds=TERMINATING_SECONDS)
    assert not gpus.pod_exists(pod.metadata.name)
    assert node not in gpus.node_names()
    assert job.orphans.get().state == OrphanState.GONE


def budget_observed(pool: GpuPool, name: str) -> bool:
    budget = pool.policy.read_namespaced_pod_disruption_budget(name, pool.ns)
    return budget.status is not None and budget.status.observed_generation == budget.metadata.generation


def test_abort_uncordons_and_deletes_the_orphan_once_its_revision_is_back(tier_cluster, pool):
    """No room for the replacement until the operator frees some: the abort uncordons at
    once, keeps the orphan serving while the replacement is Pending, and deletes it once
    the revision is back to its scale without it."""
    cluster, backend = tier_cluster
    gpus = pool("defrag-abort")
    alone = gpus.node_add("n1", gpus=1)     # the node to defrag: room for one model pod
    gpus.node_add("n2", gpus=2)             # the other two model pods, full
    spare = gpus.node_add("n3", gpus=1)
    gpus.bare_pod("hog", node=spare, gpus=1)
    model_up(gpus, min_scale=3)
    [pod] = gpus.pods(node=alone, revision=REVISION)
    job = run_until(cluster, backend, start_job(cluster, backend, alone), {JobState.WAITING})
    [orphan] = job.orphans.all()
    assert orphan.pod_name == pod.metadata.name

    job = defrag_job_abort(job=job, actor=None, now=backend.now(), enqueue=False)
    job = step(cluster, backend, job)
    assert not gpus.node_cordoned(alone)
    # The replacement cannot be scheduled (the orphan holds n1's GPU, n2 and n3 are full):
    # the orphan is still needed and still tracked.
    assert gpus.pod_exists(orphan.pod_name)
    assert job.state == JobState.ABORTING and job.orphans.get().state == OrphanState.ORPHANED
    backend.wait(3)
    job = step(cluster, backend, job)
    assert job.state == JobState.ABORTING and gpus.pod_exists(orphan.pod_name)

    gpus.core.delete_namespaced_pod("hog", gpus.ns)         # room appears on n3
    job = run_until(cluster, backend, job, {JobState.ABORTED}, seconds=TERMINATING_SECONDS)
    assert not gpus.pod_exists(orphan.pod_name)
    assert job.orphans.get().state == OrphanState.GONE
    [replacement] = [p for p in gpus.pods(revision=REVISION) if p.spec.node_name == spare]
    assert replacement.metadata.owner_references
    backend.settle(lambda: gpus.actual_scale(REVISION) == 3, what="the PodAutoscaler back at 3")


def test_a_bare_pod_and_a_plain_deployment_pod_block_the_node_and_are_never_touched(tier_cluster, pool):
    """Only Knative revision pods are orphaned: for a plain Deployment's pod no
    PodAutoscaler would count an orphan, so it blocks the node like a bare pod; a
    DaemonSet pod is ignored (it stays on a cordoned node)."""
    cluster, backend = tier_cluster
    gpus = pool("defrag-blocked")
    node = gpus.node_add("n1")
    model_up(gpus, min_scale=1)
    gpus.bare_pod("scratch", node=node, gpus=1)
    gpus.deployment("web", replicas=1)
    gpus.daemonset("dcgm-exporter")
    backend.settle(lambda: all(p.status.phase == "Running" for p in gpus.pods(node=node)) and len(
        gpus.pods(node=node)) == 4, what="the model, scratch, web and the exporter Running on n1")
    [web] = gpus.pods(app="web")
    [exporter] = gpus.pods(app="dcgm-exporter")
    gpus.node_add("n2")                                     # room for the model's replacement

    plan = defrag_discover(cluster=cluster, node_name=node, gateway=kube.gateway_for(cluster))
    assert [(p.name, p.reason) for p in plan.blockers] == [
        ("scratch", "bare pod (no controller would replace it)"),
        (web.metadata.name, "ReplicaSet pod outside Knative (no PodAutoscaler counts an orphan)")]
    assert [p.name for p in plan.ignored] == [exporter.metadata.name]
    assert any("scratch" in line for line in plan.report_lines())
    job = defrag_job_start(cluster=cluster, node_name=node, plan=plan, now=backend.now(), enqueue=False,
                           poll_interval_seconds=2.0)
    job = run_until(cluster, backend, job, {JobState.BLOCKED, JobState.SAFE})
    assert job.state == JobState.BLOCKED
    assert "scratch" in job.log[-1] and web.metadata.name in job.log[-1]
    assert gpus.pod_exists("scratch") and gpus.pod_exists(web.metadata.name)     # never touched
    assert gpus.core.read_namespaced_pod(web.metadata.name, gpus.ns).metadata.owner_references
    # The pod the job orphaned itself has no controller either, but it is a tracked orphan, not a blocker.
    [orphan] = job.orphans.all()
    assert orphan.state == OrphanState.ORPHANED and orphan.pod_name not in job.log[-1]
    assert job_audit(job).get(action="job_blocked").new == {"blockers": [
        f"{gpus.ns}/scratch (bare pod (no controller would replace it))",
        f"{gpus.ns}/{web.metadata.name} (ReplicaSet pod outside Knative (no PodAutoscaler counts an orphan))"]}
