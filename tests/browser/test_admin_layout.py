"""The admin at a laptop's 1366×768 in Chromium: change lists clip no column and no action
link (the table wraps to the page), the sticky save bar never covers a form field, JSON
fields read as tables, and a multi-org preview fits with its confirm button in reach."""
from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from clusters.models import Cluster
from config import clock
from orgs import services
from audit.models import AuditEntry
from orgs.models import DormancySwitch, Org, WorkloadExemption
from tests.browser.conftest import shot
from tests.browser.test_defrag_in_browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1366, 768

# Links, buttons and submit inputs of the content whose right edge lies beyond the window or
# beyond an ancestor that clips or scrolls sideways: an action or a column header the
# operator cannot see without scrolling sideways.
CLIPPED_JS = """
() => {
  const limitOf = (el) => {
    let limit = document.documentElement.clientWidth;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") limit = Math.min(limit, p.getBoundingClientRect().right);
    }
    return limit;
  };
  const out = [];
  for (const el of document.querySelectorAll("#content a, #content button, #content input[type=submit], #content select")) {
    const r = el.getBoundingClientRect();
    if (!el.getClientRects().length || r.width === 0) continue;
    const limit = limitOf(el);
    if (r.right > limit + 1) out.push({text: (el.textContent || el.value || el.name || "").trim().slice(0, 50),
                                       right: Math.round(r.right), limit: Math.round(limit)});
  }
  return out;
}
"""
# Every header cell of the result table lies inside the window.
COLUMNS_JS = """
() => [...document.querySelectorAll("#result_list thead th")].map(th => {
  const r = th.getBoundingClientRect(); return {text: th.innerText.trim(), right: Math.round(r.right)};
}).filter(c => c.right > document.documentElement.clientWidth + 1)
"""


@pytest.fixture
def fleet(db):
    """Thirty orgs with long names, drift and pending lists, exemptions and switches: the
    widest rows the org lists show."""
    from admin_interface.models import Theme

    Theme.objects.update(form_submit_sticky=True, form_pagination_sticky=True, list_filter_sticky=True)
    cluster = Cluster.objects.create(name="production-gpu-cluster-eu-west-1", kubeconfig_path="/nonexistent")
    now = clock.now()
    for i in range(30):
        org = Org.objects.create(
            slug=f"organisation-with-a-long-name-{i:02d}", cluster=cluster,
            namespace=f"tenant-namespace-with-a-long-name-{i:02d}", last_activity_at=now - timedelta(hours=i),
            dormant=i % 3 == 0, dormant_since=now if i % 3 == 0 else None, applied="enabled" if i % 3 == 0 else "",
            drift=[{"workload": f"podautoscaler tenant-namespace-with-a-long-name-{i:02d}/model-predictor-00001",
                    "found": "1", "wanted": "0"}] if i % 4 == 0 else [],
            pending=[f"ksvc tenant-namespace-with-a-long-name-{i:02d}/pynode: 503 Service Unavailable"]
            if i % 5 == 0 else [],
            last_error="the cluster did not answer" if i % 5 == 0 else "",
            reconciled_at=now, mechanism="models via podautoscaler-patch (Knative 1.15.0); pynodes via template")
        DormancySwitch.objects.create(org=org, at=now, direction="dormant", cause="sweep",
                                      patched=[f"ksvc {org.namespace}/pynode: min-scale 1 → 0",
                                               f"podautoscaler {org.namespace}/model-predictor-00001: min-scale 1 → 0"])
        if i % 6 == 0:
            services.org_hold_set(org=org, until=now + timedelta(hours=20 + i), reason="quarter-end reports for "
                                  "the finance team, agreed with the customer", actor=None, now=now)
        if i % 7 == 0:
            services.workload_hold_set(org=org, kind="inferenceservice", name="llama-3-70b-instruct-large-model",
                                       until=None, reason="customer SLA: always warm", actor=None, now=now,
                                       not_deployed_yet=True)   # the fleet's clusters are placeholders
    return cluster


def test_admin_lists_fit_1366x768_and_forms_keep_their_fields_clear(live_server, fleet, browser_page,
                                                                    django_user_model):
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pass")
    page = browser_page
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    log_in(page, live_server.url, "oncall", "s3cret-pass")
    problems: list[str] = []

    lists = ["orgs/org", "orgs/org/?held=any", "audit/auditentry", "orgs/workloadexemption", "clusters/cluster",
             "pruning/prunerun", "pruning/prunedecision", "capacity/defragjob", "capacity/servedmodel",
             "capacity/binpackrun", "capacity/runbookaction", "capacity/resourcespec"]
    for path in lists:
        page.goto(f"{live_server.url}/admin/{path}{'' if '?' in path else '/'}")
        expect(page.locator("#changelist")).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > WIDTH:
            problems.append(f"{path}: the page is {width} px wide (scrolls sideways)")
        clipped = page.evaluate(CLIPPED_JS)
        if clipped:
            problems.append(f"{path}: cut off at the right: {clipped[:4]}")
        columns = page.evaluate(COLUMNS_JS)
        if columns:
            problems.append(f"{path}: columns beyond the window: {columns}")
        shot(page, "admin-" + path.replace("/", "-").replace("?", "-").replace("=", "-") + "-1366")
    # The org list's rows and the action bar are all there, and the remaining snooze time shows.
    page.goto(f"{live_server.url}/admin/orgs/org/?held=snoozed")
    expect(page.locator("#result_list tbody tr")).to_have_count(5)
    expect(page.locator("#result_list")).to_contain_text("h left")
    expect(page.locator("#changelist .actions button[type=submit]")).to_be_in_viewport()

    # The sticky save bar covers no field: at the end of a long form the last row sits above it.
    org = Org.objects.get(slug="organisation-with-a-long-name-00")
    page.goto(f"{live_server.url}/admin/orgs/org/{org.pk}/change/")
    bar = page.locator(".submit-row").last
    expect(bar).to_be_visible()
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    bar_top = bar.bounding_box()["y"]
    fields = page.locator("#content-main form .form-row, #content-main form .inline-group")
    last = max(fields.nth(i).bounding_box()["y"] + fields.nth(i).bounding_box()["height"]
               for i in range(fields.count()))
    if last > bar_top + 1:
        problems.append(f"org form: the save bar (top {bar_top:.0f}) covers fields ending at {last:.0f}")
    beyond = page.evaluate("""() => [...document.querySelectorAll('.inline-group thead th')]
        .filter(th => th.getClientRects().length && th.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
        .map(th => th.innerText.trim())""")
    if beyond:
        problems.append(f"org form: inline columns beyond the window: {beyond}")
    # JSON fields read as tables, not raw JSON.
    expect(page.locator(".field-drift_table table.json-rows")).to_contain_text("model-predictor-00001")
    expect(page.locator(".field-exemption")).to_contain_text("snoozed for")
    assert '[{"workload"' not in page.content()
    shot(page, "admin-org-change-1366")

    page.goto(f"{live_server.url}/admin/clusters/cluster/{fleet.pk}/change/")
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    bar = page.locator(".submit-row").last
    field_rows = page.locator("#content-main form .form-row")
    last = field_rows.nth(field_rows.count() - 1).bounding_box()
    if last["y"] + last["height"] > bar.bounding_box()["y"] + 1:
        problems.append("cluster form: the save bar covers its last field")
    shot(page, "admin-cluster-change-1366")

    # A preview of an act on several orgs fits, and its confirm button is in reach.
    page.goto(f"{live_server.url}/admin/orgs/org/")
    for i in range(3):
        page.locator("#result_list tbody tr").nth(i).locator("input.action-select").check()
    page.select_option("#changelist .actions select[name=action]", "exempt_or_snooze")
    page.locator("#changelist .actions button[type=submit]").click()
    expect(page.locator("#preview-table tbody tr.preview-org")).to_have_count(3)
    if page.evaluate(CLIPPED_JS):
        problems.append(f"preview: cut off at the right: {page.evaluate(CLIPPED_JS)[:4]}")
    page.locator("#id_reason").fill("launch week")
    page.locator("#preview-confirm").click()
    expect(page.locator("ul.messagelist")).to_contain_text("snoozed for 23 h")
    assert Org.objects.filter(snoozed_until__isnull=False).count() >= 3
    assert AuditEntry.objects.filter(action="org_snooze").count() >= 3
    assert WorkloadExemption.objects.count() == 5
    assert problems == [], "\n".join(problems)
