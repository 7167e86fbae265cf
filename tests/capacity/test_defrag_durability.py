"""Defrag jobs that race operators and each other, leases, an abort with no room, and
messages that say what was done — on the simulated cluster, through the real client."""
from __future__ import annotations

from datetime import timedelta

import pytest

from capacity.defrag import tasks
from audit.selectors import entries_of_subject
from capacity.defrag.models import DefragJob, JobState, OrphanState
from capacity.defrag.services import (
    LEASE_SECONDS,
    defrag_job_abort,
    defrag_job_lease_acquire,
    defrag_job_lease_release,
    defrag_job_lease_renew,
    defrag_job_step,
    defrag_jobs_due,
)
from config.schedule import SCHEDULES
from defrag_builders import make_node
from defrag_cluster import NS, REVISION, knative_service, run_until, scenario
from test_defrag_services import audit_counts, start_job, step, world_without_room

pytestmark = pytest.mark.django_db


def job_audit(job):
    """The job's entries in the audit trail, oldest first."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)


class Interleave:
    """A gateway for one runner that lets `meanwhile()` run the first time the runner makes
    the call `(verb, resource)`: another party acts between this runner's load and its record."""

    def __init__(self, gateway, verb: str, resource: str, meanwhile):
        self.gateway, self.verb, self.resource, self.meanwhile = gateway, verb, resource, meanwhile
        self.fired = False

    def __getattr__(self, name):
        real = getattr(self.gateway, name)
        if name != self.verb:
            return real

        def call(resource, *args, **kwargs):
            if not self.fired and resource.plural == self.resource:
                self.fired = True
                self.meanwhile()
            return real(resource, *args, **kwargs)

        return call


def test_an_abort_landing_between_a_workers_load_and_its_save_is_not_overwritten(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    world.advance(30)                                       # the replacement is Ready: the next check says safe
    job_id = job.pk

    def operator_aborts():
        defrag_job_abort(job=DefragJob.objects.get(pk=job_id), actor=None, now=world.now(), enqueue=False)

    racing = Interleave(world.gateway, "get", "podautoscalers", operator_aborts)
    job = defrag_job_step(job=job, gateway=racing, now=world.now())
    assert racing.fired
    assert job.state == JobState.WAITING                    # the worker's "safe" lost the compare…
    assert job.abort_requested_at is not None and job.abort_pending  # …and the abort is still there
    assert "safe" not in " ".join(job.log[-2:]).lower()
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert not world.kube.node_cordoned(node)
    assert [a for a in job_audit(job).values_list("action", flat=True)
            if a in ("abort_request", "job_safe", "node_uncordon", "job_abort")] == [
        "abort_request", "node_uncordon", "job_abort"]           # nothing recorded over the abort


def test_an_abort_racing_a_step_that_moves_the_state_wins(defrag_world):
    """The worker orphans the pod while the operator aborts: the abort wins and is taken up next."""
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.CORDONED}, dt=0)

    def operator_aborts():
        defrag_job_abort(job=DefragJob.objects.get(pk=job.pk), actor=None, now=world.now(), enqueue=False)

    job = defrag_job_step(job=job, gateway=Interleave(world.gateway, "patch", "pods", operator_aborts),
                          now=world.now())
    # The pod was orphaned (announced first as planned), but the step's record lost the
    # compare to the abort: the abort is taken up next and ends the planned orphan too.
    assert job.state == JobState.CORDONED and job.abort_pending
    job = step(world, job)
    assert job.state == JobState.ABORTING
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert not world.kube.node_cordoned(node)
    assert job.orphans.get().state == OrphanState.GONE


def test_two_runners_stepping_one_aborting_job_record_each_side_effect_once(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = step(world, job)                                  # takes up the abort, uncordons
    world.advance(30)                                       # the replacement is Ready: the orphan may go
    runner_a = DefragJob.objects.get(pk=job.pk)
    runner_b = DefragJob.objects.get(pk=job.pk)

    def a_steps_meanwhile():
        defrag_job_step(job=runner_a, gateway=world.gateway, now=world.now())

    # B reads the orphan's pod; A deletes it and records that; B's record must not land.
    defrag_job_step(job=runner_b, gateway=Interleave(world.gateway, "get", "pods", a_steps_meanwhile),
                    now=world.now())
    for _ in range(3):                                      # both finish the job, turn by turn
        world.advance(40)
        defrag_job_step(job=DefragJob.objects.get(pk=job.pk), gateway=world.gateway, now=world.now())
        defrag_job_step(job=runner_b, gateway=world.gateway, now=world.now())
    job.refresh_from_db()
    assert job.state == JobState.ABORTED
    counts = audit_counts(job)
    assert (counts["node_uncordon"], counts["pod_delete"], counts["pod_gone"], counts["job_abort"]) == (1, 1, 1, 1)
    assert world.gateway.calls[("delete", "pods")] == 1
    assert len(world.kube.events(NS, "DefragDelete")) == 1


def test_two_runners_finishing_an_abort_at_once_record_it_once(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = step(world, job)                                  # uncordoned
    # A second runner loaded the job before the first uncordon was recorded: it tries again.
    stale = DefragJob.objects.get(pk=job.pk)
    stale.version, stale.abort_node_outcome = 0, ""
    from capacity.defrag.services import abort, record

    record._loaded(stale)
    with pytest.raises(record.StaleJob):
        abort._abort_node(stale, world.gateway, world.now())
    assert audit_counts(job)["node_uncordon"] == 1


def test_leases_one_worker_at_a_time_and_a_dead_workers_lease_runs_out(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)
    now = world.now()
    assert defrag_job_lease_acquire(job_id=job.pk, owner="w1", now=now)
    assert not defrag_job_lease_acquire(job_id=job.pk, owner="w2", now=now + timedelta(seconds=30))
    assert defrag_jobs_due(now=now + timedelta(seconds=30)) == []          # w1 holds it
    later = now + timedelta(seconds=LEASE_SECONDS + 1)                      # w1 died: no heartbeat
    assert defrag_jobs_due(now=later) == [job.pk]
    assert defrag_job_lease_acquire(job_id=job.pk, owner="w2", now=later)
    assert not defrag_job_lease_renew(job_id=job.pk, owner="w1", now=later)  # w1 learns it lost the job
    job.refresh_from_db()
    assert job.lease_owner == "w2" and job.lease_expires_at <= later + timedelta(minutes=1)
    defrag_job_lease_release(job_id=job.pk, owner="w2")
    assert defrag_jobs_due(now=later) == [job.pk]


def test_the_step_task_leaves_a_leased_job_alone_and_the_beat_requeues_only_unowned_due_jobs(
        defrag_world, monkeypatch, settings):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = start_job(world, node)
    assert defrag_job_lease_acquire(job_id=job.pk, owner="other-worker", now=world.now())
    monkeypatch.setattr(tasks.clock, "now", world.now)
    assert tasks.defrag_job_run.apply(args=(job.pk,)).get() == "leased"
    job.refresh_from_db()
    assert job.state == JobState.CONFIRMED and not world.kube.node_cordoned(node)

    queued = []
    monkeypatch.setattr(tasks.defrag_job_run, "delay", lambda job_id: queued.append(job_id))
    assert tasks.defrag_jobs_resume() == 0                   # its owner's lease still runs
    world.advance(LEASE_SECONDS + 1)                         # the owner was killed: its lease ran out
    assert tasks.defrag_jobs_resume() == 1 and queued == [job.pk]
    # The beat that does this runs every minute, and the task survives a lost worker.
    [resume] = [s for s in SCHEDULES if s.task == "capacity.tasks.defrag_jobs_resume"]
    assert resume.every_seconds <= 60
    assert tasks.defrag_job_run.acks_late and tasks.defrag_job_run.reject_on_worker_lost
    from django.conf import settings as django_settings

    assert django_settings.CELERY_TASK_REJECT_ON_WORKER_LOST


def no_room_behind_a_second_job(defrag_world, settings):
    """n1 holds the only model pod (8 GPUs); n2 is empty but held cordoned by a safe job:
    the orphan's replacement fits only where the orphan is."""
    settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS = 60
    world = defrag_world(scenario(knative_service(min_scale=1, gpus=8), nodes=1))
    world.kube.core.create_node(make_node("n2"))
    world.advance(5)
    holder = run_until(world, start_job(world, "n2"), {JobState.SAFE}, dt=0)
    job = run_until(world, start_job(world, "n1"), {JobState.WAITING}, dt=0)
    world.advance(30)
    job = step(world, job)
    assert job.state == JobState.WAITING                    # the replacement cannot be scheduled
    return world, holder, job


def test_an_abort_with_no_room_stops_at_its_deadline_naming_what_holds_it_then_delete_anyway_ends_it(
        defrag_world, settings):
    world, holder, job = no_room_behind_a_second_job(defrag_world, settings)
    [orphan] = job.orphans.all()
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = step(world, job)
    assert job.state == JobState.ABORTING and not world.kube.node_cordoned("n1")
    job = run_until(world, job, {JobState.ABORT_STUCK, JobState.ABORTED}, dt=10, max_steps=20)
    assert job.state == JobState.ABORT_STUCK
    assert world.now() - job.abort_started_at < timedelta(seconds=60 + 11)   # within its deadline (+1 poll)
    message = job.error
    assert message.startswith("Abort stuck after 6")
    assert f"revision {NS}/{REVISION} has 0/1 ready without its orphan(s) {NS}/{orphan.pod_name} (8 GPU(s) on n1)" \
        in message
    assert "is Pending (0/2 nodes are available" in message
    assert f"node n2 (8 free GPU(s), cordoned by defrag job #{holder.pk} (safe))" in message
    assert "keep the orphans" in message and "delete them anyway" in message
    assert job.log[-1] == message
    assert job.is_live and world.kube.pod_exists(NS, orphan.pod_name)   # still serving, still tracked
    assert world.kube.node_cordoned("n2")                              # the other job's node is untouched
    assert [e.message for e in world.kube.events("default", "DefragAbortStuck")] == [message]
    assert job_audit(job).filter(action="job_abort_stuck").count() == 1

    world.advance(600)
    assert step(world, job).state == JobState.ABORT_STUCK               # no silent wait: it rests
    job = defrag_job_abort(job=job, actor=None, orphans="delete", now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    deleted = job_audit(job).get(action="pod_delete")
    assert deleted.new == {"forced": True, "ready": 0, "wanted": 1}
    assert any("deleted as the operator chose: revision" in line and "(capacity drops)" in line for line in job.log)
    assert job.log[-1] == "Aborted: node n1 uncordoned; every orphan gone"
    world.advance(30)
    [replacement] = world.kube.pods(revision=REVISION)
    assert replacement.spec.node_name == "n1"                           # the room the orphan held


def test_an_abort_choosing_to_keep_orphans_stops_at_once_and_keeps_them_serving(defrag_world, settings):
    world, holder, job = no_room_behind_a_second_job(defrag_world, settings)
    [orphan] = job.orphans.all()
    job = defrag_job_abort(job=job, actor=None, orphans="keep", now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORT_STUCK}, dt=1, max_steps=5)
    assert job.error.startswith("Abort stopped, orphans kept as the operator chose.")
    assert "this job keeps tracking them" in job.error
    assert world.kube.core.read_namespaced_pod(orphan.pod_name, NS).status.phase == "Running"
    assert job.orphans.get().state == OrphanState.ORPHANED and job.is_live
    assert not world.kube.node_cordoned("n1") and world.kube.node_cordoned("n2")


def test_defrag_of_a_node_the_operator_cordoned_says_so_and_abort_leaves_it_cordoned(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    world.kube.core.patch_node(node, {"spec": {"unschedulable": True}})   # the operator's own cordon
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    text = "\n".join(job.log)
    assert f"Node {node} was already cordoned before this job; left cordoned (an abort will not uncordon it)." \
        in text
    assert "has been cordoned" not in text
    assert [e.message for e in world.kube.events("default", "DefragCordon")] == [
        f"Node {node} was already cordoned before this job; left cordoned (an abort will not uncordon it)."]
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    text = "\n".join(job.log)
    assert f"Node {node} left cordoned (it was cordoned before the job, not by it)" in text
    assert "uncordoned" not in text.replace("not uncordon", "")
    assert job.log[-1] == f"Aborted: node {node} left cordoned (it was cordoned before the job, not by it); " \
                          f"every orphan gone"
    assert world.kube.node_cordoned(node)
    counts = audit_counts(job)
    assert "node_uncordon" not in counts and "node_cordon" not in counts and counts["node_already_cordoned"] == 1


def test_abort_of_a_node_someone_else_uncordoned_says_so(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    world.kube.core.patch_node(node, {"spec": {"unschedulable": False}})
    job = defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=5)
    assert f"Node {node} was already schedulable (uncordoned outside this job)" in job.log
    assert "node_uncordon" not in audit_counts(job)


def test_a_job_log_keeps_its_head_and_its_end_and_numbers_every_line(defrag_world):
    world = world_without_room(defrag_world)
    # 450 polls write well over the 500 lines a job keeps (about 1.7 lines a poll).
    job = run_until(world, start_job(world, "n1", timeout_seconds=450, poll_interval_seconds=1),
                    {JobState.WAITING}, dt=0)
    job = run_until(world, job, {JobState.FAILED}, dt=1, max_steps=600)
    assert job.log_seq > 650
    kept = list(job.log_lines.values_list("seq", flat=True))
    assert len(kept) == 500 and kept[:100] == list(range(1, 101)) and kept[-1] == job.log_seq
    assert job.log[0] == "Found pods to defrag:"
    assert job.log[100] == f"… {job.log_seq - 500} line(s) not kept …"
    assert job.log[-1] == job.error and job.error.startswith("Timed out after 450s")


def _queued_messages() -> list:
    """Every message waiting on the queue defrag steps run on (config/queues.py), in the
    in-memory broker (taken off it)."""
    from config.celery import app
    from config.queues import ROUTES

    messages = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(ROUTES["capacity.tasks.defrag_job_run"]["queue"], no_ack=True)
        while True:
            try:
                messages.append(queue.get(block=False))
            except queue.Empty:
                return messages


def test_a_start_and_an_abort_each_queue_the_step_task_for_a_worker_once_committed(
        defrag_world, django_capture_on_commit_callbacks):
    """Services queue their task by name: the message a worker receives is the step task's
    own, with its job id and the default priority lane, and only after the request commits."""
    from capacity.defrag.services import defrag_discover, defrag_job_start
    from config.celery import app

    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    _queued_messages()  # whatever earlier tests left
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now(),
                               poll_interval_seconds=2.0)
    assert callbacks and _queued_messages() == [], "nothing is queued before the job row is committed"
    for callback in callbacks:
        callback()
    with django_capture_on_commit_callbacks(execute=True):
        defrag_job_abort(job=job, actor=None, now=world.now())

    messages = _queued_messages()
    assert [(m.headers["task"], m.decode()[0], m.properties.get("priority")) for m in messages] == [
        ("capacity.tasks.defrag_job_run", [job.pk], app.conf.task_default_priority)] * 2
    registered = app.tasks["capacity.tasks.defrag_job_run"]
    assert registered.acks_late and registered.reject_on_worker_lost


def test_a_start_the_broker_cannot_take_is_recorded_said_in_its_log_and_left_to_the_resume_beat(
        defrag_world, django_capture_on_commit_callbacks, monkeypatch):
    """The job row is the intent: a broker that refuses the message does not make the start
    an error (the operator would retry and meet "already has a live job"); the job's log says
    it waits for the resume beat, and that beat's query finds it due."""
    from capacity.defrag import services as defrag_services
    from capacity.defrag.services import defrag_discover, defrag_job_start, jobs

    def broker_down(*args, **kwargs):
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    monkeypatch.setattr(jobs, "task_send", broker_down)
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    with django_capture_on_commit_callbacks(execute=True):
        job = defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now())
    job.refresh_from_db()
    assert job.state == JobState.CONFIRMED
    assert job.log[-1] == ("Could not hand the job to a worker now (ConnectionRefusedError: [Errno 111] Connection "
                           f"refused); the resume beat picks it up within {defrag_services.RESUME_PROMISE}.")
    assert job.pk in defrag_jobs_due(now=world.now())
