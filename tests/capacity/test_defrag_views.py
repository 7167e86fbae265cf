"""The GPU map, the admin's report → confirm page, drain permission, and the progress JSON."""
from __future__ import annotations

import re

import pytest

from capacity.defrag.models import DefragJob, JobState
from clusters import kube
from defrag_builders import make_model_pod, make_node, make_pod

pytestmark = pytest.mark.django_db


def bound(pod: dict) -> dict:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def objects():
    return [make_node("n1"), make_node("n2"), make_node("n3", unschedulable=True),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-b"}},
            bound(make_model_pod("big-1", revision="big-00001", node="n1", gpus=6)),
            bound(make_model_pod("small-1", revision="small-00001", namespace="org-b", node="n2", gpus=1)),
            bound(make_pod("notebook-0", node="n2", gpus=1, owner=("StatefulSet", "notebook"))),
            *revision_objects("small-00001", "org-b", replicas=1)]


def revision_objects(revision: str, namespace: str, *, replicas: int, template_hash: str = "547cc9b97f"):
    """The PodAutoscaler and ReplicaSet discovery reads, matching the pre-bound pods above."""
    rs_name = f"{revision}-deployment-{template_hash}"
    labels = {"serving.knative.dev/revision": revision, "pod-template-hash": template_hash}
    return [
        {"apiVersion": "autoscaling.internal.knative.dev/v1alpha1", "kind": "PodAutoscaler",
         "metadata": {"name": revision, "namespace": namespace},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{revision}-deployment"},
                  "protocolType": "http1"},
         "status": {"actualScale": replicas, "desiredScale": replicas}},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet",
         "metadata": {"name": rs_name, "namespace": namespace, "uid": f"uid-{rs_name}", "labels": labels},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "m", "image": "m"}]}}},
         "status": {"replicas": replicas, "readyReplicas": replicas}},
    ]


@pytest.fixture
def staff(django_user_model, client):
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return user


def test_gpu_map_draws_one_row_of_cells_per_node_and_offers_defrag(sim_cluster_factory, client, staff):
    handle = sim_cluster_factory(objects(), name="sim")
    page = client.get("/capacity/clusters/sim/gpu-map/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="node"') == 3
    assert len(re.findall(r'<rect x="\d+" y="0"', html)) == 24     # 3 nodes × 8 GPU cells
    n3 = html[html.index('data-node="n3"'):]
    assert '<title>cordoned</title>' in n3[:n3.index("</text>")]    # cordoned is marked, as an icon
    assert "org-a/big-1 (org-a/big)" in html                 # a cell's tooltip names the pod and org/model
    assert "defrag this node" in html and "node=n1" in html
    assert "node=n2" not in html                             # the notebook blocks n2
    del handle


def test_admin_start_shows_the_report_then_confirm_creates_the_job(sim_cluster_factory, client, staff):
    sim_cluster_factory(objects(), name="sim")
    report = client.get("/admin/capacity/defragjob/start/?cluster=sim&node=n2")
    html = report.content.decode()
    assert report.status_code == 200
    assert "Found pods to defrag:" in html and "org-b/small-1" in html
    assert "notebook-0" in html and "StatefulSet" in html   # the blocker, before confirmation
    assert not DefragJob.objects.exists()                    # nothing changed yet
    shown = re.search(r'name="report" value="([0-9a-f]{16})"', html).group(1)
    done = client.post("/admin/capacity/defragjob/start/", {"cluster": "sim", "node": "n2", "confirm": "yes",
                                                             "timeout": "600", "poll_interval": "5", "report": shown})
    job = DefragJob.objects.get()
    assert done.status_code == 302 and done["Location"].endswith(f"/admin/capacity/defragjob/{job.pk}/change/")
    assert (job.state, job.requested_by, job.timeout_seconds) == (JobState.CONFIRMED, staff, 600)
    progress = client.get(f"/capacity/defrag-jobs/{job.pk}/progress.json").json()
    assert progress["state"] == "confirmed" and "Proceed with defrag? (y/n): y" in progress["log"]
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert "progress.json" in page and "Abort…" in page
    audit = page.split('id="defrag-audit"', 1)[1].split("</fieldset>", 1)[0]    # the job's audit entries
    shown_audit = re.sub(r"<[^>]+>", "", audit)     # as read: an action's name may break after an underscore
    assert "job_confirm" in shown_audit and "Node/n2" in shown_audit and staff.get_username() in shown_audit
    assert 'class="json-table' in page and "&quot;" not in page.split('class="json-table', 1)[1][:200]


def test_a_confirmation_of_a_report_the_node_no_longer_matches_starts_nothing_and_shows_it_again(
        sim_cluster_factory, client, staff):
    handle = sim_cluster_factory(objects(), name="sim")
    html = client.get("/admin/capacity/defragjob/start/?cluster=sim&node=n2").content.decode()
    shown = re.search(r'name="report" value="([0-9a-f]{16})"', html).group(1)
    assert "scratch-shell" not in html
    handle.gateway.create(kube.PODS, make_pod("scratch-shell", namespace="org-b", node="n2", gpus=1),
                          namespace="org-b")

    page = client.post("/admin/capacity/defragjob/start/", {"cluster": "sim", "node": "n2", "confirm": "yes",
                                                             "timeout": "600", "poll_interval": "5", "report": shown})

    assert page.status_code == 200 and not DefragJob.objects.exists()
    text = page.content.decode()
    assert "Not started: node n2 changed since its report was shown" in text
    assert "scratch-shell" in text                          # the report as the node is now
    assert re.search(r'name="report" value="([0-9a-f]{16})"', text).group(1) != shown


def test_drain_page_needs_its_own_permission(sim_cluster_factory, client, django_user_model):
    from django.contrib.auth.models import Permission

    sim_cluster_factory(objects(), name="sim")
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_defragjob", "change_defragjob"]))
    client.force_login(user)
    from clusters.models import Cluster

    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=JobState.SAFE,
                                   created_at="2026-01-01T00:00:00Z")
    assert client.get(f"/admin/capacity/defragjob/{job.pk}/drain/").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="drain_defragjob"))
    user = django_user_model.objects.get(pk=user.pk)
    client.force_login(user)
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/drain/")
    assert page.status_code == 200 and "Type the node name" in page.content.decode()
    assert "refusals are retried every 5 s" in page.content.decode()    # kubectl's 5 s: the job polls every 10 s
    wrong = client.post(f"/admin/capacity/defragjob/{job.pk}/drain/", {"confirm": "n2"})
    assert wrong.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.SAFE                        # a wrong second confirmation does nothing
    client.post(f"/admin/capacity/defragjob/{job.pk}/drain/", {"confirm": "n1"})
    job.refresh_from_db()
    # A request the next step takes up (the job is SAFE until a worker does).
    assert job.drain_requested_at is not None and job.drain_requested_by == user


def test_unknown_node_on_the_start_page_says_so(sim_cluster_factory, client, staff):
    sim_cluster_factory(objects(), name="sim")
    response = client.get("/admin/capacity/defragjob/start/?cluster=sim&node=ghost", follow=True)
    assert "node &#x27;ghost&#x27; not found in cluster &#x27;sim&#x27;" in response.content.decode()


def test_a_stuck_abort_offers_keep_or_delete_and_deleting_needs_the_capacity_box(sim_cluster_factory, client, staff):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1",
                                   state=JobState.ABORT_STUCK, created_at="2026-01-01T00:00:00Z",
                                   abort_requested_at="2026-01-01T00:01:00Z", abort_started_at="2026-01-01T00:01:00Z",
                                   error="Abort stuck after 300s: the replacements cannot become ready. …")
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/abort/").content.decode()
    assert "Abort stuck after 300s" in page and 'value="keep"' in page and 'value="delete"' in page
    assert "Keep or delete the orphans…" in client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    client.post(f"/admin/capacity/defragjob/{job.pk}/abort/", {"confirm": "yes", "orphans": "delete"})
    job.refresh_from_db()
    assert job.abort_choice == "" and not job.abort_pending            # not confirmed: nothing recorded
    client.post(f"/admin/capacity/defragjob/{job.pk}/abort/", {"confirm": "yes", "orphans": "delete",
                                                               "capacity_drops": "on"})
    job.refresh_from_db()
    assert job.abort_choice == "delete" and job.abort_pending and job.abort_requested_by == staff


def test_the_dashboards_defrag_jobs_button_lists_that_clusters_jobs(sim_cluster_factory, client, staff):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    other = Cluster.objects.create(name="other", kubeconfig_path="/nonexistent")
    sim = Cluster.objects.get(name="sim")
    DefragJob.objects.create(cluster=sim, node_name="n1", state=JobState.SAFE, created_at="2026-01-01T00:00:00Z")
    DefragJob.objects.create(cluster=other, node_name="far-node", state=JobState.SAFE,
                             created_at="2026-01-01T00:00:00Z")
    dashboard = client.get("/capacity/clusters/sim/").content.decode()
    href = re.search(r'<a class="button" href="([^"]+)">Defrag jobs</a>', dashboard).group(1).replace("&amp;", "&")

    listing = client.get(href)

    assert listing.status_code == 200
    page = listing.content.decode()
    assert "n1" in page and "far-node" not in page and "1 defrag job" in page


def test_aborting_an_aborted_job_or_asking_the_same_abort_twice_says_nothing_new_was_asked(
        sim_cluster_factory, client, staff):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    sim = Cluster.objects.get(name="sim")
    done = DefragJob.objects.create(cluster=sim, node_name="n1", state=JobState.ABORTED,
                                    created_at="2026-01-01T00:00:00Z")
    live = DefragJob.objects.create(cluster=sim, node_name="n2", state=JobState.SAFE, created_at="2026-01-01T00:00:00Z")

    def abort(job) -> list[str]:
        page = client.post(f"/admin/capacity/defragjob/{job.pk}/abort/", {"confirm": "yes"}, follow=True)
        return [f"{m.level_tag}: {m}" for m in page.context["messages"]]

    assert abort(done) == [f"warning: Job #{done.pk} is already aborted: nothing was asked"]
    done.refresh_from_db()
    assert done.abort_requested_at is None

    first = abort(live)
    live.refresh_from_db()
    asked_at = live.abort_requested_at
    again = abort(live)                                   # a double click, or back and resubmit
    live.refresh_from_db()
    assert first[0].startswith(f"success: Abort of job #{live.pk} requested: a worker uncordons the node")
    assert again == [f"warning: Job #{live.pk}: this abort was already requested at "
                     f"{asked_at:%Y-%m-%d %H:%M:%S} UTC by ops and is on its way: nothing new was asked"]
    assert live.abort_requested_at == asked_at


def test_a_drain_confirmed_twice_is_asked_once_and_the_second_press_says_so(sim_cluster_factory, client, staff):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=JobState.SAFE,
                                   created_at="2026-01-01T00:00:00Z")
    url = f"/admin/capacity/defragjob/{job.pk}/drain/"

    first = client.post(url, {"confirm": "n1"}, follow=True)
    job.refresh_from_db()
    asked_at = job.drain_requested_at
    again = client.post(url, {"confirm": "n1"}, follow=True)

    job.refresh_from_db()
    assert [str(m) for m in first.context["messages"]] == ["Drain of n1 requested: a worker evicts its orphans"]
    assert [str(m) for m in again.context["messages"]] == [
        f"Job #{job.pk}: this drain was already requested at {asked_at:%Y-%m-%d %H:%M:%S} UTC by ops and is on its "
        f"way: nothing new was asked"]
    assert job.drain_requested_at == asked_at


@pytest.mark.parametrize("node", ["n1?x=1", "../nodes/n1", "n1/status", "N1", "é漢字", ".*[(", "n" * 254])
def test_a_start_page_for_what_cannot_be_a_node_name_says_so_and_reads_nothing(sim_cluster_factory, client, staff,
                                                                               node):
    handle = sim_cluster_factory(objects(), name="sim")
    response = client.get("/admin/capacity/defragjob/start/", {"cluster": "sim", "node": node}, follow=True)
    (said,) = [str(m) for m in response.context["messages"]]
    assert said == f"Cannot defrag {node!r}: node name {node!r} is not a valid Kubernetes name: it must be " \
                   f"{kube.DNS1123_SUBDOMAIN_RULE}"
    assert not handle.gateway.calls and not DefragJob.objects.exists()


@pytest.mark.parametrize("state, why", [
    (JobState.ABORTED, "an aborted job is not drained (a new defrag of the node starts with manage.py defrag n1 "
                       "--cluster sim)"),
    (JobState.CORDONED, "it has not reported the node safe yet; wait until it reads safe, then drain (manage.py "
                        "defrag n1 --cluster sim --drain)"),
    (JobState.DRAINED, "its node was drained already"),
])
def test_the_drain_page_of_a_job_that_cannot_be_drained_says_why_and_offers_no_drain(sim_cluster_factory, client,
                                                                                     staff, state, why):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=state,
                                   created_at="2026-01-01T00:00:00Z")
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/drain/").content.decode()
    assert f"Nothing can be drained now: job #{job.pk} is {state}: {why}." in page
    assert 'name="confirm"' not in page


def test_the_job_page_shows_node_state_next_step_and_log_first_and_folds_the_internals(sim_cluster_factory, client,
                                                                                      staff):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=JobState.SAFE,
                                   created_at="2026-01-01T00:00:00Z", lease_owner="worker-1:42:step",
                                   heartbeat_at="2026-01-01T00:01:00Z", version=7)
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert "Node <strong>n1</strong> of cluster sim." in page
    assert ("<strong>Next:</strong> The node is safe to remove: Drain… evicts its orphans (and may delete the "
            "Node); Abort… undoes the job. Return to service… uncordons the node and aborts the job.") in page
    first_fold = page.index("<details>")
    for shown_first in ('id="defrag-node"', 'id="defrag-state"', 'id="defrag-next"', 'id="defrag-log"',
                        "field-node_name", "field-created_at"):
        assert page.index(shown_first) < first_fold, shown_first
    folds = re.findall(r"<details>(.*?)</details>", page, flags=re.S)
    assert [re.search(r"<h2[^>]*>(.*?)</h2>", f, flags=re.S).group(1).strip() for f in folds] == [
        "Discovery report (what was shown before confirmation)",
        "Internals: requests, settings, lease and intents the job keeps for itself"]
    internals = folds[1]
    for field in ("lease_owner", "lease_expires_at", "heartbeat_at", "version", "log_seq", "updated_at",
                  "return_intent_owner", "cordon_intent_at", "abort_requested_at", "drain_requested_at"):
        assert f"field-{field}" in internals, field
        assert page.count(f"field-{field}\"") + page.count(f"field-{field} ") == internals.count(
            f"field-{field}\"") + internals.count(f"field-{field} "), f"{field} shown outside the fold"
    assert "worker-1:42:step" in internals


@pytest.mark.parametrize("state, next_step", [
    (JobState.WAITING, "Nothing to do yet: a worker is emptying the node and this page follows it (Abort… stops it)."),
    (JobState.BLOCKED, "The node cannot be drained: Abort… undoes the job (its orphans end once replaced). Return "
                       "to service… uncordons the node and aborts the job."),
    (JobState.DRAINED, "Nothing left to drain: the node stays cordoned until Return to service… uncordons it."),
    (JobState.ABORTED, "Nothing left to do."),
])
def test_the_job_page_says_what_to_do_next_in_its_state(sim_cluster_factory, client, staff, state, next_step):
    from clusters.models import Cluster

    sim_cluster_factory(objects(), name="sim")
    job = DefragJob.objects.create(cluster=Cluster.objects.get(name="sim"), node_name="n1", state=state,
                                   created_at="2026-01-01T00:00:00Z")
    page = client.get(f"/admin/capacity/defragjob/{job.pk}/change/").content.decode()
    assert f"<strong>Next:</strong> {next_step}</p>" in page


def test_the_panel_breaks_no_word_only_long_names(client, staff):
    """The panel's style sheet: cells wrap between words; only the columns holding one long
    name each (pods, nodes, owners, uids, targets) may break it anywhere."""
    page = client.get("/admin/capacity/defragjob/").content.decode()
    style = re.search(r'<style id="panel-layout">(.*?)</style>', page, flags=re.S).group(1)
    style = re.sub(r"/\*.*?\*/", "", style, flags=re.S)
    assert "word-break" not in style
    tokens = ("pod", "pod_name", "node_name", "owner_name", "target", "uid", "revision", "replicaset",
              "template_hash", "namespace")
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", style):
        if "anywhere" in body:
            for selector in selectors.split(","):
                assert selector.strip().endswith(tuple(f"td.field-{t}" for t in tokens) + ("td.token",)), selector
