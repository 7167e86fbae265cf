"""What a second defrag and a refused drain say, in every state the node's job can be in:
the one way out that works in that state, with the exact command."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from capacity.defrag.models import DefragJob, JobState
from test_defrag_views import objects

pytestmark = pytest.mark.django_db

AT = "2026-01-01T00:00:00Z"
ABORT = "manage.py defrag n1 --cluster sim --abort"
DRAIN = "manage.py defrag n1 --cluster sim --drain"
DELETE_ORPHANS = "manage.py defrag n1 --cluster sim --abort --delete-orphans"


def job_in(state: str, **fields) -> DefragJob:
    from clusters.models import Cluster

    return DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=state,
                                    created_at=AT, **fields)


@pytest.mark.parametrize("state, extra, way_out", [
    (JobState.CONFIRMED, {}, f"abort it: {ABORT}"),
    (JobState.RECORDED, {}, f"abort it: {ABORT}"),
    (JobState.CORDONED, {}, f"abort it: {ABORT}"),
    (JobState.WAITING, {}, f"abort it: {ABORT}"),
    (JobState.BLOCKED, {}, f"abort it: {ABORT}"),
    (JobState.FAILED, {}, f"abort it: {ABORT}"),
    (JobState.SAFE, {}, f"drain the node ({DRAIN}) or abort the job ({ABORT})"),
    (JobState.SAFE, {"drain_requested_at": AT},
     f"its drain is under way: wait until the job reads drained (or stop the drain: {ABORT})"),
    (JobState.DRAINING, {}, f"its drain is under way: wait until the job reads drained (or stop the drain: {ABORT})"),
    (JobState.BLOCKED, {"abort_requested_at": AT}, "its abort is under way: wait until the job reads aborted"),
    (JobState.ABORTING, {"abort_requested_at": AT, "abort_started_at": AT},
     "its abort is under way: wait until the job reads aborted"),
    (JobState.ABORT_STUCK, {"abort_requested_at": AT, "abort_started_at": AT},
     "its abort waits for room for its orphans' replacements and ends once they are ready; to end it now, delete "
     f"the orphans anyway: {DELETE_ORPHANS} (capacity drops)"),
])
def test_a_second_defrag_of_a_held_node_names_the_way_out_that_works_in_the_jobs_state(sim_cluster_factory, state,
                                                                                      extra, way_out):
    sim_cluster_factory(objects(), name="sim")
    job = job_in(state, **extra)
    with pytest.raises(CommandError) as said:
        call_command("defrag", "n1", "--cluster", "sim", "--yes")
    assert str(said.value) == f"node 'n1' already has a live defrag job #{job.pk} ({state}); {way_out}"
    assert DefragJob.objects.count() == 1


@pytest.mark.parametrize("state, extra, why", [
    (JobState.CONFIRMED, {}, f"it has not reported the node safe yet; wait until it reads safe, then drain ({DRAIN})"),
    (JobState.RECORDED, {}, f"it has not reported the node safe yet; wait until it reads safe, then drain ({DRAIN})"),
    (JobState.CORDONED, {}, f"it has not reported the node safe yet; wait until it reads safe, then drain ({DRAIN})"),
    (JobState.WAITING, {}, f"it has not reported the node safe yet; wait until it reads safe, then drain ({DRAIN})"),
    (JobState.BLOCKED, {}, f"pods other than models still block the node, so it cannot be drained; abort it: {ABORT}"),
    (JobState.FAILED, {}, f"it failed before reporting the node safe, so it cannot be drained; abort it: {ABORT}"),
    (JobState.ABORTING, {"abort_requested_at": AT, "abort_started_at": AT},
     "its abort is under way: an aborted job is not drained; wait until it reads aborted"),
    (JobState.ABORT_STUCK, {"abort_requested_at": AT, "abort_started_at": AT},
     f"an aborted job is not drained; to end its orphans now, delete them anyway: {DELETE_ORPHANS} (capacity drops)"),
])
def test_drain_of_a_job_that_cannot_drain_says_what_works_instead(sim_cluster_factory, state, extra, why):
    sim_cluster_factory(objects(), name="sim")
    job = job_in(state, **extra)
    with pytest.raises(CommandError) as said:
        call_command("defrag", "n1", "--cluster", "sim", "--drain", "--yes")
    joiner = " and " if state == JobState.ABORTING else ": "
    assert str(said.value) == f"job #{job.pk} is {state}{joiner}{why}"
    assert DefragJob.objects.get().drain_requested_at is None


def test_drain_of_a_safe_job_with_an_abort_pending_says_the_abort_is_under_way(sim_cluster_factory):
    sim_cluster_factory(objects(), name="sim")
    job = job_in(JobState.SAFE, abort_requested_at=AT)
    with pytest.raises(CommandError) as said:
        call_command("defrag", "n1", "--cluster", "sim", "--drain", "--yes")
    assert str(said.value) == (f"job #{job.pk} is safe and its abort is under way: an aborted job is not drained; "
                               f"wait until it reads aborted")
