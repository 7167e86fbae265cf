"""An operator defrags a fragmented node from the panel, in a real browser."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from capacity.defrag.models import DefragJob, JobState
from clusters import kube
from capacity.defrag.services import defrag_job_step
from config import clock
from tests.browser.conftest import WRAPPED_JS, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NS = "org-a"
SERVICE = "llama"


def scenario() -> list[dict]:
    """Three 8-GPU H100 nodes and one model at 3 replicas: the default spread placement
    puts one pod on each node, so every node holds a 1-GPU fragment."""
    nodes = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": f"h100-{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                           "karpenter.sh/nodepool": "h100"}},
              "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"},
                         "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"}}}
             for i in (1, 2, 3)]
    service = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
               "metadata": {"name": SERVICE, "namespace": NS},
               "spec": {"template": {
                   "metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "3",
                                                "autoscaling.knative.dev/max-scale": "10"}},
                   "spec": {"containers": [{"name": "model", "image": "registry.example.com/llama:1",
                                            "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                          "requests": {"nvidia.com/gpu": "1"}}}]}}}}
    return [*nodes, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, service]


@pytest.fixture
def cluster(sim_cluster_factory):
    handle = sim_cluster_factory(scenario(), name="sim")
    handle.advance(60)   # pods scheduled, started and Ready
    return handle


def log_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page.locator("#clusters-panel")).to_be_visible()


def test_operator_defrags_a_node_from_the_gpu_map_and_watches_it_reach_safe(live_server, cluster, browser_page,
                                                                             django_user_model):
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pass")
    page = browser_page
    log_in(page, live_server.url, "oncall", "s3cret-pass")

    page.click("#clusters-panel >> text=GPU map")
    expect(page.locator("svg#gpu-map g.node")).to_have_count(3)
    shot(page, "1-gpu-map")

    # The first candidate: a node whose only pod fits in the free GPUs of the others.
    first = page.locator("a.button", has_text="defrag this node").first
    node = re.search(r"node=([\w.-]+)", first.get_attribute("href")).group(1)
    first.click()
    expect(page.locator("#report")).to_contain_text("Found pods to defrag")
    expect(page.locator("#report")).to_contain_text(f"{NS}/{SERVICE}-00001-deployment-")
    shot(page, "2-confirm")
    page.fill("input[name=poll_interval]", "1")
    page.click("button[name=confirm]")

    expect(page.locator("#defrag-state")).to_be_visible()
    job = DefragJob.objects.get(node_name=node)
    assert job.requested_by.username == "oncall"

    # The worker's part, run here against the simulated clock: step the job while the
    # cluster moves on; the open page follows on its own (it polls the job's progress).
    for _ in range(40):
        job = defrag_job_step(job=job, now=clock.now())
        if job.state == JobState.SAFE:
            break
        cluster.advance(5)
    assert job.state == JobState.SAFE, job.log
    expect(page.locator("#defrag-state")).to_have_text("safe to defrag/remove node", timeout=20_000)
    expect(page.locator("#defrag-log")).to_contain_text("Safe to defrag/remove node")
    shot(page, "3-job-safe")

    # The job's page at a laptop's 1366 px: its audit trail (a pod's ownerReferences before
    # the orphaning) stays on the page, the node's name and each action on one line, and
    # every field's help reads whole ("cli:USER@HOST", not an HTML tag the browser ate).
    page.set_viewport_size({"width": 1366, "height": 768})
    page.reload()
    expect(page.locator("#defrag-audit")).to_contain_text("pod_orphan")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366
    targets = page.locator("#defrag-audit td.token", has_text=f"Node/{node}")
    assert targets.count() >= 3
    assert page.evaluate(WRAPPED_JS, "#defrag-audit > table > tbody > tr > td:nth-child(2)") == [], "an action on one line"
    node_targets = [w for w in page.evaluate(WRAPPED_JS, "#defrag-audit td.token") if w["text"].startswith("Node/")]
    assert node_targets == [], "a node's name on one line"
    expect(page.locator(".field-requested_by_label .help")).to_contain_text("cli:USER@HOST")
    shot(page, "3b-job-audit-1366")

    # The job is in the history, and the map marks the node as cordoned and held.
    page.goto(f"{live_server.url}/admin/capacity/defragjob/")
    expect(page.locator("#result_list")).to_contain_text(node)
    page.goto(f"{live_server.url}/capacity/clusters/sim/gpu-map/")
    expect(page.locator(f'g.node[data-node="{node}"] svg[aria-label="cordoned"]')).to_be_visible()
    expect(page.locator(f'g.node[data-node="{node}"] svg[aria-label="held by a defrag job"]')).to_be_visible()
    shot(page, "4-history-and-map")

    # The cluster's dashboard counts the GPUs and lists the job.
    page.goto(f"{live_server.url}/capacity/clusters/sim/")
    expect(page.locator("#gpus-by-product")).to_contain_text("NVIDIA-H100-80GB-HBM3")
    expect(page.locator("#jobs")).to_contain_text(node)
    shot(page, "5-dashboard")

    # Back to service from the map: a confirmation naming the node, then what was done.
    page.goto(f"{live_server.url}/capacity/clusters/sim/gpu-map/")
    page.locator("#map-cordoned a.return-to-service").click()
    expect(page.locator("#return-node-state")).to_contain_text(f"Node {node} of cluster sim is cordoned")
    page.click(f"button:has-text('Uncordon {node}')")
    expect(page.locator(".messagelist")).to_contain_text(f"Node {node} uncordoned: it takes new pods again.")
    shot(page, "5b-returned-to-service")
    expect(page.locator("#defrag-returned")).to_contain_text(f"Node {node} was returned to service (uncordoned) at ")
    expect(page.locator("#defrag-returned")).to_contain_text(" by oncall.")
    expect(page.locator("#return-to-service")).to_have_count(0)
    assert not cluster.gateway.get(kube.NODES, node)["spec"].get("unschedulable")


def test_an_operator_without_the_permission_cannot_start_a_defrag(live_server, cluster, browser_page,
                                                                 django_user_model):
    viewer = django_user_model.objects.create_user("viewer", "viewer@example.com", "s3cret-pass", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_defragjob"),
                                Permission.objects.get(codename="view_cluster_contents"))
    page = browser_page
    log_in(page, live_server.url, "viewer", "s3cret-pass")

    page.goto(f"{live_server.url}/capacity/clusters/sim/gpu-map/")
    expect(page.locator("#map-candidates")).to_contain_text("h100-")     # the advice is there to read
    expect(page.locator("#map-defrag-needs")).to_contain_text("needs the 'Can add defrag job' permission")
    expect(page.locator("a.button", has_text="defrag this node")).to_have_count(0)
    # The start page typed by hand is refused all the same.
    response = page.goto(f"{live_server.url}/admin/capacity/defragjob/start/?cluster=sim&node=h100-1")
    assert response.status == 403
    shot(page, "6-forbidden")
    assert not DefragJob.objects.exists()
    assert not any(n.get("spec", {}).get("unschedulable") for n in cluster.gateway.list(kube.NODES))


def test_the_open_job_page_offers_what_the_new_state_allows_and_says_when_it_cannot_follow(
        live_server, cluster, browser_page, django_user_model):
    """The operator watches a job reach safe on its page: the Drain action appears without a
    reload; when the panel stops answering, the page says it is no longer following the job."""
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pass")
    job = DefragJob.objects.create(cluster=cluster.cluster, node_name="h100-1", state=JobState.CORDONED,
                                   created_at=clock.now())
    page = browser_page
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, live_server.url, "oncall", "s3cret-pass")
    page.goto(f"{live_server.url}/admin/capacity/defragjob/{job.pk}/change/")
    expect(page.locator("#defrag-state")).to_have_text("node cordoned")
    expect(page.locator("a", has_text="Drain…")).to_have_count(0)
    # What to do next is on the first screen; the worker's own fields are folded away.
    expect(page.locator("#defrag-next")).to_be_in_viewport()
    for internal in (".field-lease_owner", ".field-heartbeat_at", ".field-version"):
        expect(page.locator(internal)).to_be_hidden()

    DefragJob.objects.filter(pk=job.pk).update(state=JobState.SAFE, safe_at=clock.now())   # as the worker records it

    expect(page.locator("#defrag-state")).to_have_text("safe to defrag/remove node", timeout=20_000)
    expect(page.locator("a", has_text="Drain…")).to_be_visible(timeout=20_000)
    expect(page.locator("#defrag-following")).to_be_hidden()
    page.click("a:has-text('Drain…')")
    expect(page.locator("#content h1")).to_have_text(["Drain node h100-1 of cluster sim?"])   # once, naming both
    page.go_back()

    # The panel stops answering while a drain is under way: the page says it shows the last state it read.
    DefragJob.objects.filter(pk=job.pk).update(drain_requested_at=clock.now())
    page.reload()
    page.route("**/progress.json", lambda route: route.abort())
    expect(page.locator("#defrag-following")).to_contain_text("Not following the job: the panel did not answer",
                                                              timeout=20_000)
    expect(page.locator("#defrag-following")).to_contain_text("shown as read at")
    shot(page, "7-job-not-followed")
    page.unroute("**/progress.json")
    expect(page.locator("#defrag-following")).to_be_hidden(timeout=20_000)
