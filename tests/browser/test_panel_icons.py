"""The panel at a laptop's 1366×768 in Debian's plain Chromium (no emoji fonts): the GPU
map's icons are drawn, explained by the legend, and the panel names the product and the
zone of its times."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from capacity.defrag.models import DefragJob, JobState
from clusters import kube
from config import clock
from tests.browser.conftest import WRAPPED_JS, shot
from tests.browser.test_defrag_in_browser import log_in, scenario

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster(sim_cluster_factory):
    handle = sim_cluster_factory(scenario(), name="sim")
    handle.advance(60)
    # h100-3 cordoned and held by a (resting) defrag job: both icons on its row.
    handle.gateway.patch(kube.NODES, "h100-3", {"spec": {"unschedulable": True}}, patch_type="strategic")
    DefragJob.objects.create(cluster=handle.cluster, node_name="h100-3", state=JobState.SAFE,
                             created_at=clock.now())
    return handle


def test_gpu_map_icons_render_at_1366x768_and_the_legend_explains_them(live_server, cluster, browser_page,
                                                                       django_user_model):
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pass")
    page = browser_page
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, live_server.url, "oncall", "s3cret-pass")
    expect(page.locator("#site-name")).to_have_text("GPU capacity")
    assert "Django administration" not in page.content()
    assert page.title().endswith("| GPU capacity")

    page.goto(f"{live_server.url}/capacity/clusters/sim/gpu-map/")
    row = page.locator('g.node[data-node="h100-3"]')
    for label in ("cordoned", "held by a defrag job"):
        icon = row.locator(f'svg[aria-label="{label}"]')
        box = icon.bounding_box()
        assert box is not None and box["width"] >= 8 and box["height"] >= 8, (label, box)   # 14 px icons
        # Drawn, not an empty box: the icon's path has a real outline inside it.
        path_box = icon.locator("path").bounding_box()
        assert path_box is not None and path_box["width"] > 5 and path_box["height"] > 5, (label, path_box)
        legend_icon = page.locator(f'#map-legend svg[aria-label="{label}"]')
        assert legend_icon.bounding_box()["width"] >= 8
    expect(page.locator("#map-legend")).to_contain_text("cordoned: no new pods are scheduled on the node")
    expect(page.locator("#map-legend")).to_contain_text("held by a live defrag job")
    assert page.locator('g.node[data-node="h100-1"] svg[aria-label]').count() == 0
    expect(page.locator("#map-cordoned")).to_contain_text("h100-3")
    # Each button and node name on one line at 1366 px ("defrag this node", "return to service").
    assert page.locator("#content a.button").count() >= 1
    wrapped = page.evaluate(WRAPPED_JS, "#content a.button, #content td.node-name, #map-legend li")
    assert not wrapped, wrapped
    shot(page, "panel-gpu-map-1366")

    # Times carry their zone, on the job list as on the job page.
    page.goto(f"{live_server.url}/admin/capacity/defragjob/")
    expect(page.locator("#result_list")).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"))
    expect(page.locator("#result_list")).to_contain_text("h100-3")
