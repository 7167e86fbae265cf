"""A cluster that is gone is retired, never deleted with its history: a superuser's delete is
refused in one line saying what names it, "Retire…" keeps it (audited, with when and by whom,
its orgs with it), the lists and periodic jobs that act skip it and the history pages still
show it. A cluster no record names may still be deleted, and that is audited."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from audit.models import AuditEntry
from clusters.models import Cluster
from clusters.selectors import cluster_find, cluster_names, clusters_all, clusters_with_orgs
from config import clock
from orgs import services as orgs
from orgs.models import Org
from capacity.binpack.tasks import binpack_all_clusters
from capacity.defrag.models import DefragJob, JobState
from capacity.defrag.tasks import defrag_jobs_resume
from capacity.runbook.tasks import registry_sync_all_clusters
from clusters.fanout import cluster_for_task
from clusters.tasks import discovery_refresh_all
from pruning import tasks as pruning_tasks
from pruning.models import PruneRun

AT = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def operator(client, django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def east(db):
    """A cluster with history: an org, three prune runs, two audit entries."""
    cluster = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent", prometheus_url="http://127.0.0.1:9")
    Org.objects.create(slug="acme", cluster=cluster, namespace="acme", last_activity_at=AT - timedelta(days=3))
    for _ in range(3):
        PruneRun.objects.create(cluster=cluster, evaluated_at=AT)
    for action in ("scale_down", "scale_up"):
        AuditEntry.objects.create(at=AT, app="pruning", action=action, cluster=cluster)
    return cluster


def _said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_deleting_a_cluster_with_history_is_refused_in_one_line_and_changes_nothing(operator, east):
    page = operator.get(reverse("admin:clusters_cluster_change", args=[east.pk])).content.decode()
    assert 'class="deletelink"' not in page and 'id="retire-link"' in page

    for response in (operator.get(reverse("admin:clusters_cluster_delete", args=[east.pk]), follow=True),
                     operator.post(reverse("admin:clusters_cluster_delete", args=[east.pk]), {"post": "yes"},
                                   follow=True)):
        assert _said(response) == ["cluster east kept: 2 audit entries, 1 org and 3 prune runs name it, and "
                                   "deleting it would lose them; retire it instead"]
    response = operator.post(reverse("admin:clusters_cluster_changelist"),
                             {"action": "delete_selected", "_selected_action": [east.pk], "post": "yes"}, follow=True)
    assert _said(response)[-1] == "nothing was deleted"
    assert "cluster east kept: 2 audit entries, 1 org and 3 prune runs name it" in _said(response)[0]
    assert Cluster.objects.filter(pk=east.pk).exists() and PruneRun.objects.filter(cluster=east).count() == 3
    assert not AuditEntry.objects.filter(action__in=["cluster_deleted", "cluster_retired"]).exists()


def test_retire_keeps_the_cluster_and_its_orgs_audited_and_out_of_what_acts(operator, east):
    # In service, the periodic jobs queue their work for it (to the tests' in-memory broker).
    DefragJob.objects.create(cluster=east, node_name="gpu-1", state=JobState.WAITING, created_at=AT)
    assert pruning_tasks.prune_all_clusters() == 1 and binpack_all_clusters() == 1 and defrag_jobs_resume() == 1
    assert orgs.dormancy_sweep(now=clock.now(), dry_run=True).switched == ("acme",)
    confirm = operator.get(reverse("admin:clusters_cluster_retire", args=[east.pk]))
    said = confirm.content.decode()
    assert "Their orgs in service are retired with them, and a defrag job still open on them is no longer " \
           "stepped." in said
    assert "<li>east: 2 audit entries, 1 defrag job, 1 org, 3 prune runs</li>" in said
    assert Cluster.objects.filter(pk=east.pk).exists()     # the page changes nothing
    response = operator.post(reverse("admin:clusters_cluster_retire", args=[east.pk]), {"confirm": "yes"},
                             follow=True)
    assert "east: retired, with its org(s) acme" in _said(response)[0]

    row = Cluster.all_objects.get(pk=east.pk)
    assert row.retired_at is not None and row.retired_by == operator.user
    retired = AuditEntry.objects.get(action="cluster_retired")
    assert (retired.target, retired.actor, retired.cluster_id) == ("Cluster/east", operator.user, east.pk)
    org_entry = AuditEntry.objects.get(action="org_retired")
    assert org_entry.target == "Org/acme" and "its cluster east was retired" in org_entry.cause
    assert Org.all_objects.get(slug="acme").retired_at == row.retired_at

    # The lists and periodic jobs that act no longer reach it.
    assert list(clusters_all()) == [] and cluster_names() == [] and list(clusters_with_orgs()) == []
    assert cluster_find(name="east") is None
    assert pruning_tasks.prune_all_clusters() == 0     # no prune enqueued for it
    assert binpack_all_clusters() == 0 and registry_sync_all_clusters() == 0 and discovery_refresh_all() == 0
    assert defrag_jobs_resume() == 0    # its open defrag job is no longer stepped
    assert cluster_for_task(east.pk, job="binpack") is None   # a task queued before the retire does nothing
    assert orgs.dormancy_sweep(now=clock.now(), dry_run=True).switched == ()   # acme was idle for days
    changelist = operator.get(reverse("admin:clusters_cluster_changelist"))
    assert list(changelist.context["cl"].result_list) == []

    # The history still shows it.
    assert cluster_find(name="east", retired=True) == row
    retired_list = operator.get(reverse("admin:clusters_cluster_changelist") + "?retired=yes")
    assert list(retired_list.context["cl"].result_list) == [row]
    page = operator.get(reverse("admin:clusters_cluster_change", args=[east.pk])).content.decode()
    assert "retired 20" in page and "by operator" in page and 'name="_save"' not in page
    runs = operator.get(reverse("admin:pruning_prunerun_changelist")).content.decode()
    assert runs.count("east (retired)") >= 3
    assert PruneRun.objects.filter(cluster_id=east.pk).count() == 3


def test_retiring_twice_or_acting_on_a_retired_cluster_changes_nothing(operator, east):
    operator.post(reverse("admin:clusters_cluster_retire", args=[east.pk]), {"confirm": "yes"})
    again = operator.post(reverse("admin:clusters_cluster_retire", args=[east.pk]), {"confirm": "yes"}, follow=True)
    assert _said(again)[-1] == "east (retired) is already retired: nothing changed"
    assert AuditEntry.objects.filter(action="cluster_retired").count() == 1


def test_a_cluster_a_new_row_of_the_same_name_replaces_is_kept_apart(operator, east):
    def add():
        return operator.post(reverse("admin:clusters_cluster_add"), {"name": "east", "kubeconfig_path": "/other",
                                                                     "prometheus_verify_tls": "on"})

    refused = add()
    assert refused.context["adminform"].form.errors["name"] == ["A cluster in service already has this name."]
    operator.post(reverse("admin:clusters_cluster_retire", args=[east.pk]), {"confirm": "yes"})
    assert add().status_code == 302
    fresh = Cluster.objects.get(name="east")
    assert fresh.pk != east.pk and fresh.kubeconfig_path == "/other"
    assert cluster_find(name="east") == fresh
    assert cluster_find(name="east", retired=True) == fresh


def test_a_cluster_nothing_names_is_deleted_through_the_admin_and_audited(operator, db):
    spare = Cluster.objects.create(name="typo", kubeconfig_path="/nonexistent")
    page = operator.get(reverse("admin:clusters_cluster_change", args=[spare.pk])).content.decode()
    assert 'class="deletelink"' in page and "none: it may be deleted" in page
    operator.post(reverse("admin:clusters_cluster_delete", args=[spare.pk]), {"post": "yes"})
    assert not Cluster.all_objects.filter(pk=spare.pk).exists()
    entry = AuditEntry.objects.get(action="cluster_deleted")
    assert (entry.target, entry.actor, entry.subject_id, entry.old["kubeconfig_path"]) == (
        "Cluster/typo", operator.user, spare.pk, "/nonexistent")


def test_bulk_delete_deletes_only_when_no_selected_cluster_is_named(operator, east):
    spare = Cluster.objects.create(name="typo", kubeconfig_path="/nonexistent")
    operator.post(reverse("admin:clusters_cluster_changelist"),
                  {"action": "delete_selected", "_selected_action": [east.pk, spare.pk], "post": "yes"})
    assert Cluster.objects.filter(pk__in=[east.pk, spare.pk]).count() == 2    # one named: none deleted
    operator.post(reverse("admin:clusters_cluster_changelist"),
                  {"action": "delete_selected", "_selected_action": [spare.pk], "post": "yes"})
    assert not Cluster.all_objects.filter(pk=spare.pk).exists()
    assert AuditEntry.objects.filter(action="cluster_deleted", target="Cluster/typo").count() == 1
