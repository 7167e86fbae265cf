"""A filter typed into a list's address that the database cannot run (a year out of range, a
regular expression PostgreSQL cannot parse) brings the operator back to the whole list, which
names the filter it could not apply: never a server error, never the database's own text."""
from __future__ import annotations

import pytest
from django.contrib import admin
from django.utils import timezone

from audit.services import audit
from capacity.binpack.models import BinpackRun
from capacity.defrag.models import DefragJob, JobState
from clusters.models import Cluster
from orgs.models import Org
from pruning.models import PruneDecision, PruneRun

pytestmark = pytest.mark.django_db

PRODUCT_APPS = {"audit", "capacity", "clusters", "orgs", "pruning", "savings"}

HOSTILE = [
    ("audit/auditentry", "at__year=0", "east-node-1"),
    ("audit/auditentry", "at__year=99999999", "east-node-1"),
    ("audit/auditentry", "target__regex=((", "east-node-1"),
    ("pruning/prunerun", "started_at__year=99999999", "prune run"),
    ("pruning/prunerun", "started_at__year=99999999&started_at__month=1", "prune run"),
    ("pruning/prunedecision", "pod__regex=[", "web-0"),
    ("pruning/prunedecision", "owner_name__iregex=((", "web-0"),
    ("capacity/defragjob", "created_at__year=-1", "east-node-1"),
    ("capacity/defragjob", "node_name__regex=((", "east-node-1"),
    ("capacity/binpackrun", "finished_at__year=0", "east"),
    ("capacity/binpackrun", "actor_label__regex=((", "east"),
    ("orgs/org", "created_at__year=-1", "acme"),
    ("orgs/org", "slug__iregex=((", "acme"),
    ("clusters/cluster", "name__regex=((", "east"),
]


@pytest.fixture
def operator(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))


@pytest.fixture
def rows():
    now = timezone.now()
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=now)
    audit(app="defrag", action="node_cordon", at=now, target="Node/east-node-1", cluster=cluster)
    run = PruneRun.objects.create(cluster=cluster, evaluated_at=now)
    PruneDecision.objects.create(run=run, namespace="acme", pod="web-0", owner_name="web", decision="prune",
                                 reason="idle")
    DefragJob.objects.create(cluster=cluster, node_name="east-node-1", state=JobState.CONFIRMED, created_at=now)
    BinpackRun.objects.create(cluster=cluster, started_at=now, trigger=BinpackRun.Trigger.ADMIN)


@pytest.mark.parametrize(("listing", "query", "row_shown"), HOSTILE)
def test_a_filter_the_database_cannot_run_gives_back_the_whole_list_naming_it(client, operator, rows, listing,
                                                                              query, row_shown):
    url = f"/admin/{listing}/"
    answer = client.get(f"{url}?{query}")
    assert answer.status_code == 302 and answer["Location"] == f"{url}?e=1"

    page = client.get(answer["Location"])
    assert page.status_code == 200
    html = page.content.decode()
    said = [str(m) for m in page.context["messages"]]
    assert said and said[0].startswith("Filter" if "&" not in query else "Filters")
    assert all(part in said[0] for part in query.split("&")) and said[0].endswith("The whole list is shown.")
    assert row_shown in html                              # the list itself still works
    assert "invalid regular expression" not in html and "out of range" not in html
    assert client.get(url).status_code == 200             # and so does the next request


def panel_lists() -> list:
    return sorted(f"/admin/{m._meta.app_label}/{m._meta.model_name}/" for m in admin.site._registry
                  if m._meta.app_label in PRODUCT_APPS)


@pytest.mark.parametrize("url", panel_lists())
def test_every_list_of_the_panel_answers_a_regular_expression_that_does_not_parse(client, operator, rows, url):
    answer = client.get(f"{url}?id__regex=((")
    assert answer.status_code == 302 and answer["Location"] == f"{url}?e=1"
    assert client.get(answer["Location"]).status_code == 200


def test_a_filter_django_itself_refuses_is_named_too_and_a_good_one_still_filters(client, operator, rows):
    answer = client.get("/admin/orgs/org/?nope=1", follow=True)
    assert [str(m) for m in answer.context["messages"]] == [
        "Filter not applied: nope=1 is not a field of this list or not a value it can take. The whole list is shown."]
    good = client.get("/admin/audit/auditentry/?target__regex=^Node/east")
    assert good.status_code == 200 and "east-node-1" in good.content.decode()
