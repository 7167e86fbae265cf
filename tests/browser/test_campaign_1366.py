"""The campaign page and its abort confirmation at a laptop's 1366×768 in Debian's Chromium:
a running campaign with a node safe, one being emptied and one dropped, and the empty nodes
it keeps empty. What the operator checks is there (the plan's order and moves, each node's
state and its defrag job, the dropped node's reason), nothing is cut off or broken across
lines, and the page does not scroll sideways.

With SCREENSHOTS_DIR set (`make screenshots`), both pages are saved there as PNGs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from capacity.campaigns.models import NodeRole, NodeState
from clusters import kube as kube_gateway
from tests.browser.conftest import WRAPPED_JS
from tests.browser.test_pages_1366 import HEIGHT, WIDTH, _check

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capacity"))
from campaign_cluster import half_full_pool, run, start, tick  # noqa: E402
from defrag_builders import make_node  # noqa: E402
from defrag_cluster import Kube  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEPT_EMPTY = ("n7", "n8")

# Table cells whose text runs past their box (a word longer than its column, cut or spilling).
OVERFLOWING_JS = """
(selector) => [...document.querySelectorAll(selector)].filter(el => el.getClientRects().length)
  .filter(el => el.scrollWidth > el.clientWidth + 1)
  .map(el => ({text: el.textContent.trim().slice(0, 60), scroll: el.scrollWidth, client: el.clientWidth}))
"""


class World:
    """What campaign_cluster's start and run need: the cluster, a gateway, its clock."""

    def __init__(self, handle):
        self.control, self.cluster = handle.control, handle.cluster
        self.cluster.name = "sim"
        self.cluster.save(update_fields=["name"])
        self.gateway = kube_gateway.gateway_for(self.cluster)
        self.kube = Kube(handle.kubeconfig_path)
        self.handle = handle

    def now(self):
        return self.handle.sim.clock.now()

    def advance(self, seconds: float):
        self.control.advance(seconds)
        return self.now()


@pytest.fixture
def campaign(sim_cluster_factory):
    """Six half-full nodes and two empty ones: the campaign frees three and keeps the empty
    two empty; the first is safe, the second dropped (its node says do-not-disrupt), the
    third being emptied."""
    world = World(sim_cluster_factory(half_full_pool(6) + [make_node(n, unschedulable=True) for n in KEPT_EMPTY]))
    world.advance(60)
    for name in KEPT_EMPTY:        # empty when the campaign plans: kept empty under LeastAllocated
        world.kube.core.patch_node(name, {"spec": {"unschedulable": False}})
    campaign = tick(world, start(world, max_in_flight=1))
    second = campaign.nodes.get(position=2)
    world.kube.core.patch_node(second.node_name, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    campaign = run(world, campaign, until=lambda c: c.nodes.filter(state=NodeState.RUNNING).exists()
                   and c.nodes.filter(state=NodeState.DROPPED).exists())
    assert [r.state for r in campaign.nodes.filter(role=NodeRole.FREED).order_by("position")] == [
        NodeState.SAFE, NodeState.DROPPED, NodeState.RUNNING]
    assert sorted(campaign.nodes.filter(role=NodeRole.KEPT_EMPTY).values_list("node_name", flat=True)) == \
        list(KEPT_EMPTY)
    return campaign


def _log_in(page, base: str, django_user_model) -> None:
    user = django_user_model.objects.create_user("oncall", "oncall@example.com", "s3cret-pass", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=[
        "view_campaign", "change_campaign", "view_defragjob", "view_cluster_contents"]))
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def _one_line(page, selector: str, problems: list[str], name: str) -> None:
    wrapped = page.evaluate(WRAPPED_JS, selector)
    if wrapped:
        problems.append(f"{name}: broken across lines: {wrapped}")
    spilled = page.evaluate(OVERFLOWING_JS, selector)
    if spilled:
        problems.append(f"{name}: text running past its cell: {spilled}")


def test_the_campaign_page_and_its_abort_at_1366x768(live_server, campaign, browser_page, django_user_model):
    page = browser_page
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    base = live_server.url
    _log_in(page, base, django_user_model)
    problems: list[str] = []

    page.goto(f"{base}/admin/capacity/campaign/{campaign.pk}/change/")
    rows = page.locator("#campaign-nodes tbody tr")
    freed = list(campaign.nodes.filter(role=NodeRole.FREED).select_related("job").order_by("position"))
    assert rows.count() == len(freed) == len(campaign.plan["nodes"])
    for i, (row, planned) in enumerate(zip(freed, campaign.plan["nodes"])):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == str(planned["position"]) == str(i + 1)
        assert cells.nth(1).inner_text() == row.node_name == planned["node"]
        assert row.get_state_display() in rows.nth(i).inner_text()
        moves = rows.nth(i).locator("td.moves").inner_text()
        for move in planned["moves"]:
            assert f"{move['pod']} ({move['gpus']} GPUs) → {move['to']}" in moves, moves
        link = rows.nth(i).locator("td.job a")
        if row.job is None:
            assert link.count() == 0
        else:
            assert link.get_attribute("href") == f"/admin/capacity/defragjob/{row.job.pk}/change/"
            assert link.inner_text() == f"#{row.job.pk}"
    dropped = freed[1]
    assert dropped.dropped_reason in rows.nth(1).inner_text()
    assert 'the node says karpenter.sh/do-not-disrupt: "true"' in dropped.dropped_reason
    kept = page.locator("#campaign-kept tbody tr")
    assert [kept.nth(i).locator("td").first.inner_text() for i in range(kept.count())] == list(KEPT_EMPTY)
    # What the operator reads first is above the fold: the state, what to do next, the nodes.
    for selector in ("#campaign-state", "#campaign-next", "#campaign-nodes"):
        box = page.locator(selector).bounding_box()
        assert box and box["y"] < HEIGHT, (selector, box)
    # The internals are folded.
    assert not page.locator(".field-lease_owner").is_visible()
    _one_line(page, "#campaign-nodes td.token, #campaign-nodes td.job, #campaign-nodes td.state strong, #campaign-nodes .move, "
                    "#campaign-kept td, #campaign-audit td.token, #campaign-audit td.action", problems, "campaign")
    _check(page, "campaign", problems)

    page.click("#campaign-abort")
    page.wait_for_url(f"**/admin/capacity/campaign/{campaign.pk}/abort/")
    text = page.locator("#content").inner_text()
    assert f"Abort campaign #{campaign.pk} of cluster sim?" in text
    running = freed[2]
    assert f"#{running.job.pk} on {running.node_name}" in text
    for name in (freed[0].node_name, freed[2].node_name, *KEPT_EMPTY):
        assert name in text
    button = page.locator("button[name=confirm]")
    assert button.is_visible() and button.bounding_box()["y"] + button.bounding_box()["height"] <= HEIGHT
    _check(page, "campaign-abort", problems)
    assert problems == [], "\n".join(problems)
    campaign.refresh_from_db()
    assert campaign.abort_requested_at is None, "looking at the confirmation asks nothing"
