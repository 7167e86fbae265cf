"""Returning a node to service (uncordon) after a defrag job: service, panel and CLI, on the
simulated cluster through the official client. The simulated clock is moved, nothing sleeps."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from capacity.defrag.services import (
    DefragError,
    defrag_discover,
    defrag_job_drain,
    defrag_job_start,
    node_return_to_service,
)
from audit.selectors import entries_of_subject
from capacity.defrag.models import DefragJob, JobState, OrphanState
from defrag_builders import make_node
from defrag_cluster import NS, knative_service, run_until, scenario

pytestmark = pytest.mark.django_db

RETURN_PERMISSION = "return_to_service_defragjob"


def job_audit(job):
    """The job's entries in the audit trail, oldest first."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)


def start_job(world, node: str) -> DefragJob:
    plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=world.gateway)
    return defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, now=world.now(), enqueue=False,
                            poll_interval_seconds=2.0)


def give_back(world, node: str, *, actor=None, job=None):
    return node_return_to_service(cluster=world.cluster, node=node, actor=actor, job=job, gateway=world.gateway,
                                  now=world.now(), enqueue=False)


def returns(job) -> list:
    entries = job_audit(job)
    return list(entries.filter(action="node_return_to_service"))


@pytest.fixture
def safe_job(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.SAFE})
    assert world.kube.node_cordoned(node)
    return world, node, job


def test_a_safe_node_returns_to_service_once_and_its_orphans_are_ended_by_the_abort_it_asks(safe_job,
                                                                                         django_user_model):
    world, node, job = safe_job
    ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    [orphan] = job.orphans.filter(state=OrphanState.ORPHANED)

    done = give_back(world, node, actor=ops, job=job)
    assert not world.kube.node_cordoned(node)
    assert done.uncordoned and done.abort_requested
    assert done.message == (f"Node {node} uncordoned: it takes new pods again. Abort of defrag job #{job.pk} "
                            f"requested: its 1 orphan(s) are deleted, each once its revision is back to scale.")
    [audit] = returns(job)
    assert (audit.actor, audit.target, audit.old, audit.new) == (ops, f"Node/{node}", {"unschedulable": True},
                                                                 {"unschedulable": False})
    assert audit.cause == f"returned to service by an operator; defrag job #{job.pk} was safe"

    # Idempotent: the second time nothing changes and it says so.
    again = give_back(world, node, actor=ops, job=job)
    assert again.message == f"Node {node} was already schedulable; nothing to uncordon. Nothing changed."
    assert not again.uncordoned and len(returns(job)) == 1

    # The abort the return asked for ends the orphan; the node stays in service, and no drain is possible.
    with pytest.raises(DefragError, match="its abort is under way"):
        defrag_job_drain(job=job, actor=ops, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.ABORTED}, dt=2)
    assert not world.kube.pod_exists(NS, orphan.pod_name)
    assert not world.kube.node_cordoned(node)
    # The abort says who uncordoned the node: this operator's return, not "someone else".
    assert not [line for line in job.log if "someone else" in line]
    assert job.log[-1] == (f"Aborted: node {node} was returned to service by an operator (uncordoned before this "
                           f"abort); every orphan gone")


def test_refused_while_a_job_is_acting_on_the_node_and_nothing_changes(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=3)))
    node = world.kube.node_with_pods()
    job = run_until(world, start_job(world, node), {JobState.WAITING}, dt=0)
    with pytest.raises(DefragError, match=rf"defrag job #{job.pk} is waiting: a worker is acting on the node"):
        give_back(world, node)
    assert world.kube.node_cordoned(node)
    assert not returns(job)


def test_a_node_no_defrag_job_ever_held_is_not_the_products_to_uncordon(defrag_world):
    world = defrag_world(scenario(knative_service(min_scale=1), nodes=1))
    world.kube.core.create_node({k: v for k, v in make_node("n9", unschedulable=True).items()})
    with pytest.raises(DefragError, match="no defrag job has held node 'n9'.*kubectl uncordon n9"):
        give_back(world, "n9")
    assert world.kube.node_cordoned("n9")


def test_a_drained_node_returns_to_service_without_an_abort(safe_job):
    world, node, job = safe_job
    job = defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.DRAINED}, dt=2)
    assert world.kube.node_cordoned(node)
    done = give_back(world, node)                      # no job named: the node's newest job
    assert done.message == f"Node {node} uncordoned: it takes new pods again."
    assert not done.abort_requested and not world.kube.node_cordoned(node)
    assert DefragJob.objects.get(pk=job.pk).state == JobState.DRAINED


def test_it_needs_its_own_permission(safe_job, django_user_model):
    world, node, job = safe_job
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="change_defragjob"))
    with pytest.raises(DefragError, match="may not return nodes to service"):
        give_back(world, node, actor=viewer, job=job)
    assert world.kube.node_cordoned(node)


# ---- the panel ------------------------------------------------------------------------------

def test_the_panel_offers_it_on_the_job_page_and_the_gpu_map_and_says_what_was_done(safe_job, client,
                                                                                     django_user_model):
    world, node, job = safe_job
    ops = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    ops.user_permissions.add(*Permission.objects.filter(codename__in=[
        "view_defragjob", "change_defragjob", "view_cluster_contents"]))
    client.force_login(ops)
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert "Return to service…" not in page                 # not without its own permission
    assert client.get(f"/admin/capacity/defragjob/{job.pk}/return-to-service/").status_code == 403

    ops.user_permissions.add(Permission.objects.get(codename=RETURN_PERMISSION))
    ops = django_user_model.objects.get(pk=ops.pk)
    client.force_login(ops)
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert "Return to service…" in page
    gpu_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert 'aria-label="cordoned"' in gpu_map and 'aria-label="held by a defrag job"' in gpu_map
    assert "⛔" not in gpu_map and "🔒" not in gpu_map
    assert f'href="/admin/capacity/defragjob/{job.pk}/return-to-service/">return to service</a>' in gpu_map

    confirm = client.get(f"/admin/capacity/defragjob/{job.pk}/return-to-service/").content.decode()
    assert f"Return node {node} to service?" in confirm and "is <strong>cordoned</strong>" in confirm
    assert f"Uncordon {node}</button>" in confirm
    done = client.post(f"/admin/capacity/defragjob/{job.pk}/return-to-service/", {"confirm": node}, follow=True)
    assert f"Node {node} uncordoned: it takes new pods again." in done.content.decode()
    assert not world.kube.node_cordoned(node)
    assert returns(job)[0].actor == ops


def test_once_returned_a_drained_job_says_so_and_offers_it_no_more(safe_job, client, django_user_model):
    world, node, job = safe_job
    job = defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False)
    job = run_until(world, job, {JobState.DRAINED}, dt=2)
    ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(ops)
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert "Return to service…" in page and 'id="defrag-returned"' not in page

    done = client.post(f"/admin/capacity/defragjob/{job.pk}/return-to-service/", {"confirm": node}, follow=True)
    assert f"Node {node} uncordoned: it takes new pods again." in done.content.decode()
    (entry,) = returns(job)
    at = f"{entry.at:%Y-%m-%d %H:%M:%S}"

    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert '<span id="defrag-state">drained</span>; node returned to service</h2>' in page
    assert f"Node {node} was returned to service (uncordoned) at {at} UTC by ops." in page
    assert "Return to service…" not in page
    listed = client.get("/admin/capacity/defragjob/").content.decode()
    assert f"{at} UTC by ops" in listed and "Node returned to service" in listed

    confirm = client.get(f"/admin/capacity/defragjob/{job.pk}/return-to-service/").content.decode()
    assert "is <strong>schedulable</strong>" in confirm
    assert f"It was returned to service (uncordoned) at {at} UTC by ops." in confirm
    assert "Nothing to uncordon: the node already takes new pods." in confirm
    assert "Uncordon" not in confirm and 'name="confirm"' not in confirm


# ---- the CLI --------------------------------------------------------------------------------

def test_the_cli_returns_a_drained_node_names_the_shell_user_and_is_idempotent(safe_job, capsys,
                                                                              django_user_model):
    world, node, job = safe_job
    job = run_until(world, defrag_job_drain(job=job, actor=None, now=world.now(), enqueue=False),
                    {JobState.DRAINED}, dt=2)
    with pytest.raises(CommandError, match="--as: no active user named 'nobody'"):
        call_command("defrag", node, "--cluster", "sim", "--return-to-service", "--yes", "--as", "nobody")
    assert world.kube.node_cordoned(node)

    call_command("defrag", node, "--cluster", "sim", "--return-to-service", "--yes")
    assert capsys.readouterr().out.strip() == f"Node {node} uncordoned: it takes new pods again."
    assert not world.kube.node_cordoned(node)
    [audit] = returns(job)
    assert audit.actor is None and audit.actor_label.startswith("cli:") and "@" in audit.actor_label

    django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    call_command("defrag", node, "--cluster", "sim", "--return-to-service", "--yes", "--as", "ops")
    assert capsys.readouterr().out.strip() == \
        f"Node {node} was already schedulable; nothing to uncordon. Nothing changed."
    assert len(returns(job)) == 1
