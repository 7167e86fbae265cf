"""An abort-stuck job is looked at again by the product on its own (the resume beat, every
CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS): an orphan whose revision was scaled to zero since, or
whose replacements became ready since, is ended as the abort ends it; the job ends
`aborted` once none is left. Nothing changed: nothing is written.

The beat and its step tasks run in this process on the simulated cluster's clock, through
the product's own gateway to the simulated cluster."""
from __future__ import annotations

import pytest

from capacity.defrag import tasks
from capacity.defrag.models import DefragJob, JobState, OrphanState
from capacity.defrag.services import defrag_job_abort
from capacity.selectors import defrag_job_progress
from config import clock
from defrag_builders import make_pod
from defrag_cluster import NS, REVISION, knative_service, run_until, scenario
from test_defrag_scale_to_zero import asleep, scale_to_zero
from test_defrag_services import (
    WorkerKilled,
    audit_counts,
    crash_on,
    job_audit,
    kubernetes_node,
    start_job,
    step,
    world_without_room,
)

pytestmark = pytest.mark.django_db

RECHECK = "Checked again every 5 min: an orphan that can end by then (its revision scaled to zero, or its " \
          "replacements ready) is deleted; the abort ends when none is left."


def stuck(defrag_world, settings, *, orphans: str = ""):
    """The orphan of n1 cannot end (n2 is full): its abort stops as abort-stuck. Returns (world, job)."""
    settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS = 60
    world = world_without_room(defrag_world)
    job = run_until(world, start_job(world, "n1", poll_interval_seconds=5), {JobState.WAITING}, dt=0)
    job = defrag_job_abort(job=job, actor=None, orphans=orphans, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORT_STUCK}, dt=10, max_steps=20)
    assert RECHECK in job.error and job.orphans.get().state == OrphanState.ORPHANED
    assert (job.next_check_at - world.now()).total_seconds() == 300
    # What the job page polls (and `defrag --json` prints) says when the next check is.
    assert defrag_job_progress(job=job)["next_check_at"] == job.next_check_at.isoformat()
    return world, job


def beat(world, monkeypatch) -> list[str]:
    """One firing of the resume beat on the cluster's clock, each step task it queues run here
    at once: what the product does on its own. The states the tasks left their jobs in."""
    monkeypatch.setattr(clock, "now", world.now)
    ran: list[str] = []
    monkeypatch.setattr(tasks.defrag_job_run, "delay",
                        lambda job_id: ran.append(tasks.defrag_job_run.apply(args=(job_id,)).get()))
    tasks.defrag_jobs_resume()
    return ran


def until_checked(world, monkeypatch, job: DefragJob) -> DefragJob:
    """Move the clock to the job's next check and let the beat fire."""
    job.refresh_from_db()
    world.advance(max((job.next_check_at - world.now()).total_seconds(), 0))
    assert beat(world, monkeypatch), "the beat checked no job"
    job.refresh_from_db()
    return job


def until_aborted(world, monkeypatch, job: DefragJob, checks: int = 10) -> DefragJob:
    for _ in range(checks):
        job = until_checked(world, monkeypatch, job)
        if job.state != JobState.ABORT_STUCK:
            return job
    raise AssertionError(f"still {job.state}: {job.log[-4:]}")


def test_an_orphan_whose_revision_is_scaled_to_zero_after_the_abort_stuck_is_deleted_and_the_job_ends(
        defrag_world, settings, monkeypatch):
    world, job = stuck(defrag_world, settings)
    [orphan] = job.orphans.all()
    scale_to_zero(world)                                    # the org went dormant meanwhile
    assert beat(world, monkeypatch) == []                   # not due yet: the beat leaves it alone
    assert world.kube.pod_exists(NS, orphan.pod_name)

    job = until_aborted(world, monkeypatch, job)
    assert job.state == JobState.ABORTED, job.log[-4:]
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    why = f"revision {REVISION} is scaled to zero, no replacement needed"
    assert f"Checked again (abort-stuck): {NS}/{orphan.pod_name} deleted: {why}. 1 orphan(s) still tracked." in job.log
    assert job.log[-2:] == [f"Checked again (abort-stuck): {NS}/{orphan.pod_name} gone (its deletion finished). "
                            f"No orphan is left: the abort ends now.",
                            "Aborted: node n1 uncordoned; every orphan gone"]
    [deleted] = job_audit(job).filter(action="pod_delete")
    assert (deleted.target, deleted.cause) == (
        f"Pod/{NS}/{orphan.pod_name}", f"Deleted by defrag job #{job.pk} (abort-stuck, checked again): {why}")
    assert [e.message for e in world.kube.events(NS, "DefragDelete")] == [deleted.cause]
    assert audit_counts(job)["job_abort"] == 1 and not job.is_live
    world.advance(300)
    assert world.kube.pods(revision=REVISION) == [] and asleep(world)   # nothing woken for it


def test_an_orphan_whose_replacement_became_ready_after_the_abort_stuck_is_ended(
        defrag_world, settings, monkeypatch):
    world, job = stuck(defrag_world, settings)
    [orphan] = job.orphans.all()
    world.kube.core.delete_namespaced_pod("hog", NS)        # room frees on n2
    world.advance(60)
    [replacement] = [p for p in world.kube.pods(revision=REVISION) if p.metadata.owner_references]
    assert replacement.spec.node_name == "n2" and replacement.status.phase == "Running"

    job = until_aborted(world, monkeypatch, job)
    assert job.state == JobState.ABORTED, job.log[-4:]
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert (f"Checked again (abort-stuck): {NS}/{orphan.pod_name} deleted: its revision is back to scale. "
            f"1 orphan(s) still tracked.") in job.log
    assert job.log[-1] == "Aborted: node n1 uncordoned; every orphan gone"
    assert job_audit(job).get(action="pod_delete").cause == \
        f"Deleted by defrag job #{job.pk} (abort-stuck, checked again): its revision is back to scale"
    assert world.kube.actual_scale() == 1                   # the replacement serves


def test_checks_that_find_nothing_changed_write_nothing(defrag_world, settings, monkeypatch):
    world, job = stuck(defrag_world, settings)
    log_seq, audits, message = job.log_seq, audit_counts(job), job.error
    events = [(e.reason, e.message) for e in world.kube.events(NS) + world.kube.events("default")]
    for _ in range(3):
        before = job.next_check_at
        job = until_checked(world, monkeypatch, job)
        assert job.state == JobState.ABORT_STUCK
        assert (job.next_check_at - before).total_seconds() >= 300          # checked, and the next check is set
        world.advance(60)
        assert beat(world, monkeypatch) == []               # rests between checks
    assert (job.log_seq, audit_counts(job), job.error) == (log_seq, audits, message)
    assert [(e.reason, e.message) for e in world.kube.events(NS) + world.kube.events("default")] == events
    assert world.kube.pod_exists(NS, job.orphans.get().pod_name)


def test_keep_keeps_only_orphans_that_cannot_end_an_orphan_of_a_revision_gone_to_zero_is_ended(
        defrag_world, settings, monkeypatch):
    world, job = stuck(defrag_world, settings, orphans="keep")
    assert job.error.startswith("Abort stopped, orphans kept as the operator chose.")
    [orphan] = job.orphans.all()
    scale_to_zero(world)
    job = until_aborted(world, monkeypatch, job)
    assert job.state == JobState.ABORTED, job.log[-4:]
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert any(line.startswith(f"Checked again (abort-stuck): {NS}/{orphan.pod_name} deleted: revision {REVISION} "
                               f"is scaled to zero") and "The operator chose to keep the orphans that cannot end; "
               "these could end (no replacement is needed for them now), so they were deleted." in line
               for line in job.log)


@pytest.mark.parametrize("gone_first", [False, True])
def test_a_worker_killed_mid_check_after_the_delete_leaves_it_for_the_next_check_to_record_once(
        defrag_world, settings, monkeypatch, gone_first):
    world, job = stuck(defrag_world, settings)
    [orphan] = job.orphans.all()
    scale_to_zero(world)
    world.advance((job.next_check_at - world.now()).total_seconds())
    sent_at = world.now()
    fired = crash_on(monkeypatch, "pod_delete")             # killed after the DELETE, before its record
    with pytest.raises(WorkerKilled):
        step(world, job)
    assert fired == ["pod_delete"]
    job.refresh_from_db()
    assert job.state == JobState.ABORT_STUCK and job.orphans.get().state == OrphanState.ORPHANED
    assert "pod_delete" not in audit_counts(job)            # nothing of the check was recorded…
    if gone_first:
        world.advance(60)                                   # …and the pod finished terminating before the next
        assert not world.kube.pod_exists(NS, orphan.pod_name)
    job = run_until(world, job, {JobState.ABORTED}, dt=5, max_steps=40)   # …the next checks finish it
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert world.gateway.calls[("delete", "pods")] == 1                  # deleted once
    counts = audit_counts(job)
    assert (counts["pod_delete"], counts["pod_gone"], counts["job_abort"]) == (1, 1, 1)
    deleted = job_audit(job).get(action="pod_delete")
    assert deleted.at == sent_at and deleted.cause == (
        f"recorded after an interruption: Deleted by defrag job #{job.pk} "
        f"(abort-stuck, checked again): revision {REVISION} is scaled to zero, no replacement needed")
    assert len(world.kube.events(NS, "DefragDelete")) == 1


def test_a_check_that_finds_a_ready_count_changed_writes_the_stuck_message_again_with_it(
        defrag_world, settings, monkeypatch):
    """Two 4-GPU orphans on n1, n2 full: 0/2 ready without them. Room frees for one replacement:
    1/2, and still neither orphan can end — the message an operator reads says 1/2 now."""
    settings.CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS = 60
    world = defrag_world(scenario(knative_service(min_scale=2, gpus=4), nodes=1))
    world.kube.core.create_node(kubernetes_node("n2"))
    world.kube.core.create_namespaced_pod(NS, make_pod("hog", namespace=NS, node="n2", gpus=8))
    world.advance(10)
    job = run_until(world, start_job(world, "n1", poll_interval_seconds=5), {JobState.WAITING}, dt=0)
    job = defrag_job_abort(job=job, actor=None, orphans="", now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORT_STUCK}, dt=10, max_steps=20)
    assert f"revision {NS}/{REVISION} has 0/2 ready without its orphan(s)" in job.error
    stuck_audits = audit_counts(job)["job_abort_stuck"]

    world.kube.core.delete_namespaced_pod("hog", NS)        # half of n2 frees: one replacement fits
    world.kube.core.create_namespaced_pod(NS, make_pod("hog-half", namespace=NS, node="n2", gpus=4))
    world.advance(60)
    job = until_checked(world, monkeypatch, job)
    assert job.state == JobState.ABORT_STUCK and all(o.state == OrphanState.ORPHANED for o in job.orphans.all())
    assert f"revision {NS}/{REVISION} has 1/2 ready without its orphan(s)" in job.error
    assert "has 0/2 ready" not in job.error
    assert job.log[-1] == job.error
    assert job.log[-2] == (f"Checked again (abort-stuck): revision {NS}/{REVISION} has 1/2 ready without its "
                           f"orphan(s) (was 0/2); no orphan can end yet.")
    assert audit_counts(job)["job_abort_stuck"] == stuck_audits + 1   # what the message says, recorded
    assert "pod_delete" not in audit_counts(job)                       # nothing of the customer's ended

    log_seq, message = job.log_seq, job.error
    job = until_checked(world, monkeypatch, job)                        # the same counts: nothing written
    assert (job.log_seq, job.error) == (log_seq, message)
