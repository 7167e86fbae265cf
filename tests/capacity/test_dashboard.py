"""The per-cluster home dashboard, as an operator reads it."""
from __future__ import annotations

import gc
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from capacity.defrag.models import DefragJob, JobState
from capacity.gpumap.planning import PALETTE
from capacity.gpumap.selectors import fragmentation_recent
from capacity.gpumap.views import NAME_CHARS
from clusters import kube
from config import clock
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
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
            if "<td" in row]


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


def test_the_advice_says_how_many_nodes_can_be_freed_together(sim_cluster_factory, client, staff, settings):
    """Six half-full nodes on a bin-packing cluster: each alone could be emptied into the
    others, but together only three; the empty node is never where their pods are planned to go."""
    settings.CAPACITY_SCHEDULER_SCORING = "MostAllocated"
    objects = [make_node(n) for n in ("a", "b", "c", "d", "e", "f", "spare")]
    objects.append({"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation", "spec": {"placement": "most-allocated"}})
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
    assert whys[0] == "its 2 pods (4 GPUs) fit on f (4 GPUs)"
    assert not any("spare" in why for why in whys)


def test_an_empty_node_that_is_cordoned_or_not_ready_is_no_whole_free_node(sim_cluster_factory, client, staff):
    """h3's kubelet stopped reporting (Ready False) and h4 is cordoned: both are empty, but a
    large model can start on h2 alone, and the map says h3 is not Ready."""
    not_ready = make_node("h3")
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    handle = sim_cluster_factory(objects() + [not_ready, make_node("h4", unschedulable=True)], name="sim")
    handle.advance(5)
    html = client.get("/capacity/clusters/sim/").content.decode()
    h100 = {row[0]: row[1:] for row in cells(html, "gpus-by-product")}["NVIDIA-H100-80GB-HBM3"]
    # nodes, GPUs, used, free, whole free nodes, fragmented nodes, stranded, cordoned, not ready
    assert h100 == ["4", "32", "6", "26", "1", "1", "2", "1", "1"]
    assert "count only the nodes that take new pods (Ready and not cordoned)" in html
    gpu_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert '<text class="node-name" x="34" y="13">h3 (NotReady)</text>' in gpu_map
    assert '<text class="node-name" x="34" y="13">h2</text>' in gpu_map
    h3 = re.search(r'data-node="h3".*?</g>', gpu_map, re.S).group(0)
    assert h3.count("<title>free, but the node is not Ready</title>") == 8 and 'fill-opacity="0.5"' in h3
    # The pool table counts as the dashboard does: of 3 empty nodes, one takes pods.
    pools = {re.sub(r"<[^>]+>", "", row[0]): row[1:] for row in cells(gpu_map, "map-pools")}
    assert pools["h100"] == ["4", "32", "6", "26", "1", "2"], pools


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


@pytest.mark.parametrize("page", ["/capacity/clusters/broken/", "/capacity/clusters/broken/gpu-map/"])
def test_a_malformed_kubeconfig_is_said_on_the_page(client, staff, tmp_path, page):
    from clusters.models import Cluster

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("- a list\n- not a kubeconfig\n")
    Cluster.objects.create(name="broken", kubeconfig_path=str(kubeconfig))
    response = client.get(page)
    assert response.status_code == 502
    assert (f"Cannot read the cluster: 0 ConfigError: cannot load kubeconfig &#x27;{kubeconfig}&#x27; (context "
            "&#x27;current&#x27;): not a kubeconfig file: ") in response.content.decode()


def test_the_collector_runs_again_after_every_page_drawn_failed_or_not_found(sim_cluster_factory, client, staff,
                                                                            settings):
    """The pages are drawn with Python's cyclic collector paused (tens of thousands of new,
    acyclic objects at fleet size); it must run again afterwards, or the web process would
    never collect its cyclic garbage."""
    settings.CAPACITY_MAP_CACHE_SECONDS = 0   # every page reads the cluster
    handle = sim_cluster_factory(objects(), name="sim")
    assert gc.isenabled()
    for path, status in (("/capacity/clusters/sim/", 200), ("/capacity/clusters/sim/gpu-map/", 200),
                         ("/capacity/clusters/nope/gpu-map/", 404)):
        assert client.get(path).status_code == status and gc.isenabled(), path
    handle.server.stop()
    for path in ("/capacity/clusters/sim/", "/capacity/clusters/sim/gpu-map/?pool=a10g"):
        assert client.get(path).status_code == 502 and gc.isenabled(), path


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
    unknown = client.get("/capacity/clusters/sim/gpu-map/?pool=a10q")
    unknown_html = unknown.content.decode()
    assert unknown.status_code == 404
    assert "no GPU node in pool &#x27;a10q&#x27; on sim: the pool matches no node." in unknown_html
    assert "Cannot read the cluster" not in unknown_html
    pools = re.sub(r"<[^>]+>", "", re.search(r"<p>Pools of sim: (.*?)</p>", unknown_html, re.S).group(1))
    assert pools.split(";")[0] == "a10g, h100"
    assert "No node to empty" not in unknown_html



def test_the_map_legend_names_the_org_and_model_of_each_colour_on_the_page(sim_cluster_factory, client, staff):
    sim_cluster_factory(objects(), name="sim")
    html = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    legend = re.search(r'<ul id="map-legend">(.*?)</ul>', html, re.S).group(1)
    entries = re.findall(r'<li class="model" title="([^"]*)"><svg class="swatch"[^>]*><rect [^>]*fill="([^"]*)"'
                         r'[^>]*/></svg> ([^<]*)</li>', legend)
    assert [(title, name) for title, _, name in entries] == [("org-a / big", "org-a / big"),
                                                             ("org-a / small", "org-a / small")]
    cells = re.search(r'<svg id="gpu-map".*?</svg>', html, re.S).group(0)
    for _, fill, _ in entries:   # each swatch is the fill its cells are drawn in: Okabe–Ito colours, distinct
        assert fill in PALETTE and f'fill="{fill}"' in cells
    assert len({fill for _, fill, _ in entries}) == 2
    # The next request draws each model in the same colour.
    again = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert re.search(r'<ul id="map-legend">(.*?)</ul>', again, re.S).group(1) == legend


def test_a_long_node_name_is_cut_on_one_line_with_the_whole_name_in_its_title(sim_cluster_factory, client, staff):
    long_name = "gpu-node-in-a-rather-long-autoscaling-group-name-0123456789"
    sim_cluster_factory([make_node(long_name), make_node("h1")], name="sim")
    html = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    label = re.search(rf'<g class="node" data-node="{long_name}".*?<text class="node-name"[^>]*>(.*?)</text>',
                      html, re.S).group(1)
    assert label == f"<title>{long_name}</title>{long_name[:NAME_CHARS - 1]}…"
    short = re.search(r'<g class="node" data-node="h1".*?<text class="node-name"[^>]*>(.*?)</text>', html, re.S)
    assert short.group(1) == "h1"


def test_the_map_legend_and_cells_escape_the_names_they_show():
    """Names come from the cluster's labels: drawn as text, never as markup."""
    from capacity.gpumap.planning import NodeRow
    from capacity.gpumap.planning import Swatch
    from capacity.gpumap.views import _cells_svg, _legend_html

    legend = _legend_html([("org<b>", 'model"&', Swatch("red\" onload=\"x"))])
    assert "org&lt;b&gt; / model&quot;&amp;" in legend and "<b>" not in legend
    assert 'fill="red&quot; onload=&quot;x"' in legend
    row = NodeRow(name="h1", pool="p", gpu_product="g", total=2, used=1, cordoned=False, held_by_job=None,
                  holders=(("org<b>", "m&", "pod<i>", "ns", 1),))
    svg = _cells_svg(row, row.cells)
    assert "<title>ns/pod&lt;i&gt; (org&lt;b&gt;/m&amp;)</title>" in svg and "<i>" not in svg
    assert svg.count("<rect ") == 2 and "<title>free</title>" in svg

# ---- one reading of the cluster serves its pages a few seconds, and they say how old it is --

T0 = datetime(2026, 3, 2, 14, 5, 7, tzinfo=UTC)


@pytest.fixture
def frozen_now(monkeypatch):
    """The product's clock, moved by the test: `frozen_now[0] = T0 + timedelta(seconds=8)`."""
    moment = [T0]
    monkeypatch.setattr(clock, "now", lambda: moment[0])
    return moment


def data_age(html: str) -> str:
    return re.search(r'<p id="data-age">(.*?)</p>', html, re.S).group(1)


def node_names(html: str) -> list[str]:
    return re.findall(r'<g class="node" data-node="([^"]+)"', html)


def api_calls(handle) -> int:
    return sum(handle.gateway.calls.values())


KEPT_10_S = ("one reading of the cluster serves its pages for 10 s (up to 60 s more while the next one is read "
             "in the background), and is read again at once when a defrag job of the cluster acts.")


@pytest.fixture
def refreshes(monkeypatch):
    """The background refreshes the pages queue, as (cluster id, identity); `run()` runs
    them as the sweep worker would, at the product's clock."""
    from capacity.gpumap import tasks

    class Refreshes(list):
        def run(self) -> list[bool]:
            done = [tasks.gpu_view_refresh(*args) for args in self]
            self.clear()
            return done

    refreshes = Refreshes()
    monkeypatch.setattr(tasks.gpu_view_refresh, "delay", lambda *args: refreshes.append(args))
    return refreshes


def h100_cordoned(dashboard: str) -> str:
    return {r[0]: r[8] for r in cells(dashboard, "gpus-by-product")}["NVIDIA-H100-80GB-HBM3"]


def test_a_reading_serves_both_pages_for_its_seconds_and_they_say_how_old_it_is(
        sim_cluster_factory, client, staff, redis_cache, settings, frozen_now, refreshes):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    handle = sim_cluster_factory(objects(), name="sim")
    first = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert data_age(first) == f"Nodes and pods as of 0 s ago (2026-03-02 14:05:07 UTC): {KEPT_10_S}"
    assert 'id="map-cordoned"' not in first
    # Someone cordons h2 outside the product, and 8 s pass.
    handle.gateway.patch(kube.NODES, "h2", {"spec": {"unschedulable": True}}, patch_type="strategic")
    calls = api_calls(handle)
    frozen_now[0] = T0 + timedelta(seconds=8)
    kept_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    kept_dashboard = client.get("/capacity/clusters/sim/").content.decode()
    for page in (kept_map, kept_dashboard):
        assert data_age(page) == f"Nodes and pods as of 8 s ago (2026-03-02 14:05:07 UTC): {KEPT_10_S}"
    assert 'id="map-cordoned"' not in kept_map                      # what the cluster was 8 s ago, as it says
    assert h100_cordoned(kept_dashboard) == "0"
    assert api_calls(handle) == calls and refreshes == []            # neither page asked the cluster
    # 10 s after the reading, the pages still show it, say so, and one refresh is queued.
    frozen_now[0] = T0 + timedelta(seconds=10)
    old_dashboard = client.get("/capacity/clusters/sim/").content.decode()
    assert data_age(old_dashboard) == (f"Nodes and pods as of 10 s ago (2026-03-02 14:05:07 UTC): {KEPT_10_S} "
                                       "A newer reading was asked for at 14:05:17 UTC.")
    assert h100_cordoned(old_dashboard) == "0" and 'id="refresh-failed"' not in old_dashboard
    frozen_now[0] = T0 + timedelta(seconds=11)
    old_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert data_age(old_map).endswith("A newer reading was asked for at 14:05:17 UTC.")
    assert api_calls(handle) == calls                                 # no page waited for the cluster
    assert [cluster_id for cluster_id, _ in refreshes] == [handle.cluster.pk]   # one refresh, not one per page
    # The sweep worker draws the new reading; the next pages show it.
    frozen_now[0] = T0 + timedelta(seconds=12)
    assert refreshes.run() == [True]
    assert api_calls(handle) > calls
    frozen_now[0] = T0 + timedelta(seconds=13)
    fresh_dashboard = client.get("/capacity/clusters/sim/").content.decode()
    assert data_age(fresh_dashboard) == f"Nodes and pods as of 1 s ago (2026-03-02 14:05:19 UTC): {KEPT_10_S}"
    assert h100_cordoned(fresh_dashboard) == "1"
    fresh_map = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    cordoned = re.search(r'<table id="map-cordoned">(.*?)</table>', fresh_map, re.S).group(1)
    assert re.findall(r"</span> ([^<]+)</td>", cordoned) == ["h2"]
    assert refreshes == []


def test_a_failed_refresh_is_said_and_past_its_wait_the_page_reads_the_cluster_itself(
        sim_cluster_factory, client, staff, redis_cache, settings, frozen_now, refreshes):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    handle = sim_cluster_factory(objects(), name="sim")
    assert client.get("/capacity/clusters/sim/").status_code == 200
    handle.server.stop()
    frozen_now[0] = T0 + timedelta(seconds=15)
    assert client.get("/capacity/clusters/sim/").status_code == 200   # the kept reading, a refresh queued
    frozen_now[0] = T0 + timedelta(seconds=16)
    assert refreshes.run() == [False]
    frozen_now[0] = T0 + timedelta(seconds=20)
    page = client.get("/capacity/clusters/sim/gpu-map/")
    assert page.status_code == 200
    html = page.content.decode()
    assert data_age(html).startswith("Nodes and pods as of 20 s ago (2026-03-02 14:05:07 UTC)")
    assert data_age(html).endswith("A newer reading was asked for at 14:05:27 UTC.")   # the next try
    failed = re.search(r'<p class="errornote" id="refresh-failed">(.*?)</p>', html, re.S).group(1)
    assert failed.startswith("The last reading of the cluster, at 2026-03-02 14:05:23 UTC, failed: 0 ConnectionError: list nodes /api/v1/nodes: no answer from")
    assert failed.endswith("This page shows the reading above until one succeeds.")
    assert 'data-node="h1"' in html
    # 60 s past its 10, the reading serves no more: the page reads the cluster, and says it cannot.
    frozen_now[0] = T0 + timedelta(seconds=70)
    page = client.get("/capacity/clusters/sim/gpu-map/")
    assert page.status_code == 502 and "Cannot read the cluster" in page.content.decode()


def test_a_failed_refresh_is_not_said_under_a_reading_taken_after_it(
        sim_cluster_factory, client, staff, redis_cache, settings, frozen_now, refreshes):
    """A refresh fails, then a page reads the cluster itself: the reading it shows is newer
    than that failure, so the page does not say its reading is the last that succeeded."""
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    handle = sim_cluster_factory(objects(), name="sim")
    assert client.get("/capacity/clusters/sim/").status_code == 200
    handle.control.set_faults(error_rate=1.0, match={"verbs": ["list"], "resources": ["nodes"]})
    frozen_now[0] = T0 + timedelta(seconds=15)
    client.get("/capacity/clusters/sim/")                             # a refresh queued…
    frozen_now[0] = T0 + timedelta(seconds=16)
    assert refreshes.run() == [False]                                 # …fails at 14:05:23
    handle.control.clear_faults()
    frozen_now[0] = T0 + timedelta(seconds=71)                        # past the wait: the page reads itself
    assert data_age(client.get("/capacity/clusters/sim/").content.decode()).startswith(
        "Nodes and pods as of 0 s ago (2026-03-02 14:06:18 UTC)")
    frozen_now[0] = T0 + timedelta(seconds=82)
    html = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert data_age(html).startswith("Nodes and pods as of 11 s ago (2026-03-02 14:06:18 UTC)")
    assert 'id="refresh-failed"' not in html
    # A refresh failing after that reading is said.
    handle.control.set_faults(error_rate=1.0, match={"verbs": ["list"], "resources": ["nodes"]})
    frozen_now[0] = T0 + timedelta(seconds=83)
    assert refreshes.run() == [False]
    frozen_now[0] = T0 + timedelta(seconds=84)
    html = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    failed = re.search(r'<p class="errornote" id="refresh-failed">(.*?)</p>', html, re.S).group(1)
    assert failed.startswith("The last reading of the cluster, at 2026-03-02 14:06:30 UTC, failed: 500 InternalError")


def test_without_a_cache_shared_with_the_workers_the_page_reads_the_cluster_itself(
        sim_cluster_factory, client, staff, settings, frozen_now, refreshes):
    """A process-local cache (no REDIS_URL): a reading drawn by a worker would never reach the page."""
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": "dashboard-test"}}
    handle = sim_cluster_factory(objects(), name="sim")
    page = client.get("/capacity/clusters/sim/").content.decode()
    assert data_age(page) == ("Nodes and pods as of 0 s ago (2026-03-02 14:05:07 UTC): one reading of the cluster "
                              "serves its pages for 10 s, and is read again at once when a defrag job of the "
                              "cluster acts.")
    calls = api_calls(handle)
    frozen_now[0] = T0 + timedelta(seconds=10)
    page = client.get("/capacity/clusters/sim/").content.decode()
    assert data_age(page).startswith("Nodes and pods as of 0 s ago (2026-03-02 14:05:17 UTC)")
    assert api_calls(handle) > calls and refreshes == []


def test_with_no_keeping_every_page_reads_the_cluster(sim_cluster_factory, client, staff, redis_cache, settings,
                                                      frozen_now):
    settings.CAPACITY_MAP_CACHE_SECONDS = 0
    handle = sim_cluster_factory(objects(), name="sim")
    page = client.get("/capacity/clusters/sim/").content.decode()
    assert data_age(page) == "Nodes and pods as of 0 s ago (2026-03-02 14:05:07 UTC)."
    calls = api_calls(handle)
    client.get("/capacity/clusters/sim/")
    assert api_calls(handle) > calls


def test_a_kept_reading_never_shows_another_clusters_nodes(sim_cluster_factory, client, staff, redis_cache,
                                                            settings, frozen_now):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    east = sim_cluster_factory([make_node("east-1"), make_node("east-2")], name="east")
    west = sim_cluster_factory([make_node("west-1", gpus=4, product="NVIDIA-A100", pool="a100")], name="west")
    other = sim_cluster_factory([make_node("other-1")], name="other")
    for path in ("/capacity/clusters/east/gpu-map/", "/capacity/clusters/east/"):
        assert client.get(path).status_code == 200
    assert node_names(client.get("/capacity/clusters/west/gpu-map/").content.decode()) == ["west-1"]
    west_products = [r[0] for r in cells(client.get("/capacity/clusters/west/").content.decode(), "gpus-by-product")]
    assert west_products == ["NVIDIA-A100"]
    assert node_names(client.get("/capacity/clusters/east/gpu-map/").content.decode()) == ["east-1", "east-2"]
    # The west row now points at another API server: its kept reading is not that server's.
    west.cluster.kubeconfig_path = other.kubeconfig_path
    west.cluster.save()
    assert node_names(client.get("/capacity/clusters/west/gpu-map/").content.decode()) == ["other-1"]
    del east


@pytest.mark.parametrize("page", ["/capacity/clusters/sim/", "/capacity/clusters/sim/gpu-map/"])
def test_the_permission_is_checked_before_any_cluster_call_or_kept_reading(
        sim_cluster_factory, client, django_user_model, redis_cache, settings, page):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    never_read = sim_cluster_factory(objects(), name="quiet")
    handle = sim_cluster_factory(objects(), name="sim")
    admin = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(admin)
    assert client.get(page).status_code == 200                      # a reading of sim is kept
    calls = api_calls(handle)
    viewer = django_user_model.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    client.force_login(viewer)
    refused = client.get(page)
    assert refused.status_code == 403
    assert "data-node" not in refused.content.decode() and "NVIDIA" not in refused.content.decode()
    assert api_calls(handle) == calls
    assert client.get(page.replace("/sim/", "/quiet/")).status_code == 403
    assert not never_read.gateway.calls                               # refused before the cluster was asked


def test_a_defrag_job_shows_at_once_on_a_kept_reading(sim_cluster_factory, client, staff, redis_cache, settings,
                                                       frozen_now):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    handle = sim_cluster_factory(objects(), name="sim")
    before = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert 'aria-label="held by a defrag job"' not in before[before.index('id="gpu-map"'):before.index("</svg>")]
    frozen_now[0] = T0 + timedelta(seconds=3)
    job = DefragJob.objects.create(cluster=handle.cluster, node_name="a1", state=JobState.WAITING, created_at=T0,
                                   requested_by=staff)
    after = client.get("/capacity/clusters/sim/gpu-map/").content.decode()
    assert data_age(after).startswith("Nodes and pods as of 0 s ago (2026-03-02 14:05:10 UTC)")
    a1 = after[after.index('data-node="a1"'):]
    assert f"<title>held by defrag job #{job.pk}</title>" in a1[:a1.index("</text>")]


def test_the_cluster_is_read_when_the_cache_is_down(sim_cluster_factory, settings):
    """(The admin's theme reads the same cache, so the whole page needs it; the reading does not.)"""
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:9/0",   # nothing listens on the discard port
                                   "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}}
    handle = sim_cluster_factory(objects(), name="sim")
    read = fragmentation_recent(cluster=handle.cluster, now=T0)
    assert [r.name for r in read.value.rows] == ["a1", "h1", "h2"] and read.taken_at == T0


def test_a_refresh_queued_before_the_row_was_pointed_elsewhere_reads_nothing(
        sim_cluster_factory, client, staff, redis_cache, settings, frozen_now, refreshes):
    settings.CAPACITY_MAP_CACHE_SECONDS = 10
    west = sim_cluster_factory([make_node("west-1")], name="west")
    other = sim_cluster_factory([make_node("other-1")], name="other")
    assert node_names(client.get("/capacity/clusters/west/gpu-map/").content.decode()) == ["west-1"]
    frozen_now[0] = T0 + timedelta(seconds=12)
    assert node_names(client.get("/capacity/clusters/west/gpu-map/").content.decode()) == ["west-1"]
    assert len(refreshes) == 1
    west.cluster.kubeconfig_path = other.kubeconfig_path
    west.cluster.save()
    calls = api_calls(west)                                           # the gateway a read would now use
    assert refreshes.run() == [False] and api_calls(west) == calls    # queued for the old server: not read
    page = client.get("/capacity/clusters/west/gpu-map/").content.decode()
    assert node_names(page) == ["other-1"]                            # the page reads the new server itself
    assert data_age(page).startswith("Nodes and pods as of 0 s ago (2026-03-02 14:05:19 UTC)")


def test_protected_orgs_count_exempt_and_snoozed_and_a_cli_job_names_its_shell(sim_cluster_factory, client, staff):
    """Scale to zero turned off, exempt, snoozed: three orgs kept warm; a snooze that ended
    is not one. A job started from the CLI is asked by cli:<os user>@<host>, as the job list says."""
    handle = sim_cluster_factory(objects(), name="sim")
    now = clock.now()
    for slug, fields in (("off", {"scale_to_zero_allowed": False}), ("exempt", {"exempt": True}),
                         ("snoozed", {"snoozed_until": now + timedelta(hours=3)}),
                         ("ended", {"snoozed_until": now - timedelta(hours=3)}), ("plain", {})):
        Org.objects.create(slug=slug, cluster=handle.cluster, namespace=slug, last_activity_at=now, **fields)
    DefragJob.objects.create(cluster=handle.cluster, node_name="h1", state=JobState.FAILED, created_at=now,
                             requested_by_label="cli:root@ops-host")
    DefragJob.objects.create(cluster=handle.cluster, node_name="h2", state=JobState.WAITING, created_at=now,
                             requested_by=staff, requested_by_label="cli:root@ops-host")

    html = client.get("/capacity/clusters/sim/").content.decode()
    orgs = re.sub(r"<[^>]+>", "", re.search(r'<p id="orgs">(.*?)</p>', html, re.S).group(1))
    assert orgs == "0 dormant of 5; 3 protected from scale to zero (turned off, exempt or snoozed); 0 with drift."
    asked = {row[1]: row[3] for row in cells(html, "jobs")}
    assert asked == {"h1": "cli:root@ops-host", "h2": "ops via cli:root@ops-host"}
    listed = client.get("/admin/capacity/defragjob/").content.decode()
    assert "cli:root@ops-host" in listed


def test_the_admins_view_site_link_opens_the_dashboard(sim_cluster_factory, client, staff):
    sim_cluster_factory(objects(), name="sim")
    index = client.get("/admin/").content.decode()
    link = re.search(r'<a href="([^"]+)">View site</a>', index).group(1)
    page = client.get(link, follow=True)
    assert page.status_code == 200
    assert page.redirect_chain[-1][0] == "/capacity/clusters/sim/"
    assert '<p id="orgs">' in page.content.decode()
