"""Who may see a cluster's contents: staff status alone opens neither the dashboard nor
the GPU map (they name orgs, models and nodes); `capacity.view_cluster_contents` does."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from capacity.defrag.models import DefragJob, JobState
from defrag_builders import make_model_pod, make_node

pytestmark = pytest.mark.django_db

PAGES = ("/capacity/clusters/sim/", "/capacity/clusters/sim/gpu-map/")


def objects():
    pod = make_model_pod("big-1", revision="big-00001", node="zeta-node", gpus=6)
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return [make_node("zeta-node"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}}, pod]


def staff_user(django_user_model, *perms: str):
    user = django_user_model.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


@pytest.mark.parametrize("page", PAGES)
def test_staff_without_the_permission_is_refused_before_any_cluster_call(sim_cluster_factory, client,
                                                                         django_user_model, page):
    handle = sim_cluster_factory(objects(), name="sim")
    client.force_login(staff_user(django_user_model))
    response = client.get(page)
    assert response.status_code == 403
    assert "org-a" not in response.content.decode() and "zeta-node" not in response.content.decode()
    assert not handle.gateway.calls          # refused before the cluster was asked anything


@pytest.mark.parametrize("page", PAGES)
def test_staff_with_the_permission_sees_the_cluster(sim_cluster_factory, client, django_user_model, page):
    handle = sim_cluster_factory(objects(), name="sim")
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    response = client.get(page)
    assert response.status_code == 200
    assert "zeta-node" in response.content.decode()
    assert handle.gateway.calls


def test_the_admin_home_offers_cluster_links_only_to_those_allowed(sim_cluster_factory, client,
                                                                   django_user_model):
    sim_cluster_factory(objects(), name="sim")
    user = staff_user(django_user_model)
    client.force_login(user)
    assert 'href="/capacity/clusters/sim/"' not in client.get("/admin/").content.decode()
    user.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(django_user_model.objects.get(pk=user.pk))   # fresh permission cache
    assert 'href="/capacity/clusters/sim/gpu-map/"' in client.get("/admin/").content.decode()


def test_job_progress_wants_the_view_permission_of_defrag_jobs(sim_cluster_factory, client, django_user_model):
    handle = sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=handle.cluster, node_name="zeta-node", state=JobState.CONFIRMED,
                                   created_at=timezone.now())
    client.force_login(staff_user(django_user_model))
    assert client.get(f"/capacity/defrag-jobs/{job.pk}/progress.json").status_code == 403
    client.force_login(staff_user_with(django_user_model, "capacity.view_defragjob"))
    progress = client.get(f"/capacity/defrag-jobs/{job.pk}/progress.json")
    assert progress.status_code == 200 and progress.json()["state"] == "confirmed"


def staff_user_with(django_user_model, perm: str):
    user = django_user_model.objects.create_user("jobviewer", "jv@example.com", "pw", is_staff=True)
    app, codename = perm.split(".")
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user
