"""Defrag jobs whose node or models change under them: pods that land after the report, a
drain hours after "safe", a model deleted mid-job, a node deleted before the cordon, an
abort racing the drain's node deletion — on the simulated cluster, through the real client.
Each test checks what an operator would: the node, the pods, the log and the audit trail."""
from __future__ import annotations

import pytest

from audit.selectors import entries_of_subject
from capacity.defrag.models import DefragJob, JobState, OrphanState
from capacity.defrag.services import defrag_job_abort, defrag_job_drain, defrag_job_step, node_return_to_service
from config.actors import acting_as
from defrag_builders import make_model_pod, make_node, make_pod
from defrag_cluster import NS, REVISION, knative_service, run_until, scenario
from test_defrag_durability import Interleave
from test_defrag_services import start_job, step

pytestmark = pytest.mark.django_db


def actions(job) -> list[str]:
    return list(entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)
                .values_list("action", flat=True))


def replicaset_of(world) -> str:
    [pod] = [p for p in world.kube.pods(revision=REVISION) if p.metadata.owner_references][:1]
    return pod.metadata.owner_references[0].name


def test_a_model_pod_that_lands_after_the_report_keeps_the_node_unsafe(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)                    # the report is taken; the node is not cordoned yet
    rs = replicaset_of(world)
    late = make_model_pod("late", revision=REVISION, namespace=NS, node=node, template_hash=rs.rsplit("-", 1)[1])
    late["metadata"]["ownerReferences"][0]["name"] = rs
    world.kube.core.create_namespaced_pod(NS, late)

    job = run_until(world, job, {JobState.SAFE, JobState.BLOCKED})

    assert job.state == JobState.BLOCKED
    assert f"{NS}/late (model pod this job did not orphan: Knative revision {REVISION})" in job.log[-1]
    assert world.kube.pod_exists(NS, "late")


@pytest.mark.parametrize("change", ["a pod bound by name", "an uncordon"])
def test_a_drain_that_would_delete_the_node_looks_again_and_stops_if_anything_came(defrag_world, change):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    if change == "an uncordon":
        world.kube.core.patch_node(node, {"spec": {"unschedulable": False}})
        why = "the node is schedulable again (uncordoned since the job cordoned it)"
    else:   # bound past the cordon, as `spec.nodeName` allows
        world.kube.core.create_namespaced_pod(NS, make_pod("debug-shell", namespace=NS, node=node, gpus=1))
        why = f"{NS}/debug-shell (bare pod (no controller would replace it))"

    job = defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.BLOCKED, JobState.DRAINED}, dt=2)

    assert job.state == JobState.BLOCKED
    assert world.kube.core.read_node(node).metadata.name == node, "the node is not deleted"
    assert job.log[-1].startswith(f"Orphans evicted, but node {node} was not deleted: {why}")
    assert job.orphans.filter(state=OrphanState.GONE).count() == 1
    assert "node_delete" not in actions(job) and actions(job)[-1] == "job_blocked"
    assert [e.reason for e in world.kube.events("default") if e.reason in ("DefragDrained", "DefragBlocked")] \
        == ["DefragBlocked"]


def test_a_drain_without_deleting_names_what_stays_on_the_node(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    world.kube.core.create_namespaced_pod(NS, make_pod("debug-shell", namespace=NS, node=node, gpus=1))
    job = defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.DRAINED}, dt=2)
    assert job.log[-2] == f"Still on node {node}, not this job's to move: " \
                          f"{NS}/debug-shell (bare pod (no controller would replace it))"
    assert job.log[-1] == f"Node {node} drained: every orphan is gone"


def test_an_abort_ends_the_orphans_of_a_model_deleted_mid_job(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()
    world.kube.apps.delete_namespaced_replica_set(orphan.revision.replicaset, NS)

    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=5, max_steps=20)

    assert not world.kube.pod_exists(NS, orphan.pod_name), "the orphan no longer holds its GPU"
    assert f"ReplicaSet {NS}/{orphan.revision.replicaset} is gone (its model was deleted): its orphans are deleted" \
        in job.log
    assert not world.kube.node_cordoned(node)
    assert [e.message for e in world.kube.events(NS, "DefragDelete")] == [
        f"Deleted by defrag job #{job.pk} (abort): its model was deleted"]


def test_a_model_deleted_between_the_report_and_the_start_is_left_out_not_retried_forever(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)
    world.kube.custom.delete_namespaced_custom_object("autoscaling.internal.knative.dev", "v1alpha1", NS,
                                                      "podautoscalers", REVISION)
    job = step(world, job)
    assert job.state == JobState.RECORDED and not job.error
    assert any(line.startswith(f"Revision {NS}/{REVISION} gone before the job started (") and
               line.endswith("): its pods are not moved") for line in job.log)
    assert not job.revisions.exists() and not job.orphans.exists()


def test_a_node_deleted_before_the_cordon_fails_the_job_at_once_saying_so(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = step(world, start_job(world, node))             # recorded
    world.kube.core.delete_node(node)
    job = step(world, job)
    assert job.state == JobState.FAILED
    assert job.error == (f"Failed: node {node} is gone from the cluster (deleted outside this job) before the job "
                         f"cordoned it; no pod was orphaned.")


def test_a_job_whose_reads_keep_failing_times_out_from_its_confirmation(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node, timeout_seconds=60)
    world.control.set_faults(seed=3, error_rate=1.0)
    job = run_until(world, job, {JobState.FAILED}, dt=10, max_steps=20)
    assert job.error.startswith("Timed out after 60s: the Kubernetes API kept failing (")
    assert job.error.endswith("The node stays schedulable (never cordoned) until an operator aborts.")
    world.control.clear_faults()
    assert not world.kube.node_cordoned(node)


def test_an_abort_before_the_cordon_says_the_node_was_never_cordoned(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=1, max_steps=10)
    assert job.log[-1] == f"Aborted: node {node} was never cordoned by this job; left as it was; no pod was orphaned"
    assert "uncordoned" not in "\n".join(job.log)


def test_an_abort_landing_while_the_drain_deletes_the_node_records_the_deletion_as_the_jobs(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    job = defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.DRAINING}, dt=0)
    world.advance(30)
    racing = Interleave(world.gateway, "delete", "nodes",
                        lambda: defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False))
    for _ in range(10):
        job = defrag_job_step(job=job, gateway=racing, now=world.now())
        if job.state in (JobState.ABORTED, JobState.DRAINED):
            break
        world.advance(2)
    assert racing.fired
    assert job.state == JobState.ABORTED
    assert f"Node {node} was deleted by this job's drain (asked for before the abort)" in job.log
    assert "deleted by someone else" not in "\n".join(job.log)
    assert actions(job).count("node_delete") == 1
    assert not [e for e in world.kube.events("default", "DefragDrained")]


def test_a_worker_acting_for_a_command_audits_under_the_commands_name_and_the_job(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    with acting_as("cli:ops@bastion"):
        job = start_job(world, node)
    job = run_until(world, job, {JobState.SAFE})            # steps outside the command: a worker's
    entries = entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)
    cordon = entries.get(action="node_cordon")
    assert (cordon.actor, cordon.actor_label) == (None, "cli:ops@bastion")
    assert cordon.cause.startswith(f"defrag job #{job.pk} (")
    assert all(e.actor_label == "cli:ops@bastion" for e in entries)


def test_a_node_uncordoned_outside_the_product_still_gets_its_orphans_ended(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    world.kube.core.patch_node(node, {"spec": {"unschedulable": False}})   # kubectl uncordon, or a lost record

    done = node_return_to_service(cluster=world.cluster, node=node, actor=None, gateway=world.gateway,
                                  now=world.now(), enqueue=False)

    assert not done.uncordoned and done.abort_requested
    assert done.message == (f"Node {node} was already schedulable; nothing to uncordon. Abort of defrag job "
                            f"#{job.pk} requested: its 1 orphan(s) are deleted, each once its revision is back "
                            f"to scale.")
    job = run_until(world, DefragJob.objects.get(pk=job.pk), {JobState.ABORTED}, dt=5)
    assert job.orphans.get().state == OrphanState.GONE
    assert "node_return_to_service" not in actions(job)


def test_a_schedulable_node_no_job_held_is_said_to_be_so(defrag_world):
    from capacity.defrag.services import DefragError

    world = defrag_world(scenario(knative_service(min_scale=1), nodes=1))
    world.kube.core.create_node(make_node("n9"))
    with pytest.raises(DefragError, match="node 'n9' is schedulable and no defrag job has held it"):
        node_return_to_service(cluster=world.cluster, node="n9", actor=None, gateway=world.gateway,
                               now=world.now(), enqueue=False)


def test_a_second_drain_request_that_asks_otherwise_about_the_node_is_refused_not_dropped(defrag_world):
    from capacity.defrag.services import DefragError

    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    job = defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False)
    assert defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False).pk == job.pk   # the same: fine
    with pytest.raises(DefragError, match=rf"job #{job.pk} already has a drain requested that keeps the Node: "
                                          r"it is not changed \(abort the job to stop the drain\)"):
        defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
    assert not DefragJob.objects.get(pk=job.pk).delete_node
