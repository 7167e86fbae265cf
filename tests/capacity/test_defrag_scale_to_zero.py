"""A defrag job whose model revision is scaled to zero meanwhile (an org's dormancy, the
idle-GPU pruner, or its owner): it needs no replacement, the job says so, and nothing the
job does brings a pod back for it."""
from __future__ import annotations

import pytest

from capacity.defrag.models import JobState, OrphanState
from capacity.defrag.services import SAFE_MESSAGE, defrag_job_abort
from defrag_cluster import NS, REVISION, knative_service, run_until, scenario
from test_defrag_services import start_job, step

pytestmark = pytest.mark.django_db

LOADING = "simcluster.io/startup-seconds"   # the simulated kubelet's start-up time of one pod
ASLEEP = (f"Revision {REVISION} {{when}} (desired scale 0, replicas 0): no replacement needed; its orphan(s) "
          f"{NS}/{{orphan}} go with the drain or the abort")


def world_with_a_model_pod_still_loading(defrag_world):
    """Two pods of one revision on n1 and n2; one serves, the other is still loading its model
    (an hour: Running, not Ready). Its node is the one to empty. Returns (world, node)."""
    world = defrag_world(scenario(knative_service(min_scale=2), nodes=2), settle=0)
    pods = world.kube.pods(revision=REVISION)
    loading = pods[0]
    world.kube.core.patch_namespaced_pod(loading.metadata.name, NS, {"metadata": {"annotations": {LOADING: "3600"}}})
    world.advance(60)
    ready = {p.metadata.name: any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
             for p in world.kube.pods(revision=REVISION)}
    assert ready == {loading.metadata.name: False, pods[1].metadata.name: True}
    return world, loading.spec.node_name


def asleep(world) -> bool:
    pa = world.kube.custom.get_namespaced_custom_object("autoscaling.internal.knative.dev", "v1alpha1", NS,
                                                        "podautoscalers", REVISION)
    deployment = world.kube.apps.read_namespaced_deployment(f"{REVISION}-deployment", NS)
    return pa["status"]["desiredScale"] == 0 and deployment.spec.replicas == 0


def scale_to_zero(world) -> None:
    """What an org's dormancy sweep does on Knative 1.15 (the simulated default): min-scale "0"
    on the revision's PodAutoscaler. With no traffic the autoscaler takes it to zero once its
    stable window and grace period have passed (simulated time)."""
    world.kube.custom.patch_namespaced_custom_object(
        "autoscaling.internal.knative.dev", "v1alpha1", NS, "podautoscalers", REVISION,
        {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "0"}}})
    for _ in range(12):
        world.advance(10)
        if asleep(world):
            return
    raise AssertionError("the revision did not go to zero within 120 s")


def test_a_revision_scaled_to_zero_during_the_wait_needs_no_replacement_and_the_job_says_so(defrag_world):
    world, node = world_with_a_model_pod_still_loading(defrag_world)
    job = run_until(world, start_job(world, node, timeout_seconds=600, poll_interval_seconds=10),
                    {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()
    job = step(world, job)
    assert job.state == JobState.WAITING                    # the loading orphan counts for nothing yet

    scale_to_zero(world)
    job = step(world, job)                                  # the next check: nothing left to wait for
    assert job.state == JobState.SAFE, job.log[-3:]
    assert job.log[-2:] == [ASLEEP.format(when="was scaled to zero during the wait", orphan=orphan.pod_name),
                            SAFE_MESSAGE]
    # The orphan is left for the drain; nothing was started for the sleeping revision.
    assert [p.metadata.name for p in world.kube.pods(revision=REVISION)
            if not p.metadata.deletion_timestamp] == [orphan.pod_name]
    assert asleep(world) and world.kube.node_cordoned(node)


def test_an_abort_of_a_job_whose_revision_went_to_zero_finishes_and_starts_nothing(defrag_world):
    world, node = world_with_a_model_pod_still_loading(defrag_world)
    job = run_until(world, start_job(world, node, timeout_seconds=600, poll_interval_seconds=10),
                    {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()
    scale_to_zero(world)
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED, JobState.ABORT_STUCK}, dt=5, max_steps=20)
    assert job.state == JobState.ABORTED, job.error
    assert ASLEEP.format(when="is scaled to zero", orphan=orphan.pod_name) in job.log
    assert [e.message for e in world.kube.events(NS, "DefragDelete")] == [
        f"Deleted by defrag job #{job.pk} (abort): revision {REVISION} is scaled to zero, no replacement needed"]
    assert job.orphans.get().state == OrphanState.GONE and not world.kube.node_cordoned(node)
    world.advance(300)
    assert world.kube.pods(revision=REVISION) == []         # nothing woken: it sleeps as it was let
    assert asleep(world)
