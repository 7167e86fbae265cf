"""The panel's five working pages at a laptop's 1366×768 in Debian's plain Chromium: the
cluster dashboard, the GPU map, the runbook (model registry), a prune run with its
decisions, and the savings page. On each: no action link cut off at the right (by the
window or by a scrolling container), every icon drawn, and every chart drawn by Chart.js
with titled axes (read from the library's own instance registry).

With SCREENSHOTS_DIR set (`make screenshots`), the pages are also saved there as PNGs."""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from capacity.campaigns.services import campaign_proposals_compute
from capacity.defrag.models import DefragJob, JobState
from capacity.runbook.models import ServedModel
from clusters import kube
from clusters.models import Cluster
from audit.models import AuditEntry
from orgs.models import Org
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, prune_run_execute
from tests.browser.conftest import WRAPPED_JS, shot

# The prune tests' simulated cluster with DCGM history and a real Prometheus.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pruning"))
from tests.prometheus_fixtures import PrometheusServer, Series  # noqa: E402
from pruning_world import World, deployment, knative_service  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.prometheus, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1366, 768

# Links, buttons and submit inputs of the page's content whose right edge lies beyond the
# window or beyond any ancestor that clips or scrolls horizontally: an action the operator
# cannot see without scrolling sideways, or a list column cut off (its header's sort link).
CLIPPED_JS = """
() => {
  const limitOf = (el) => {
    let limit = document.documentElement.clientWidth;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") { limit = Math.min(limit, p.getBoundingClientRect().right); }
    }
    return limit;
  };
  const out = [];
  for (const el of document.querySelectorAll("#content a, #content button, #content input[type=submit]")) {
    const r = el.getBoundingClientRect();
    if (!el.getClientRects().length || r.width === 0) continue;      // not displayed
    const limit = limitOf(el);
    if (r.right > limit + 1) out.push({kind: el.closest("thead") ? "column header" : "action",
                                       text: (el.textContent || el.value || "").trim().slice(0, 60),
                                       right: Math.round(r.right), limit: Math.round(limit)});
  }
  return out;
}
"""

# Displayed SVG icons of the content with no size: an icon that did not render.
EMPTY_ICONS_JS = """
() => [...document.querySelectorAll("#content svg")]
  .filter(s => s.getClientRects().length)
  .map(s => { const r = s.getBoundingClientRect(); return {label: s.getAttribute("aria-label") || s.id || "",
                                                          w: r.width, h: r.height}; })
"""

# Every Chart.js instance on the page, from the library's registry: axis titles and size.
CHARTS_JS = """
() => Object.values(Chart.instances).map(c => ({
  canvas: c.canvas.dataset.chart || c.canvas.id, type: c.config.type, width: c.width, height: c.height,
  datasets: c.data.datasets.length,
  x: c.options.scales.x.title.display ? c.options.scales.x.title.text : "",
  y: c.options.scales.y.title.display ? c.options.scales.y.title.text : "",
}))
"""


@pytest.fixture
def panel(tmp_path, settings):
    """One cluster with what each page shows: a prune run that scaled an idle Deployment to
    zero (with its utilization history in Prometheus), a drained and cordoned node, an
    org's dormancy in the audit, an org exempt from scale to zero, a model whose new
    revision waits for the GPUs an old one holds, and the campaign proposals."""
    servers: list[PrometheusServer] = []

    def prometheus_factory(history):
        server = PrometheusServer(tmp_path / f"prom{len(servers)}")
        server.backfill(history)
        servers.append(server)
        return server.start()

    with World.start(tmp_path) as world:
        world.prometheus_factory = prometheus_factory
        world.create(deployment("web", "team-a", replicas=2, util="0"))
        world.create(deployment("busy", "team-a", util="80"))
        world.create(knative_service("chat", "team-b", gpus=2, util="40"))
        # A second model, which a campaign can move off its node.
        world.create(knative_service("summarize", "team-b", gpus=2, util="40"))
        world.record_history(minutes=40)
        _pool_history(world.history)
        prom = world.prometheus()
        cluster = Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig, prometheus_url=prom.url)
        # The product's clock reads the simulated one, so "now" on every page is the run's now.
        offset = tmp_path / "clock-offset"
        offset.write_text(str((world.now() - _wall_now()).total_seconds()))
        settings.CLOCK_OFFSET_FILE = str(offset)
        now = world.now()
        run = prune_run_execute(kube_gateway=kube.gateway_for(cluster), prometheus=prom, now=now, cluster=cluster,
                                params=PruneParams(run_mode="scale-down", namespace="team-a"))
        assert run.acted == 1, run.errors
        _records(cluster, now)
        world.gateway.patch(kube.NODES, "gpu-3", {"spec": {"unschedulable": True}}, patch_type="strategic")
        world.control.advance(0)
        # The schedule's campaign proposals, from the cluster as it now is.
        campaign_proposals_compute(cluster=cluster, now=now)
        try:
            yield {"world": world, "cluster": cluster, "run": run}
        finally:
            for server in servers:
                server.stop()


def _pool_history(history: dict) -> None:
    """The control plane's own pool series beside DCGM's, as its /metrics would have had them
    scraped at the same moments: the a10g pool's GPUs held by pods (DCGM's series with a pod),
    and its nodes."""
    util = [s for (name, _), s in history.items() if name == "DCGM_FI_DEV_GPU_UTIL"]
    moments = sorted({t for s in util for t, _ in s.samples})
    held = {t: sum(1 for s in util if s.labels.get("pod") and any(m == t for m, _ in s.samples)) for t in moments}
    own = {"cluster": "sim", "job": "gpu-capacity", "instance": "web-0:8000"}
    rows = [Series("gpu_capacity_pool_gpus", {**own, "pool": "a10g", "gpu_product": "NVIDIA-A10G",
                                              "state": "allocated"}, [(t, held[t]) for t in moments])]
    rows += [Series("gpu_capacity_node_pool_info", {**own, "node": node, "pool": "a10g"}, [(t, 1) for t in moments])
             for node in sorted({s.labels["Hostname"] for s in util})]
    for row in rows:
        history[(row.metric, tuple(sorted(row.labels.items())))] = row


def _wall_now():
    from django.utils import timezone
    return timezone.now()


def _records(cluster: Cluster, now) -> None:
    """A week of what the product records: dormancy stretches, an exempt org, a drained node,
    and a model blocked behind its old revision."""
    acme = Org.objects.create(slug="acme", cluster=cluster, namespace="team-b", last_activity_at=now)
    Org.objects.create(slug="team-a", cluster=cluster, namespace="team-a", last_activity_at=now)
    Org.objects.create(slug="research", cluster=cluster, namespace="team-c", dormant=True,
                       scale_to_zero_allowed=False, last_activity_at=now - timedelta(days=4))
    for days_ago, hours in ((6, 10), (4, 14), (2, 20)):
        start = now - timedelta(days=days_ago)
        AuditEntry.objects.create(app="orgs", at=start, action="scale_to_zero_applied", org=acme,
                                   cause="switch: became dormant (dormancy sweep)",
                                   old={"ksvc team-b/chat": "1", "setting": "disabled"},
                                   new={"ksvc team-b/chat": "0", "setting": "enabled"})
        AuditEntry.objects.create(app="orgs", at=start + timedelta(hours=hours), action="scale_to_zero_applied", org=acme,
                                   cause="switch: became active (activity)",
                                   old={"ksvc team-b/chat": "0", "setting": "enabled"},
                                   new={"ksvc team-b/chat": "1", "setting": "disabled"})
    earlier = PruneRun.objects.create(cluster=cluster, mode=PruneRun.Mode.SCALE_DOWN, status="succeeded",
                                      evaluated_at=now - timedelta(days=5))
    PruneDecision.objects.create(run=earlier, namespace="team-a", pod="trainer-0", owner_kind="StatefulSet",
                                 owner_name="trainer", gpus=["GPU-a", "GPU-b", "GPU-c", "GPU-d"], decision="prune",
                                 reason="idle", method="scale", result="succeeded",
                                 acted_at=now - timedelta(days=5), restore="restored",
                                 restored_at=now - timedelta(days=5) + timedelta(hours=30))
    DefragJob.objects.create(cluster=cluster, node_name="gpu-3", state=JobState.DRAINED,
                             created_at=now - timedelta(days=3, hours=1), finished_at=now - timedelta(days=3),
                             report={"pods": [{"namespace": "team-c", "name": "old-0", "gpus": 1}]})
    ServedModel.objects.create(
        cluster=cluster, namespace="team-b", name="chat-with-a-rather-long-model-name-v2", kind="pynode",
        model="chat-with-a-rather-long-model-name", framework="vllm", org_slug="acme", ready=False,
        revisions=[{"name": "chat-with-a-rather-long-model-name-v2-00002", "ready": False, "pods_running": 0,
                    "pods_pending": 1},
                   {"name": "chat-with-a-rather-long-model-name-v2-00001", "ready": True, "pods_running": 1,
                    "pods_pending": 0}],
        gpus_held=2, blocked=[{"old_revision": "chat-with-a-rather-long-model-name-v2-00001", "gpus_held": 2}],
        synced_at=now)


def _operator(django_user_model):
    user = django_user_model.objects.create_user("oncall", "oncall@example.com", "s3cret-pass", is_staff=True)
    wanted = ["view_cluster_contents", "return_to_service_defragjob", "view_defragjob", "view_servedmodel",
              "delete_old_revision", "view_prunerun", "view_prunedecision", "change_prunedecision", "view_org",
              "view_cluster"]
    user.user_permissions.add(*Permission.objects.filter(codename__in=wanted))
    return user


def _log_in(page, base: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def _check(page, name: str, problems: list[str]) -> list[dict]:
    """The page's layout checks, each failure added to `problems` (so every page is still
    looked at and saved); returns its charts. Saves a screenshot of it."""
    width = page.evaluate("document.documentElement.clientWidth")
    if width != WIDTH:
        problems.append(f"{name}: the page is {width} px wide, not {WIDTH} (a horizontal scroll bar?)")
    clipped = page.evaluate(CLIPPED_JS)
    if clipped:
        problems.append(f"{name}: {len(clipped)} link(s) cut off at the right: {clipped}")
    icons = [i for i in page.evaluate(EMPTY_ICONS_JS) if not (i["w"] > 0 and i["h"] > 0)]
    if icons:
        problems.append(f"{name}: icons not drawn: {icons}")
    charts = page.evaluate("typeof Chart === 'undefined' ? [] : " + CHARTS_JS.strip())
    for chart in charts:
        if not (chart["x"] and chart["y"]):
            problems.append(f"{name}: a chart without axis titles: {chart}")
        if not (chart["width"] > 100 and chart["height"] > 50):
            problems.append(f"{name}: a chart with no room: {chart}")
    if page.locator("canvas").count() != len(charts):
        problems.append(f"{name}: a canvas Chart.js did not draw")
    shot(page, f"panel-{name}-1366")
    target = os.environ.get("SCREENSHOTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)   # 1366 px wide, whole page
    return charts


def test_five_pages_at_1366x768_clip_no_link_draw_their_icons_and_chart_with_titled_axes(
        live_server, panel, browser_page, django_user_model):
    _operator(django_user_model)
    page = browser_page
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    base = live_server.url
    _log_in(page, base)
    problems: list[str] = []

    page.goto(f"{base}/capacity/clusters/sim/")
    assert page.locator("#gpus-by-product").is_visible()
    _check(page, "dashboard", problems)

    page.goto(f"{base}/capacity/clusters/sim/gpu-map/")
    icon = page.locator('g.node[data-node="gpu-3"] svg[aria-label="cordoned"]')
    box = icon.bounding_box()
    assert box and box["width"] >= 8 and box["height"] >= 8
    # The legend beside the map, not below it: to its right, starting level with its top.
    map_box, legend_box = page.locator("#gpu-map").bounding_box(), page.locator("#map-legend").bounding_box()
    assert legend_box["x"] >= map_box["x"] + map_box["width"], (map_box, legend_box)
    assert legend_box["y"] < map_box["y"] + map_box["height"], (map_box, legend_box)
    assert page.locator("#map-legend li.model").count() == 3
    # Buttons, node names and legend entries each on one line.
    assert page.locator("#map-cordoned a.button").count() == 1
    wrapped = page.evaluate(WRAPPED_JS, "#content a.button, #content td.node-name, #map-legend li")
    assert not wrapped, wrapped
    _check(page, "gpu-map", problems)

    # The campaign shown on the map: its nodes framed and numbered, their moves beside them
    # and inside the window, the legend still beside the map.
    page.goto(f"{base}/capacity/clusters/sim/gpu-map/?campaign=1")
    marks = page.locator("g.campaign-mark")
    assert marks.count() >= 1
    for i in range(marks.count()):
        mark = marks.nth(i)
        frame, text = mark.locator("rect.campaign-frame").bounding_box(), mark.locator("text").bounding_box()
        assert frame and frame["width"] > 0 and text and text["x"] + text["width"] <= WIDTH, (frame, text)
    assert page.locator("g.campaign-mark text", has_text="#1 →").count() == 1
    map_box, legend_box = page.locator("#gpu-map").bounding_box(), page.locator("#map-legend").bounding_box()
    assert legend_box["x"] >= map_box["x"] + map_box["width"], (map_box, legend_box)
    numbered = marks.count() - page.locator("g.kept-empty").count()
    assert page.locator("table.campaign-nodes tr").count() == numbered + 1   # its header row
    _check(page, "gpu-map-campaign", problems)

    page.goto(f"{base}/admin/capacity/servedmodel/")
    unblock = page.locator("a", has_text="delete the old revision")
    assert unblock.count() == 1 and unblock.is_visible()
    _check(page, "runbook", problems)

    run = panel["run"]
    page.goto(f"{base}/admin/pruning/prunerun/{run.pk}/change/")
    page.wait_for_function("typeof Chart !== 'undefined' && Object.keys(Chart.instances).length > 0")
    charts = _check(page, "prune-run", problems)
    decided = PruneDecision.objects.filter(run=run).count()
    assert len(charts) == decided == 2
    decided = PruneDecision.objects.count()
    assert {(c["x"], c["y"]) for c in charts} == {("time (UTC)", "GPU utilization (%)")}

    page.goto(f"{base}/admin/pruning/prunedecision/")
    assert page.locator("#result_list tbody tr").count() == decided
    _check(page, "prune-decisions", problems)

    page.goto(f"{base}/savings/clusters/sim/?days=7")
    page.wait_for_function("typeof Chart !== 'undefined' && Object.keys(Chart.instances).length > 0")
    charts = _check(page, "savings", problems)
    assert [(c["type"], c["x"], c["y"], c["datasets"]) for c in charts] == [
        ("bar", "day (UTC)", "GPU-hours freed", 4), ("line", "time (UTC)", "GPUs", 3)]
    # The GPU history of the pool: its legend's three lines, the averages beside the chart.
    assert page.locator('#gpu-history .pool[data-pool="a10g"] tr[data-line]').count() == 3
    history_box = page.locator('#gpu-history .pool[data-pool="a10g"] canvas').bounding_box()
    assert history_box["width"] >= 600 and history_box["height"] >= 200, history_box
    total = float(page.locator("#savings-total").inner_text())
    # dormancy 10 + 14 + 20 h × 2 GPUs, the trainer's 4 GPUs for 30 h, gpu-3's 8 GPUs for 3 days
    assert total >= 88 + 120 + 8 * 72
    mechanisms = page.locator("#savings-mechanisms").inner_text()
    assert "binpack" in mechanisms and "not measured" not in mechanisms
    assert "research" in page.locator("#savings-exempt").inner_text()
    csv_link = page.locator("#savings-csv")
    assert csv_link.get_attribute("href") == "/savings/clusters/sim/savings.csv?days=7"
    assert problems == [], "\n".join(problems)
