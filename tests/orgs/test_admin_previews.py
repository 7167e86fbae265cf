"""The panel: an act on several orgs shows what it would change (each org, each workload)
before anything is written; exemptions and snoozes from the org list and for one workload;
JSON fields shown as tables."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from clusters import kube
from config import clock
from orgs import services
from audit.models import AuditEntry
from orgs.models import Org, WorkloadExemption
from tests.orgs.test_admin import CHANGELIST, operator
from tests.orgs.test_services import ann, ksvc_min_scale, make_idle, scenario

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    sim.advance(0)
    return sim


def ids(*slugs):
    return [str(Org.objects.get(slug=s).id) for s in slugs]


def text(page) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.content.decode()))


def test_disallow_on_two_orgs_previews_each_orgs_workload_changes_and_writes_nothing(client, cluster):
    gw = cluster.gateway
    client.force_login(operator("disallow_scale_to_zero"))
    audits = AuditEntry.objects.count()

    page = client.post(CHANGELIST, {"action": "disallow_scale_to_zero", "_selected_action": ids("acme", "globex"),
                                    "index": "0"})

    assert page.status_code == 200 and page.templates[0].name == "admin/orgs/org/action_preview.html"
    body = text(page)
    assert "Nothing has been changed yet" in body
    acme = {p.org: p for p in page.context["previews"]}["acme"]
    assert acme.now == "dormant, scale to zero allowed" and acme.setting == "disabled"
    assert "ksvc acme/pynode: min-scale 0 → 1 (owner's value restored)" in acme.changes
    assert "revision acme/big-predictor-00001: min-scale 0 → 2" in acme.changes
    assert {p.org: p.changes for p in page.context["previews"]}["globex"] == []
    assert "revision acme/big-predictor-00001: min-scale 0 → 2" in body
    # Nothing written: the cluster, the org rows and the audit are as before.
    assert ksvc_min_scale(gw, "pynode") == "0" and ann(gw, kube.REVISIONS, "big-predictor-00001") == "0"
    assert Org.objects.get(slug="acme").scale_to_zero_allowed and AuditEntry.objects.count() == audits

    page = client.post(CHANGELIST, {"action": "disallow_scale_to_zero", "_selected_action": ids("acme", "globex"),
                                    "index": "0", "confirm": "yes"}, follow=True)
    cluster.advance(0)
    assert "scale to zero disallowed for 2 org(s)" in text(page).lower()
    assert ksvc_min_scale(gw, "pynode") == "1" and ann(gw, kube.REVISIONS, "big-predictor-00001") == "2"
    assert AuditEntry.objects.filter(action="org_disallow_scale_to_zero").count() == 2


def test_the_sweep_preview_lists_the_orgs_it_would_mark_whatever_was_selected(client, cluster):
    make_idle("globex")
    client.force_login(operator("run_dormancy_sweep"))
    page = client.post(CHANGELIST, {"action": "run_dormancy_sweep_now", "_selected_action": ids("acme"),
                                    "index": "0"})
    assert [p.org for p in page.context["previews"]] == ["globex"]
    assert page.context["previews"][0].changes == ["ksvc globex/pynode: min-scale 1 → 0 (owner's value 1 recorded)"]
    assert not Org.objects.get(slug="globex").dormant


def test_snoozing_orgs_from_the_list_asks_how_long_and_why_then_shows_the_time_left(client, cluster):
    user = operator("exempt")
    client.force_login(user)
    form = {"action": "exempt_or_snooze", "_selected_action": ids("acme", "globex"), "index": "0"}
    page = client.post(CHANGELIST, form)
    assert "acme" in {p.org for p in page.context["previews"]}
    assert {p.org: p.after for p in page.context["previews"]}["acme"].startswith("active")

    refused = client.post(CHANGELIST, {**form, "confirm": "yes", "hold": "until", "until_time": "", "reason": "x"})
    assert refused.status_code == 200 and "give the time the snooze ends" in text(refused)
    assert not Org.objects.filter(snoozed_until__isnull=False).exists()

    done = client.post(CHANGELIST, {**form, "confirm": "yes", "hold": "24h", "reason": "quarter-end reports"},
                       follow=True)
    cluster.advance(0)
    acme = Org.objects.get(slug="acme")
    assert not acme.dormant and acme.snoozed_until - clock.now() > timedelta(hours=23, minutes=58)
    assert "it was dormant and is marked active" in text(done).lower()
    assert ksvc_min_scale(cluster.gateway, "pynode") == "1"
    assert AuditEntry.objects.filter(action="org_snooze", actor=user).count() == 2

    listed = client.get(CHANGELIST + "?held=snoozed")
    assert re.search(r"snoozed, 2[34] h \d+ min left", text(listed))
    assert [o.slug for o in listed.context["cl"].result_list] == ["acme", "globex"]
    assert list(client.get(CHANGELIST + "?held=none").context["cl"].result_list) == []
    detail = text(client.get(f"{CHANGELIST}{acme.id}/change/"))
    assert "snoozed for 23 h 59 min more" in detail and "quarter-end reports" in detail


def test_one_model_is_exempted_from_the_panel_and_the_exemption_removed_again(client, cluster):
    user = operator("exempt", "view_workloadexemption", "view_org")
    client.force_login(user)
    acme = Org.objects.get(slug="acme")
    add = "/admin/orgs/workloadexemption/add/"
    page = client.post(add, {"org": acme.id, "kind": "inferenceservice", "name": "big", "hold": "exempt",
                             "reason": "customer SLA"}, follow=True)
    cluster.advance(0)
    assert page.status_code == 200, text(page)[:500]
    assert ann(cluster.gateway, kube.REVISIONS, "big-predictor-00001") == "2"
    exemption = WorkloadExemption.objects.get()
    assert (exemption.until, exemption.reason, exemption.created_by) == (None, "customer SLA", user)
    assert "inferenceservice acme/big: exempt until removed: customer sla" in text(page).lower()

    page = client.post(f"/admin/orgs/workloadexemption/{exemption.id}/delete/", {"post": "yes"}, follow=True)
    cluster.advance(0)
    assert not WorkloadExemption.objects.exists()
    assert ann(cluster.gateway, kube.REVISIONS, "big-predictor-00001") == "0"
    assert AuditEntry.objects.filter(action="workload_exemption_end", actor=user).exists()


def test_exemptions_need_their_own_permission(client, cluster):
    client.force_login(operator("mark_active", "disallow_scale_to_zero", "allow_scale_to_zero"))
    choices = {name for name, _ in client.get(CHANGELIST).context["action_form"].fields["action"].choices}
    assert "exempt_or_snooze" not in choices and "end_exemption" not in choices
    assert client.get("/admin/orgs/workloadexemption/add/").status_code == 403


def test_json_fields_read_as_tables(client, cluster):
    switch = Org.objects.get(slug="acme").switches.get(direction="dormant")
    assert switch.patched
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get(f"{CHANGELIST}{Org.objects.get(slug='acme').id}/change/").content.decode()
    assert 'class="json-list"' in page and "ksvc acme/pynode: min-scale 1 → 0" in page
    assert '["ksvc' not in page, "no raw JSON list on the page"
    record = AuditEntry.objects.filter(action="scale_to_zero_applied").first()
    page = client.get(f"/admin/audit/auditentry/{record.id}/change/").content.decode()
    assert 'class="json-table json-mapping"' in page and "revision acme/big-predictor-00001" in page
    assert '{"' not in page
