"""Who may see a cluster's contents: staff status alone opens neither the dashboard nor
the GPU map (they name orgs, models and nodes); `capacity.view_cluster_contents` does."""
from __future__ import annotations

import re

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


def staff_user(django_user_model, *perms: str, username: str = "viewer"):
    user = django_user_model.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
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


def map_objects():
    """n1 and n2 each hold a fragment the other has room for; n3 is cordoned."""
    pods = [make_model_pod("big-1", revision="big-00001", node="n1", gpus=6),
            make_model_pod("small-1", revision="small-00001", node="n2", gpus=1)]
    for pod in pods:
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return [make_node("n1"), make_node("n2"), make_node("n3", unschedulable=True),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}}, *pods]


NEEDS_START = "Starting a defrag needs the 'Can add defrag job' permission, which you do not have"
NEEDS_RETURN = ("returning it to service needs the 'Can return a defragged node to service (uncordon it)' "
                "permission, which you do not have")


def test_the_gpu_map_offers_defrag_and_return_to_service_only_to_who_may_follow_them(sim_cluster_factory, client,
                                                                                     django_user_model):
    handle = sim_cluster_factory(map_objects(), name="sim")
    job = DefragJob.objects.create(cluster=handle.cluster, node_name="n3", state=JobState.DRAINED,
                                   created_at=timezone.now())
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents", "capacity.view_defragjob"))
    seen = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert 'id="map-candidates"' in seen and "node=n1" not in seen and "defrag this node" not in seen
    assert "return-to-service" not in seen
    assert NEEDS_START in seen and NEEDS_RETURN in seen       # what they lack, in words
    assert client.get("/admin/capacity/defragjob/start/?cluster=sim&node=n1").status_code == 403

    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents", "capacity.view_defragjob",
                                  "capacity.add_defragjob", "capacity.return_to_service_defragjob",
                                  username="operator"))
    offered = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert NEEDS_START not in offered and NEEDS_RETURN not in offered
    start = re.search(r'href="([^"]*start/[^"]*)">defrag this node</a>', offered).group(1).replace("&amp;", "&")
    back = re.search(r'href="([^"]*)">return to service</a>', offered).group(1)
    assert back == f"/admin/capacity/defragjob/{job.pk}/return-to-service/"
    assert "Defrag node n" in client.get(start).content.decode()                     # each link opens its page
    assert "Return node n3 to service?" in client.get(back).content.decode()


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
