"""Normal states read as words in the panel, not as Django's boolean icons (a red ✖ beside
"not dormant" or "wrote" reads as an error)."""
from __future__ import annotations

import re

import pytest
from django.urls import reverse

from capacity.binpack.models import BinpackRun
from clusters.models import Cluster
from config import clock
from orgs.models import Org

pytestmark = pytest.mark.django_db


def _field(html: str, name: str) -> str:
    return re.search(rf'<div class="[^"]*field-{name}(?=[\s"])[^"]*">(.*?)</div>\s*</div>', html, re.S).group(1)


def test_an_orgs_page_says_dormancy_and_scale_to_zero_in_words(admin_client):
    cluster = Cluster.objects.create(name="nowhere", kubeconfig_path="/nonexistent")
    active = Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=clock.now())
    asleep = Org.objects.create(slug="quiet", cluster=cluster, namespace="quiet", dormant=True,
                                dormant_since=clock.now(), scale_to_zero_allowed=False)
    shown = {}
    for org in (active, asleep):
        html = admin_client.get(reverse("admin:orgs_org_change", args=[org.pk])).content.decode()
        assert "icon-no.svg" not in html and "icon-yes.svg" not in html
        shown[org.slug] = (_field(html, "dormancy"), _field(html, "scale_to_zero"))
    assert "active" in shown["acme"][0] and "allowed" in shown["acme"][1]
    assert "dormant" in shown["quiet"][0] and "turned off" in shown["quiet"][1]
    # Read only: the form offers neither to edit (the actions change them, audited).
    html = admin_client.get(reverse("admin:orgs_org_change", args=[active.pk])).content.decode()
    assert 'name="dormant"' not in html and 'name="scale_to_zero_allowed"' not in html


def test_the_binpack_run_list_names_each_runs_mode(admin_client):
    cluster = Cluster.objects.create(name="nowhere", kubeconfig_path="/nonexistent")
    for dry_run in (False, True):
        BinpackRun.objects.create(cluster=cluster, started_at=clock.now(), trigger=BinpackRun.Trigger.ADMIN,
                                  dry_run=dry_run)
    html = admin_client.get(reverse("admin:capacity_binpackrun_changelist")).content.decode()
    listing = html.split('id="result_list"')[1]
    assert sorted(re.findall(r'<td class="field-mode">([^<]*)</td>', listing)) == ["dry run", "write"]
    assert "icon-no.svg" not in listing and "icon-yes.svg" not in listing
