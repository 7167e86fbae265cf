"""The per-cluster home dashboard, as an operator reads it."""
from __future__ import annotations

import re

import pytest
from django.utils import timezone

from capacity.defrag.models import DefragJob, JobState
from defrag_builders import make_model_pod, make_node
from orgs.models import Org
from pruning.models import PruneRun

pytestmark = pytest.mark.django_db


def running(pod: dict) -> dict:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def objects():
    """Two H100 nodes (one 6/8 used, one empty), one A10G node (1/1 used)."""
    return [make_node("h1"), make_node("h2"),
            make_node("a1", gpus=1, product="NVIDIA-A10G", pool="a10g"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}},
            running(make_model_pod("big-1", revision="big-00001", node="h1", gpus=6)),
            running(make_model_pod("small-1", revision="small-00001", node="a1", gpus=1))]


@pytest.fixture
def staff(django_user_model, client):
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return user


def cells(html: str, table_id: str) -> list[list[str]]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S).group(1)
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
            if "<td>" in row]


def test_dashboard_shows_gpus_orgs_jobs_and_prune_runs(sim_cluster_factory, client, staff):
    handle = sim_cluster_factory(objects(), name="sim")
    now = timezone.now()
    Org.objects.create(slug="quiet", cluster=handle.cluster, namespace="quiet", dormant=True, dormant_since=now)
    Org.objects.create(slug="busy", cluster=handle.cluster, namespace="busy", last_activity_at=now)
    DefragJob.objects.create(cluster=handle.cluster, node_name="h1", state=JobState.WAITING, created_at=now,
                             requested_by=staff)
    PruneRun.objects.create(cluster=handle.cluster, evaluated_at=now, pods_seen=12, idle_candidates=3)

    page = client.get("/capacity/clusters/sim/")
    assert page.status_code == 200
    html = page.content.decode()
    products = {row[0]: row[1:5] for row in cells(html, "gpus-by-product")}
    assert products["NVIDIA-H100-80GB-HBM3"] == ["2", "16", "6", "10"]
    assert products["NVIDIA-A10G"] == ["1", "1", "1", "0"]
    assert "<strong>1</strong> dormant of 2" in html
    jobs = cells(html, "jobs")
    assert jobs[0][1:4] == ["h1", "pods orphaned, waiting for replacements", "ops"]
    runs = cells(html, "prune-runs")
    assert runs[0][3:5] == ["12", "3"]
    # Each candidate offers the defrag action with its confirmation page; the node a job
    # holds is no candidate.
    assert [row[0] for row in cells(html, "candidates")] == ["a1"]
    assert "/admin/capacity/defragjob/start/?cluster=sim&amp;node=a1" in html
    assert 'href="/savings/clusters/sim/"' in html


def test_the_advice_says_how_many_nodes_can_be_freed_together(sim_cluster_factory, client, staff):
    """Six half-full nodes: each alone could be emptied into the others, but together only
    three; the empty node is never where their pods are planned to go."""
    objects = [make_node(n) for n in ("a", "b", "c", "d", "e", "f", "spare")]
    objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}})
    objects += [running(make_model_pod(f"{n}-{i}", revision=f"m{n}{i}-00001", node=n, gpus=2))
                for n in "abcdef" for i in range(2)]
    sim_cluster_factory(objects, name="sim")
    html = client.get("/capacity/clusters/sim/").content.decode()
    advice = re.search(r'<p id="defrag-advice">(.*?)</p>', html).group(1)
    assert advice == "3 nodes can be freed together; the next 3 each need the room the first ones use."
    assert [row[:3] for row in cells(html, "candidates")] == [
        ["a", "h100", "frees a whole node (#1 together)"], ["b", "h100", "frees a whole node (#2 together)"],
        ["c", "h100", "frees a whole node (#3 together)"], ["d", "h100", "instead of an earlier one, not as well"],
        ["e", "h100", "instead of an earlier one, not as well"],
        ["f", "h100", "instead of an earlier one, not as well"]]
    gpu_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert advice in re.search(r'<p id="map-advice">(.*?)</p>', gpu_map, re.S).group(1)
    whys = [row[6] for row in cells(gpu_map, "map-candidates")]
    assert whys[0] == "its 2 pods (4 GPUs) fit on f (4)"
    assert not any("spare" in why for why in whys)


def test_the_admin_home_lists_clusters_with_their_dashboard(sim_cluster_factory, client, staff):
    sim_cluster_factory(objects(), name="sim")
    html = client.get("/admin/").content.decode()
    assert 'href="/capacity/clusters/sim/"' in html and 'href="/capacity/clusters/sim/gpu-map/"' in html
    assert 'href="/savings/clusters/sim/"' in html


def test_unreachable_cluster_is_said_and_the_rest_still_shows(sim_cluster_factory, client, staff):
    handle = sim_cluster_factory(objects(), name="sim")
    handle.server.stop()
    page = client.get("/capacity/clusters/sim/")
    assert page.status_code == 502
    html = page.content.decode()
    assert "Cannot read the cluster" in html and "dormant of 0" in html


def test_unknown_cluster_404_and_anonymous_goes_to_login(client, django_user_model):
    assert client.get("/capacity/clusters/nope/").status_code == 302       # not logged in → login page
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    assert client.get("/capacity/clusters/nope/").status_code == 404


def test_gpu_map_pages_a_big_fleet_and_keeps_the_pool_filter(sim_cluster_factory, client, staff):
    nodes = [make_node(f"h{i:03d}") for i in range(230)] + [make_node("a1", gpus=1, product="NVIDIA-A10G",
                                                                      pool="a10g")]
    sim_cluster_factory(nodes, name="sim")
    first = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert first.count('class="node"') == 100
    assert "Nodes 1–100 of 231" in first
    last = client.get("/capacity/clusters/sim/gpu-map/?page=3").content.decode()
    assert last.count('class="node"') == 31 and 'data-node="h229"' in last
    assert 'data-node="a1"' in first and 'data-node="a1"' not in last     # nodes go by name
    pool = client.get("/capacity/clusters/sim/gpu-map/?pool=a10g").content.decode()
    assert pool.count('class="node"') == 1 and 'id="map-pages"' not in pool
