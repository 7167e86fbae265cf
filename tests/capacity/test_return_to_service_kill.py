"""A return to service whose process dies at its uncordon loses nothing: the intent it
committed before the patch says whose uncordon it was, and the next return to service of
the node, or the resume beat, records it then, once, under the operator who asked.

The crash is real: a separate process (`defrag_crash_worker.py`) runs the
return to service against this test's PostgreSQL database and simulated cluster and
SIGKILLs itself right after the uncordon patch landed (nothing of it committed), or right
before the patch. The tests then look as an operator would: the node, the job's audit
trail and log, the Events, the abort that ends the orphans.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from audit.selectors import entries_of_subject
from capacity.defrag import tasks
from capacity.defrag.models import DefragJob, JobState, OrphanState
from capacity.defrag.services import (
    RETURN_INTENT_LAPSE_SECONDS,
    ReturnUnconfirmed,
    defrag_discover,
    defrag_job_abort,
    defrag_job_start,
    defrag_return_intents_settle,
    node_return_to_service,
)
from clusters import kube
from clusters.errors import Unavailable
from defrag_cluster import NS, knative_service, run_until, scenario
from defrag_crash_worker import crash as crash_process

pytestmark = pytest.mark.django_db(transaction=True)

CLI = "cli:ops@bastion"


# ---- helpers ----------------------------------------------------------------------------------

def job_audit(job, action: str | None = None) -> list:
    entries = entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)
    return list(entries.filter(action=action) if action else entries)


def give_back(world, node: str, *, actor=None, job=None, gateway=None):
    return node_return_to_service(cluster=world.cluster, node=node, actor=actor, job=job,
                                  gateway=gateway or world.gateway, now=world.now(), enqueue=False)


def beat(world, *, after: float = 0.0) -> list[int]:
    return defrag_return_intents_settle(now=world.now() + timedelta(seconds=after), gateway=world.gateway,
                                        enqueue=False)


def stamp(at) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def crash(world, job: DefragJob, *, actor: str, point: str) -> None:
    """Return the job's node to service in a process of its own, killed at `point`."""
    crash_process("return-to-service", str(job.pk), actor, world.now().isoformat(), point)


@pytest.fixture
def safe_job(defrag_world, django_user_model):
    """A safe job on a cordoned node, one orphan still serving on it, and two operators."""
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    job = defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now(), enqueue=False,
                           poll_interval_seconds=2.0)
    job = run_until(world, job, {JobState.SAFE})
    assert world.kube.node_cordoned(node) and job.orphans.filter(state=OrphanState.ORPHANED).count() == 1
    ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    oncall = django_user_model.objects.create_superuser("oncall", "oncall@example.com", "pw")
    return world, node, job, ops, oncall


def returned_by_the_abort_and_ended(world, node, job) -> DefragJob:
    """The abort the return to service asked for ends the orphan; the node stays in service."""
    [orphan] = job.orphans.filter(state=OrphanState.ORPHANED)
    job = run_until(world, DefragJob.objects.get(pk=job.pk), {JobState.ABORTED}, dt=2)
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert not world.kube.node_cordoned(node)
    assert job.log[-1] == (f"Aborted: node {node} was returned to service by an operator (uncordoned before this "
                           f"abort); every orphan gone")
    return job


# ---- killed after the patch -------------------------------------------------------------------

@pytest.mark.parametrize("finder", ["the next return to service", "the resume beat"])
def test_a_return_to_service_killed_after_its_uncordon_is_recorded_once_under_its_operator(safe_job, finder,
                                                                                           monkeypatch):
    world, node, job, ops, oncall = safe_job
    asked_at = world.now()
    crash(world, job, actor=f"user:{ops.pk}", point="after-patch")

    # What the dead process left: the node takes pods, and nothing of it was recorded but its intent.
    assert not world.kube.node_cordoned(node)
    job.refresh_from_db()
    assert (job.return_intent_at, job.return_intent_by) == (asked_at, ops)
    assert not job_audit(job, "node_return_to_service") and not job_audit(job, "abort_request")
    assert job.abort_requested_at is None and job.state == JobState.SAFE
    assert not [line for line in job.log if "uncordoned" in line]

    recorded = (f"Node {node} was uncordoned by an earlier return to service (by ops at {stamp(asked_at)}) that "
                f"was interrupted before it was recorded; recorded now. Abort of defrag job #{job.pk} requested: "
                f"its 1 orphan(s) are deleted, each once its revision is back to scale.")
    world.advance(5)
    if finder == "the resume beat":
        # The beat task itself (every 10 s): it records the uncordon, and hands the abort it
        # asked for to a worker.
        queued = []
        monkeypatch.setattr(tasks.defrag_job_run, "delay", queued.append)
        assert tasks.defrag_jobs_resume() == 1 and queued == [job.pk]
        assert job.log[-2:] == [f"{recorded} (recorded by the resume beat)", "Abort requested by ops"]
        # The operator's next return to service finds it all done.
        done = give_back(world, node, actor=oncall, job=job)
        assert done.message == f"Node {node} was already schedulable; nothing to uncordon. Nothing changed."
        assert not done.uncordoned and not done.abort_requested
    else:
        done = give_back(world, node, actor=oncall, job=job)
        assert done.message == recorded
        assert not done.uncordoned and done.abort_requested
        assert job.log[-2:] == [f"{recorded} (recorded by oncall)", "Abort requested by ops"]
        assert beat(world) == []
    again = give_back(world, node, actor=oncall, job=job)
    assert again.message == f"Node {node} was already schedulable; nothing to uncordon. Nothing changed."
    assert beat(world, after=RETURN_INTENT_LAPSE_SECONDS) == []

    # The audit trail holds the uncordon once, under the operator who asked, when it was asked,
    # saying it was recorded after an interruption; and the abort it asked for, once.
    [entry] = job_audit(job, "node_return_to_service")
    assert (entry.actor, entry.actor_label, entry.at, entry.target) == (ops, "", asked_at, f"Node/{node}")
    assert (entry.old, entry.new) == ({"unschedulable": True}, {"unschedulable": False})
    assert entry.cause == (f"returned to service by an operator; defrag job #{job.pk} was safe; recorded after an "
                           f"interruption (its process stopped before recording it)")
    [abort] = job_audit(job, "abort_request")
    assert abort.actor == ops
    assert len(world.kube.events("default", "DefragReturnToService")) == 1
    job.refresh_from_db()
    assert job.return_intent_at is None and job.return_intent_owner == ""

    returned_by_the_abort_and_ended(world, node, job)
    assert len(job_audit(job, "node_return_to_service")) == 1 and len(job_audit(job, "abort_request")) == 1


def test_callers_that_meet_the_interrupted_uncordon_together_record_it_once(safe_job):
    world, node, job, ops, oncall = safe_job
    asked_at = world.now()
    crash(world, job, actor=f"user:{ops.pk}", point="after-patch")
    world.advance(5)

    start = threading.Barrier(3)
    results: dict[str, object] = {}

    def run(name, call):
        # Each caller its own connection (the row lock is what serialises them) and its own gateway.
        gateway = kube.KubeGateway.from_kubeconfig(world.handle.kubeconfig_path, name="sim", backoff=0.0,
                                                   sleep=lambda s: None)
        try:
            start.wait(timeout=30)
            results[name] = call(gateway)
        except Exception as exc:  # noqa: BLE001 - reported below
            results[name] = exc
        finally:
            connection.close()

    callers = {
        "ops": lambda gw: give_back(world, node, actor=ops, job=job, gateway=gw).message,
        "oncall": lambda gw: give_back(world, node, actor=oncall, job=job, gateway=gw).message,
        "beat": lambda gw: defrag_return_intents_settle(now=world.now(), gateway=gw, enqueue=False),
    }
    threads = [threading.Thread(target=run, args=(name, call)) for name, call in callers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not [r for r in results.values() if isinstance(r, Exception)], results

    recorders = [name for name in ("ops", "oncall") if "recorded now" in results[name]]
    recorders += ["beat"] if results["beat"] == [job.pk] else []
    assert len(recorders) == 1, results
    for name in {"ops", "oncall"} - set(recorders):
        assert results[name] == f"Node {node} was already schedulable; nothing to uncordon. Nothing changed."
    [entry] = job_audit(job, "node_return_to_service")
    assert (entry.actor, entry.at) == (ops, asked_at) and "recorded after an interruption" in entry.cause
    assert len(job_audit(job, "abort_request")) == 1
    assert len([line for line in DefragJob.objects.get(pk=job.pk).log if "recorded now" in line]) == 1


# ---- killed before the patch ------------------------------------------------------------------

def test_a_return_to_service_killed_before_its_uncordon_lapses_and_the_next_one_uncordons_once(safe_job):
    world, node, job, ops, oncall = safe_job
    asked_at = world.now()
    crash(world, job, actor=CLI, point="before-patch")

    assert world.kube.node_cordoned(node)
    job.refresh_from_db()
    assert (job.return_intent_at, job.return_intent_by, job.return_intent_label) == (asked_at, None, CLI)
    assert not job_audit(job, "node_return_to_service")
    # The beat leaves a cordoned node's intent to its own process for a while: it may be under way.
    assert beat(world) == []

    world.advance(5)
    done = give_back(world, node, actor=oncall, job=job)
    lapsed = (f"An earlier return to service (by {CLI} at {stamp(asked_at)}) had not uncordoned node {node}: "
              f"nothing was changed by it (it stopped before its uncordon, or a newer one took it over).")
    assert done.message == (f"Node {node} uncordoned: it takes new pods again. Abort of defrag job #{job.pk} "
                            f"requested: its 1 orphan(s) are deleted, each once its revision is back to scale. "
                            f"{lapsed}")
    assert done.uncordoned and done.abort_requested and not world.kube.node_cordoned(node)
    job.refresh_from_db()
    assert lapsed in job.log and job.return_intent_at is None

    # Audited once, as this operator's uncordon: the dead one changed nothing and is not audited.
    [entry] = job_audit(job, "node_return_to_service")
    assert (entry.actor, entry.at) == (oncall, world.now())
    assert entry.cause == f"returned to service by an operator; defrag job #{job.pk} was safe"
    [abort] = job_audit(job, "abort_request")
    assert abort.actor == oncall
    assert give_back(world, node, actor=ops, job=job).message.endswith("Nothing changed.")
    assert beat(world, after=RETURN_INTENT_LAPSE_SECONDS) == []
    returned_by_the_abort_and_ended(world, node, job)
    assert len(job_audit(job, "node_return_to_service")) == 1


def test_the_beat_lets_an_intent_on_a_still_cordoned_node_lapse_after_a_while_auditing_nothing(safe_job):
    world, node, job, ops, oncall = safe_job
    asked_at = world.now()
    crash(world, job, actor=f"user:{ops.pk}", point="before-patch")

    assert beat(world, after=RETURN_INTENT_LAPSE_SECONDS - 1) == []
    assert beat(world, after=RETURN_INTENT_LAPSE_SECONDS) == [job.pk]
    job.refresh_from_db()
    assert job.return_intent_at is None and world.kube.node_cordoned(node)
    assert job.log[-1] == (f"An earlier return to service (by ops at {stamp(asked_at)}) had not uncordoned node "
                           f"{node}: nothing was changed by it (it stopped before its uncordon, or a newer one took "
                           f"it over).")
    assert not job_audit(job, "node_return_to_service") and job.abort_requested_at is None
    assert job.state == JobState.SAFE


# ---- the patch's answer lost (no kill) --------------------------------------------------------

class AnswerLost:
    """The gateway, except that the node's uncordon answers 503 (after it landed, if `lands`)."""

    def __init__(self, gateway, *, lands: bool):
        self.gateway, self.lands = gateway, lands

    def __getattr__(self, name):
        return getattr(self.gateway, name)

    def patch(self, resource, name, body, **kwargs):
        if resource is not kube.NODES:
            return self.gateway.patch(resource, name, body, **kwargs)
        if self.lands:
            self.gateway.patch(resource, name, body, **kwargs)
        raise Unavailable("connection reset by peer", code=503)


def test_an_uncordon_whose_answer_is_lost_says_so_and_is_recorded_once_if_it_landed(safe_job):
    world, node, job, ops, oncall = safe_job
    with pytest.raises(ReturnUnconfirmed, match=rf"the uncordon of node '{node}' was sent, but its outcome is not "
                                                 rf"known .*the resume beat records it within 10 s"):
        give_back(world, node, actor=ops, job=job, gateway=AnswerLost(world.gateway, lands=True))
    assert not world.kube.node_cordoned(node) and not job_audit(job, "node_return_to_service")

    # An abort asked before anyone settles it says whose uncordon the node's is.
    defrag_job_abort(job=job, actor=oncall, now=world.now(), enqueue=False)
    job = returned_by_the_abort_and_ended(world, node, job)
    assert beat(world) == [job.pk]
    [entry] = job_audit(job, "node_return_to_service")
    assert entry.actor == ops and "recorded after an interruption" in entry.cause
    # The job was aborting already: the settle asks for no second abort.
    assert [e.actor for e in job_audit(job, "abort_request")] == [oncall]


def test_an_uncordon_refused_outright_leaves_the_node_cordoned_and_the_next_one_uncordons(safe_job):
    world, node, job, ops, oncall = safe_job
    with pytest.raises(ReturnUnconfirmed):
        give_back(world, node, actor=ops, job=job, gateway=AnswerLost(world.gateway, lands=False))
    assert world.kube.node_cordoned(node)
    done = give_back(world, node, actor=oncall, job=job)
    assert done.uncordoned and "had not uncordoned node" in done.message
    [entry] = job_audit(job, "node_return_to_service")
    assert entry.actor == oncall and "interruption" not in entry.cause


def test_the_command_says_it_does_not_know_when_the_answer_is_lost(safe_job, monkeypatch):
    from django.core.management import CommandError, call_command

    world, node, job, ops, oncall = safe_job
    real = kube.KubeGateway.patch

    def lost(self, resource, name, body, **kwargs):
        if resource is kube.NODES:
            real(self, resource, name, body, **kwargs)
            raise Unavailable("connection reset by peer", code=503)
        return real(self, resource, name, body, **kwargs)

    monkeypatch.setattr(kube.KubeGateway, "patch", lost)
    with pytest.raises(CommandError, match="^not known whether the node was uncordoned: the uncordon of node"):
        call_command("defrag", node, "--cluster", "sim", "--return-to-service", "--yes")
    monkeypatch.undo()
    done = give_back(world, node, actor=oncall, job=job)
    assert done.message.startswith(f"Node {node} was uncordoned by an earlier return to service (by cli:")
    [entry] = job_audit(job, "node_return_to_service")
    assert entry.actor is None and entry.actor_label.startswith("cli:")
