"""A defrag job's eviction (drain) or deletion (abort) of an orphan is audited as the job's
own, once, even when its worker is killed between sending it and recording it, and the pod
has finished terminating before the job is looked at again: the intent committed on the
orphan before the request says whose it was and why.

The crash is real: a separate process (`defrag_crash_worker.py step`) runs the job's step
task against this test's PostgreSQL database and simulated cluster, and SIGKILLs itself
once the Eviction or the DELETE is answered (nothing of it recorded), or right before it is
sent. Its lease stays with it; the resume beat hands the job to a worker once that lease
has lapsed, and that worker's step (run here, on the cluster's clock) settles the intent.
Last, a real Celery worker's pool process dies the same way, and the one that takes its
re-queued message over records the deletion.
"""
from __future__ import annotations

import os
import time

import pytest

from capacity.defrag import tasks
from capacity.defrag.models import DefragJob, JobState, OrphanEnd, OrphanState
from capacity.defrag.services import (
    LEASE_SECONDS,
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_start,
    defrag_job_step,
)
from clusters.errors import Unavailable
from clusters.kube import PODS, KubeGateway
from config import clock
from defrag_builders import make_pod
from defrag_cluster import NS, Kube, knative_service, run_until, scenario
from defrag_crash_worker import crash
from simcluster.controllers.kubelet import KNATIVE_DRAIN_SECONDS, SHUTDOWN_ANNOTATION
from test_defrag_durability import Interleave
from test_defrag_services import audit_counts, budget_refusing_every_eviction, job_audit, start_job, step
from test_defrag_worker_kill import send
from test_return_to_service_kill import stamp
from tests.celery_workers import ROOT, broker_url, celery_processes, wait_for  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

INTERRUPTED = "recorded after an interruption: "
# Seconds a pod takes to go once evicted or deleted: the knative queue-proxy's drain (the
# simulated kubelet's default for a model pod), or a model that takes longer to shut down.
QUICK, SLOW = KNATIVE_DRAIN_SECONDS, 4 * KNATIVE_DRAIN_SECONDS


@pytest.fixture
def safe_job(defrag_world, django_user_model):
    """`make(shutdown_seconds)`: a safe job (its orphan's replacement Ready) on a cordoned
    node, its one orphan serving there, and an operator. Returns (world, job, orphan, ops)."""

    def make(shutdown_seconds: float = QUICK):
        world = defrag_world(scenario(knative_service(
            min_scale=3, annotations={SHUTDOWN_ANNOTATION: f"{shutdown_seconds:g}"})))
        job = run_until(world, start_job(world, world.kube.node_with_pods()), {JobState.SAFE})
        [orphan] = job.orphans.all()
        ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
        return world, job, orphan, ops

    return make


def resume_beat(world, monkeypatch) -> list[int]:
    """One firing of the resume beat on the cluster's clock: the jobs it hands to a worker."""
    monkeypatch.setattr(clock, "now", world.now)
    queued: list[int] = []
    monkeypatch.setattr(tasks.defrag_job_run, "delay", queued.append)
    tasks.defrag_jobs_resume()
    return queued


def pod_terminating(world, orphan) -> bool:
    return world.kube.core.read_namespaced_pod(orphan.pod_name, NS).metadata.deletion_timestamp is not None


def killed_after_sending(world, job, orphan, monkeypatch, *, point: str, end: str, ops):
    """Kill the job's worker at `point`; check what it left; wait until the beat hands the
    job to a new worker (its lease lapsed). Returns when the request was sent."""
    sent_at = world.now()
    crash("step", str(job.pk), sent_at.isoformat(), point)
    orphan.refresh_from_db()
    job.refresh_from_db()
    # What the dead worker left: its intent on the orphan and its lease; nothing of the request recorded.
    assert (orphan.end_intent, orphan.end_intent_at, orphan.end_intent_by) == (end, sent_at, ops)
    assert orphan.state == OrphanState.ORPHANED and job.lease_owner
    assert not {"pod_evict", "pod_delete", "pod_gone"} & set(audit_counts(job))
    assert pod_terminating(world, orphan) == point.startswith("after")
    world.advance(10)
    assert resume_beat(world, monkeypatch) == []              # its lease still runs: nobody takes the job
    world.advance(LEASE_SECONDS)
    assert resume_beat(world, monkeypatch) == [job.pk]        # lapsed: the beat hands it to a worker
    return sent_at


# ---- killed once the request was answered ------------------------------------------------------

@pytest.mark.parametrize("shutdown, then", [(QUICK, "gone"), (SLOW, "terminating")])
def test_an_abort_killed_after_its_delete_is_audited_once_as_the_jobs_deletion(safe_job, monkeypatch, shutdown,
                                                                              then):
    world, job, orphan, ops = safe_job(shutdown)
    job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    sent_at = killed_after_sending(world, job, orphan, monkeypatch, point="after-delete", end=OrphanEnd.DELETE,
                                   ops=ops)
    assert world.kube.pod_exists(NS, orphan.pod_name) == (then == "terminating")

    job = step(world, DefragJob.objects.get(pk=job.pk))       # the next worker's pass
    [deleted] = job_audit(job).filter(action="pod_delete")
    assert (deleted.actor, deleted.at) == (ops, sent_at)      # the abort's operator, when it was sent
    assert deleted.cause == f"{INTERRUPTED}Deleted by defrag job #{job.pk} (abort): its revision is back to scale"
    assert deleted.new == {"pod": then, "recorded_after_interruption": True}
    assert (f"Pod {NS}/{orphan.pod_name} deleted by this job (sent at {stamp(sent_at)}); its worker stopped "
            f"before recording it: recorded now") in job.log
    assert world.gateway.calls[("delete", "pods")] == 0      # not sent a second time
    if then == "terminating":
        assert job.state == JobState.ABORTING and job.orphans.get().state == OrphanState.DELETING
        world.advance(SLOW)
    job = run_until(world, job, {JobState.ABORTED}, dt=2)
    assert job.log[-1].endswith("every orphan gone")
    assert not world.kube.pod_exists(NS, orphan.pod_name) and world.kube.actual_scale() == 3
    orphan.refresh_from_db()
    assert orphan.state == OrphanState.GONE and orphan.end_intent == "" and orphan.end_intent_at is None
    counts = audit_counts(job)
    assert (counts["node_uncordon"], counts["pod_delete"], counts["pod_gone"], counts["job_abort"]) == (1, 1, 1, 1)
    assert [e.message for e in world.kube.events(NS, "DefragDelete")] == [
        f"Deleted by defrag job #{job.pk} (abort): its revision is back to scale"]


@pytest.mark.parametrize("shutdown, then", [(QUICK, "gone"), (SLOW, "terminating")])
def test_a_drain_killed_after_its_eviction_is_audited_once_as_the_jobs_eviction(safe_job, monkeypatch, shutdown,
                                                                               then):
    world, job, orphan, ops = safe_job(shutdown)
    node = job.node_name
    job = defrag_job_drain(job=job, actor=ops, delete_node=True, now=world.now(), enqueue=False)
    sent_at = killed_after_sending(world, job, orphan, monkeypatch, point="after-evict", end=OrphanEnd.EVICT,
                                   ops=ops)

    job = step(world, DefragJob.objects.get(pk=job.pk))
    [evicted] = job_audit(job).filter(action="pod_evict")
    assert (evicted.actor, evicted.at) == (ops, sent_at)
    assert evicted.cause == f"{INTERRUPTED}defrag job #{job.pk} (draining)"
    assert evicted.new == {"pod": then, "recorded_after_interruption": True}
    assert world.gateway.calls[("evict", "pods")] == 0
    if then == "terminating":
        assert job.state == JobState.DRAINING and job.orphans.get().state == OrphanState.DELETING
        world.advance(SLOW)
    job = run_until(world, job, {JobState.DRAINED}, dt=2)
    assert job.log[-1] == f"Node {node} drained: every orphan is gone"
    assert node not in [n.metadata.name for n in world.kube.core.list_node().items]
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    counts = audit_counts(job)
    assert (counts["pod_evict"], counts["pod_gone"], counts["node_delete"], counts["job_drain"]) == (1, 1, 1, 1)
    assert [e.message for e in world.kube.events(NS, "DefragEvict")] == [
        f"Evicted by defrag job #{job.pk} (drain of {node})"]


# ---- killed before the request went out ---------------------------------------------------------

def test_an_abort_killed_before_its_delete_sends_it_on_the_next_pass_and_records_it_once(safe_job, monkeypatch):
    world, job, orphan, ops = safe_job()
    job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    killed_after_sending(world, job, orphan, monkeypatch, point="before-delete", end=OrphanEnd.DELETE, ops=ops)
    assert world.kube.pod_exists(NS, orphan.pod_name) and not pod_terminating(world, orphan)

    job = step(world, DefragJob.objects.get(pk=job.pk))       # the pod serves on: the DELETE never went out
    assert world.gateway.calls[("delete", "pods")] == 1 and pod_terminating(world, orphan)
    [deleted] = job_audit(job).filter(action="pod_delete")
    assert deleted.actor == ops and deleted.at == world.now()  # sent, and recorded, by this pass
    assert deleted.cause == f"Deleted by defrag job #{job.pk} (abort): its revision is back to scale"
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert audit_counts(job)["pod_delete"] == 1 and len(world.kube.events(NS, "DefragDelete")) == 1


# ---- a name that holds a new pod ------------------------------------------------------------------

def replace_with_a_new_pod(world, orphan) -> str:
    """Someone removes the orphan at once and starts a pod of their own under its name."""
    if world.kube.pod_exists(NS, orphan.pod_name):
        world.kube.core.delete_namespaced_pod(orphan.pod_name, NS, grace_period_seconds=0)
    world.kube.core.create_namespaced_pod(NS, make_pod(orphan.pod_name, namespace=NS, node="n3"))
    uid = world.kube.core.read_namespaced_pod(orphan.pod_name, NS).metadata.uid
    assert uid != orphan.uid
    return uid


def test_an_intent_left_on_a_name_now_holding_a_new_pod_records_no_deletion_and_leaves_that_pod(
        safe_job, monkeypatch):
    world, job, orphan, ops = safe_job()
    job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    killed_after_sending(world, job, orphan, monkeypatch, point="after-delete", end=OrphanEnd.DELETE, ops=ops)
    new_uid = replace_with_a_new_pod(world, orphan)

    job = run_until(world, DefragJob.objects.get(pk=job.pk), {JobState.ABORTED}, dt=2)
    assert (f"Pod {NS}/{orphan.pod_name} is gone; the pod now under its name (uid {new_uid}) is a new one, not this "
            f"job's: left alone. This job's interrupted deletion of the old pod is not recorded as done (the old "
            f"pod may have gone before it).") in job.log
    assert "pod_delete" not in audit_counts(job)
    assert job_audit(job).get(action="pod_gone").new == {"replaced_by_uid": new_uid}
    assert world.kube.core.read_namespaced_pod(orphan.pod_name, NS).metadata.uid == new_uid
    assert world.gateway.calls[("delete", "pods")] == 0 and not world.kube.events(NS, "DefragDelete")


def test_a_delete_refused_because_the_name_holds_a_new_pod_clears_its_intent(safe_job):
    world, job, orphan, ops = safe_job()
    job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    new_uid = []
    # Between the abort's read of the pod and its DELETE, the name comes to hold a new pod.
    racing = Interleave(world.gateway, "delete", "pods", lambda: new_uid.append(replace_with_a_new_pod(world, orphan)))
    job = defrag_job_step(job=job, gateway=racing, now=world.now())
    assert racing.fired and world.gateway.calls[("delete", "pods")] == 1   # refused: 409, uid precondition
    orphan.refresh_from_db()
    assert orphan.end_intent == "" and orphan.end_intent_at is None and orphan.state == OrphanState.ORPHANED
    assert (f"Pod {NS}/{orphan.pod_name} was replaced by a new pod of the same name before its deletion: the new "
            f"one is not this job's and is left alone") in job.log
    job = run_until(world, job, {JobState.ABORTED}, dt=2)
    assert "pod_delete" not in audit_counts(job)
    assert world.kube.core.read_namespaced_pod(orphan.pod_name, NS).metadata.uid == new_uid[0]


# ---- an eviction a budget refused ---------------------------------------------------------------

def test_an_eviction_a_disruption_budget_refuses_clears_its_intent_so_no_later_deletion_is_taken_for_it(
        safe_job):
    world, job, orphan, ops = safe_job()
    budget_refusing_every_eviction(world)
    job = defrag_job_drain(job=job, actor=ops, delete_node=True, now=world.now(), enqueue=False)
    job = step(world, job)
    assert job.state == JobState.DRAINING and "refused (PodDisruptionBudget)" in job.log[-1]
    orphan.refresh_from_db()
    assert orphan.end_intent == "" and orphan.end_intent_at is None and orphan.state == OrphanState.ORPHANED
    assert not pod_terminating(world, orphan) and "pod_evict" not in audit_counts(job)

    # The pod's owner deletes it themselves (kubectl delete pod): that deletion is not the job's.
    world.kube.core.delete_namespaced_pod(orphan.pod_name, NS)
    world.advance(5)                                           # the drain's next try is due
    job = step(world, job)
    assert f"Pod {NS}/{orphan.pod_name} is terminating: deleted outside this job" in job.log
    job = run_until(world, job, {JobState.DRAINED}, dt=5)
    counts = audit_counts(job)
    assert "pod_evict" not in counts and counts["pod_gone"] == 1
    assert not world.kube.events(NS, "DefragEvict")



# ---- the request's answer lost ------------------------------------------------------------------

class AnswerLostOnce(KubeGateway):
    """The gateway, over HTTP to the simulated cluster, except that the first `verb` of a pod
    reaches the API server, the pod finishes terminating, and the answer never comes (the
    connection drops): the gateway tries again, and that try finds the pod gone (404)."""

    def __init__(self, *args, verb: str, world, **kwargs):
        super().__init__(*args, **kwargs)
        self.verb, self.world, self.lost = verb, world, []

    def _send_once(self, verb, resource, method, path, *rest):
        answer = super()._send_once(verb, resource, method, path, *rest)
        if verb == self.verb and resource is PODS and not self.lost:
            self.lost.append(path)
            self.world.advance(QUICK + 1)
            raise Unavailable("connection reset by peer", code=503)
        return answer


@pytest.mark.parametrize("verb", ["delete", "evict"])
def test_an_end_whose_answer_was_lost_and_whose_pod_was_then_gone_is_audited_as_the_jobs(safe_job, verb):
    world, job, orphan, ops = safe_job()
    node = job.node_name
    if verb == "delete":
        job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    else:
        job = defrag_job_drain(job=job, actor=ops, delete_node=True, now=world.now(), enqueue=False)
    lossy = AnswerLostOnce.from_kubeconfig(world.handle.kubeconfig_path, name="sim", verb=verb, world=world,
                                           retry_attempts=3, backoff=0.0, sleep=lambda s: None)
    job = defrag_job_step(job=job, gateway=lossy, now=world.now())
    assert len(lossy.lost) == 1 and lossy.calls[(verb, "pods")] == 2   # sent, then tried again: 404
    assert not world.kube.pod_exists(NS, orphan.pod_name)

    action, done = ("pod_delete", "deleted") if verb == "delete" else ("pod_evict", "evicted")
    [entry] = job_audit(job).filter(action=action)
    assert entry.actor == ops and entry.new == {"answer_lost": True}
    assert entry.cause == (f"Deleted by defrag job #{job.pk} (abort): its revision is back to scale" if verb == "delete"
                           else f"defrag job #{job.pk} (draining)")
    assert (f"Pod {NS}/{orphan.pod_name} {done} (its answer was lost; asked again, the pod was gone)") in job.log
    orphan.refresh_from_db()
    assert orphan.end_intent == "" and orphan.state == OrphanState.DELETING

    job = run_until(world, job, {JobState.ABORTED if verb == "delete" else JobState.DRAINED}, dt=2)
    counts = audit_counts(job)
    assert (counts[action], counts["pod_gone"]) == (1, 1)
    reason = "DefragDelete" if verb == "delete" else "DefragEvict"
    assert [e.message for e in world.kube.events(NS, reason)] == [
        entry.cause if verb == "delete" else f"Evicted by defrag job #{job.pk} (drain of {node})"]


def test_a_pod_gone_before_the_end_was_sent_is_not_audited_as_the_jobs(safe_job):
    """The contrast: a 404 to the request itself (no earlier try lost) is a pod that went by
    itself; its end is recorded as gone, not as the job's deletion."""
    world, job, orphan, ops = safe_job()
    job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
    # Between the abort's read of the pod and its DELETE, the pod is force-deleted by someone else.
    racing = Interleave(world.gateway, "delete", "pods", lambda: world.kube.core.delete_namespaced_pod(
        orphan.pod_name, NS, grace_period_seconds=0))
    job = defrag_job_step(job=job, gateway=racing, now=world.now())
    assert racing.fired and not world.kube.pod_exists(NS, orphan.pod_name)
    orphan.refresh_from_db()
    assert orphan.end_intent == "" and orphan.state == OrphanState.ORPHANED
    job = run_until(world, job, {JobState.ABORTED}, dt=2)
    counts = audit_counts(job)
    assert "pod_delete" not in counts and counts["pod_gone"] == 1

# ---- a real Celery worker --------------------------------------------------------------------------

@pytest.mark.slow
def test_a_celery_pool_process_killed_after_its_delete_leaves_it_to_its_successor_to_record_once(
        sim_cluster_factory, celery_processes, django_user_model, tmp_path):
    handle = sim_cluster_factory(scenario(knative_service(min_scale=3)), name="sim", speed=50.0)
    kube = Kube(handle.kubeconfig_path)
    for _ in range(200):                     # wall time: the cluster's clock runs
        if kube.actual_scale() == 3:
            break
        time.sleep(0.05)
    ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    node = kube.node_with_pods()
    [pod] = kube.pods(node=node)
    job = defrag_job_start(cluster=handle.cluster, node_name=node, actor=ops, poll_interval_seconds=0.5,
                           plan=defrag_discover(cluster=handle.cluster, node_name=node), enqueue=False)

    procs = celery_processes
    killed_once = tmp_path / "killed-once"
    procs.env.update(PYTHONPATH=str(ROOT), DEFRAG_CRASH_POINT="after-delete", DEFRAG_CRASH_ONCE=str(killed_once))
    procs.start("worker", "worker", "--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"defrag-end-{os.getpid()}@%h", "--loglevel=INFO",
                "-I", "tests.capacity.defrag_crash_worker")
    wait_for(lambda: "ready." in procs.log("worker"), "the worker is ready", procs)
    send(procs, job.pk)
    wait_for(lambda: DefragJob.objects.filter(pk=job.pk, state=JobState.SAFE).exists(), "the job is safe", procs)

    job = defrag_job_abort(job=DefragJob.objects.get(pk=job.pk), actor=ops, enqueue=False)
    send(procs, job.pk)
    wait_for(lambda: DefragJob.objects.get(pk=job.pk).state == JobState.ABORTED, "the abort ends the job", procs)
    assert killed_once.exists()                              # a pool process died right after its DELETE…
    assert "WorkerLostError" in procs.log("worker") or "exited by signal" in procs.log("worker")
    job.refresh_from_db()
    [deleted] = job_audit(job).filter(action="pod_delete")   # …and its successor recorded it, once
    assert deleted.actor == ops and deleted.cause == (
        f"{INTERRUPTED}Deleted by defrag job #{job.pk} (abort): its revision is back to scale")
    assert not kube.pod_exists(NS, pod.metadata.name) and not kube.node_cordoned(node)
    counts = audit_counts(job)
    assert (counts["node_uncordon"], counts["pod_delete"], counts["pod_gone"], counts["job_abort"]) == (1, 1, 1, 1)
    assert len(kube.events(NS, "DefragDelete")) == 1
