"""The operator's surfaces: admin pages and restore action, the `prune` command, the beat task."""
from __future__ import annotations

import io
import re
import json

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client as k8s

from clusters.models import Cluster
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, prune_run_execute

from pruning_world import World, deployment

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        w.create(deployment("web", "team-a", replicas=2, util="0"))
        w.create(deployment("busy", "team-a", util="80"))
        w.record_history(minutes=40)
        prom = w.prometheus()
        w.cluster = Cluster.objects.create(name="sim", kubeconfig_path=w.kubeconfig, prometheus_url=prom.url)
        yield w


def replicas(world, name="web"):
    return k8s.AppsV1Api(world.api).read_namespaced_deployment_scale(name, "team-a").spec.replicas


DECISIONS = "/admin/pruning/prunedecision/"


def restore(client, pks, **confirm):
    """Restore pressed on the list (the page that says what it will do), then that page's button."""
    form = {"action": "restore_selected", "_selected_action": pks}
    page = client.post(DECISIONS, form)
    assert page.status_code == 200 and page.templates[0].name == "pruning/restore_confirm.html"
    return client.post(DECISIONS, {**form, "confirm": "yes"}, follow=True)


def test_run_page_charts_each_pod_and_restore_action_scales_back(world, admin_client):
    from clusters.kube import gateway_for
    run = prune_run_execute(kube_gateway=gateway_for(world.cluster), prometheus=world.prometheus(),
                            now=world.now(), cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    assert replicas(world) == 0

    page = admin_client.get(f"/admin/pruning/prunerun/{run.pk}/change/").content.decode()
    assert page.count('<div class="prune-chart"') == run.decisions.count() == 2
    assert page.count('"text": "GPU utilization (%)"') == 2 and "chart.umd.min.js" in page
    assert "team-a/web-" in page and "owner-already-in-plan" in page

    listing = admin_client.get("/admin/pruning/prunedecision/?result__exact=succeeded").content.decode()
    assert listing.count('name="_selected_action"') == 1
    acted = run.decisions.get(result="succeeded")
    response = restore(admin_client, [acted.pk])
    assert "restored 1" in response.content.decode()
    assert replicas(world) == 2
    acted.refresh_from_db()
    assert (acted.restore, acted.restored_by) == ("restored", "admin")


def clock_at_the_cluster(world, settings, tmp_path):
    """The product's clock moved to the simulated cluster's time through the offset file
    (a scale-down is evaluated now: `--at` is for dry runs only)."""
    from django.utils import timezone

    offset = tmp_path / "offset"
    offset.write_text(str((world.now() - timezone.now()).total_seconds()))
    settings.CLOCK_OFFSET_FILE = str(offset)


def test_prune_command_json_one_object_per_decision(world, settings, tmp_path):
    clock_at_the_cluster(world, settings, tmp_path)
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--json", "-r", "scale-down", "-n", "team-.*", stdout=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    assert {(d["decision"], d["reason"]) for d in lines} == {("prune", "idle"), ("skip", "owner-already-in-plan")}
    acted = next(d for d in lines if d["decision"] == "prune")
    assert acted["owner"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    assert acted["result"] == "succeeded" and acted["restore_state"] == {"replicas": 2}
    assert replicas(world) == 0


def test_prune_command_is_a_dry_run_by_default_and_says_so(world):
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), "-t", "30", stdout=out)
    assert "would scale to zero" in out.getvalue() and "(dry-run)" in out.getvalue()
    assert replicas(world) == 2


@pytest.mark.parametrize("args,message", [
    (["-n", "team-(a"], "namespace filter 'team-(a' is not a valid regular expression"),
    (["-m", "(?=x)"], "GPU model filter"),
    (["--idle-threshold", "5"], "idle threshold is a fraction"),
    (["--cluster", "nope"], "no cluster named 'nope'"),
    (["--prometheus-url", "ftp://x"], "must start with http"),
])
def test_prune_command_bad_input_is_named(world, args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("?", r"\?")):
        call_command("prune", *(["--cluster", "sim"] if "--cluster" not in args else []), *args)


def test_daemon_mode_runs_repeatedly(world):
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), "-d", "-c", "0", "--runs", "2",
                 stdout=io.StringIO())
    assert PruneRun.objects.count() == 2


def test_beat_schedule_and_task_prune_each_cluster(world, settings, tmp_path):
    from django_celery_beat.models import PeriodicTask

    from clusters.services import schedules_install
    from config.celery import app
    from pruning.tasks import prune_all_clusters

    schedules_install()
    task = PeriodicTask.objects.get(task="pruning.tasks.prune_all_clusters")
    assert task.interval.every == 180 and task.interval.period == "seconds" and task.enabled

    # The product's clock, moved to the simulated cluster's time through the offset file.
    from django.utils import timezone
    offset = tmp_path / "offset"
    offset.write_text(str((world.now() - timezone.now()).total_seconds()))
    settings.CLOCK_OFFSET_FILE = str(offset)
    settings.PRUNER_RUN_MODE = "scale-down"
    app.conf.task_always_eager = True
    try:
        assert prune_all_clusters() == 1
    finally:
        app.conf.task_always_eager = False
    run = PruneRun.objects.get()
    assert (run.cluster, run.actor, run.mode, run.acted) == (world.cluster, "", "scale-down", 1)
    assert replicas(world) == 0
    assert PruneDecision.objects.filter(run=run, event_sent=True).count() == 1


def test_a_scale_down_as_of_another_time_is_refused_and_changes_nothing(world):
    with pytest.raises(CommandError, match="--at: only a dry run may be evaluated as of another time"):
        call_command("prune", "--cluster", "sim", "-r", "scale-down", "--at", world.now().isoformat(),
                     stdout=io.StringIO())
    assert not PruneRun.objects.exists() and replicas(world) == 2


def test_the_command_is_audited_as_run_from_its_shell(world, settings, tmp_path):
    from audit.models import AuditEntry
    from config.actors import cli_label

    clock_at_the_cluster(world, settings, tmp_path)
    call_command("prune", "--cluster", "sim", "-r", "scale-down", stdout=io.StringIO())
    run = PruneRun.objects.get()
    assert run.actor == cli_label() and run.actor.startswith("cli:") and "@" in run.actor
    entry = AuditEntry.objects.get(app="pruning", action="workload_scale_to_zero")
    assert entry.actor_label == cli_label()


@pytest.fixture
def viewer(db):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_prunedecision", "view_prunerun"]))
    return user


def test_a_view_only_user_cannot_restore_and_one_allowed_to_can(world, client, viewer):
    from django.contrib.auth.models import Permission

    from clusters.kube import gateway_for

    run = prune_run_execute(kube_gateway=gateway_for(world.cluster), prometheus=world.prometheus(),
                            now=world.now(), cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    acted = run.decisions.get(result="succeeded")
    client.force_login(viewer)
    listing = client.get("/admin/pruning/prunedecision/").content.decode()
    assert "restore_selected" not in listing
    for confirm in ({}, {"confirm": "yes"}):      # neither the confirmation page nor the restore
        page = client.post(DECISIONS, {"action": "restore_selected", "_selected_action": [acted.pk], **confirm},
                           follow=True)
        assert page.status_code == 200 and "pruning/restore_confirm.html" not in [t.name for t in page.templates]
    acted.refresh_from_db()
    assert acted.restore == "" and replicas(world) == 0

    viewer.user_permissions.add(Permission.objects.get(codename="change_prunedecision"))
    assert "restore_selected" in client.get("/admin/pruning/prunedecision/").content.decode()
    restore(client, [acted.pk])
    acted.refresh_from_db()
    assert acted.restore == "restored" and replicas(world) == 2


def test_the_restore_first_shows_what_it_does_and_writes_nothing_until_confirmed(world, admin_client):
    from clusters.kube import gateway_for

    run = prune_run_execute(kube_gateway=gateway_for(world.cluster), prometheus=world.prometheus(),
                            now=world.now(), cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    acted, skipped = run.decisions.get(result="succeeded"), run.decisions.exclude(result="succeeded").get()
    form = {"action": "restore_selected", "_selected_action": [acted.pk, skipped.pk]}
    page = admin_client.post(DECISIONS, form)
    html = page.content.decode()
    assert page.status_code == 200 and "Restore what the pruner scaled to zero? (2 selected)" in html
    assert "restoring starts GPU pods again" in html
    restored = html[html.index('id="restore-restored"'):html.index('id="restore-left"')]
    assert "<li>Deployment team-a/web: back to replicas 2</li>" in restored        # words, not a dict
    left = html[html.index('id="restore-left"'):]
    assert f"{skipped}: never scaled to zero by a prune, nothing to restore" in left
    assert f'name="_selected_action" value="{acted.pk}"' in html and 'name="confirm" value="yes"' in html
    acted.refresh_from_db()
    assert acted.restore == "" and replicas(world) == 0          # nothing written by the page

    admin_client.post(DECISIONS, {**form, "confirm": "yes"})
    acted.refresh_from_db()
    assert acted.restore == "restored" and replicas(world) == 2
    restored_events = [e.message for e in k8s.CoreV1Api(world.api).list_namespaced_event("team-a").items
                       if e.reason == "GPUIdleRestored"]
    assert restored_events == [f"restored to replicas 2 by admin (prune run {run.pk})"]
    again = admin_client.post(DECISIONS, form).content.decode()     # now there is nothing to restore
    assert "Deployment team-a/web: already restored by admin" in again and 'name="confirm"' not in again


def test_the_restore_message_counts_every_selected_decision(world, admin_client):
    from clusters.kube import gateway_for

    run = prune_run_execute(kube_gateway=gateway_for(world.cluster), prometheus=world.prometheus(),
                            now=world.now(), cluster=world.cluster, params=PruneParams(run_mode="scale-down"))
    pks = list(run.decisions.values_list("pk", flat=True))
    assert len(pks) == 2   # the one acted on, and its owner's other pod (skipped)
    text = restore(admin_client, pks).content.decode()
    assert ("2 selected: restored 1; left alone 0 changed since the prune; 1 never scaled to zero by a prune "
            "(nothing to restore)") in text
    text = admin_client.post(DECISIONS, {"action": "restore_selected", "_selected_action": pks, "confirm": "yes"},
                             follow=True).content.decode()   # the same page confirmed twice
    assert "2 selected: restored 0; left alone 0 changed since the prune; 1 already restored; 1 never" in text


def test_a_filter_only_prometheus_refuses_is_named_by_its_flag(world):
    # \p{Nope} passes Python's check (RE2's \p classes are left to Prometheus), and
    # Prometheus refuses it: the error names the flag, the run says why it failed.
    with pytest.raises(CommandError) as caught:
        call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), "-n", r"\p{Nope}",
                     stdout=io.StringIO())
    assert str(caught.value).startswith(r"--namespace: Prometheus refused the namespace filter '\\p{Nope}'")
    run = PruneRun.objects.get()
    assert run.status == "failed" and "Prometheus refused the namespace filter" in run.errors[0]


def test_an_re2_class_python_does_not_know_is_taken(world):
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), "-n", r"\p{Ll}+-\p{Ll}",
                 stdout=out)
    assert "team-a/web-" in out.getvalue() and "would scale to zero (idle)" in out.getvalue()


def test_a_model_its_org_keeps_asleep_is_reported_kept_asleep_not_failed(tmp_path, prometheus_factory, admin_client):
    from orgs.models import Org
    from pruning_world import inference_service

    with World.start(tmp_path) as world:
        world.prometheus_factory = prometheus_factory
        world.create(inference_service("llm", "team-c", util="0"))
        world.record_history(minutes=40)
        cluster = Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig)
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                                cluster=cluster, params=PruneParams(run_mode="scale-down"))
        decision = run.decisions.get(owner_name="llm", result="succeeded")
        Org.objects.create(slug="team-c", namespace="team-c", cluster=cluster, dormant=True, dormant_since=world.now(),
                           last_activity_at=world.now())

        shown = admin_client.post(DECISIONS, {"action": "restore_selected", "_selected_action": [decision.pk]})
        asleep = shown.content.decode().split('id="restore-asleep"')[1].split("</ul>")[0]
        assert "InferenceService team-c/llm: org team-c is dormant" in asleep
        assert "Left at zero: restore it once the org is awake" in asleep
        assert 'id="restore-restored"' not in shown.content.decode()

        page = restore(admin_client, [decision.pk])

        said = [(m.level_tag, str(m)) for m in page.context["messages"]]
        assert said[0][0] == "warning" and "not restored, nothing was written: org team-c is dormant" in said[0][1]
        assert said[-1] == ("warning", "1 selected: restored 0; left alone 0 changed since the prune; 1 kept asleep "
                                       "by their org's dormancy (restore them once the org is awake)")
        decision.refresh_from_db()
        assert decision.restore == "" and decision.restorable


def test_a_prune_with_no_samples_for_now_says_the_data_is_missing_and_scales_nothing(
        world, settings, tmp_path, admin_client):
    """The product's clock two hours ahead of the GPU data (as the demo clock can be, or a
    scrape outage): the run fails saying Prometheus had no samples, in the CLI and on the
    run's page, and no workload is scaled (not "0 GPU pods seen" as if the cluster had none)."""
    from datetime import timedelta

    from django.utils import timezone

    offset = tmp_path / "offset"
    offset.write_text(str((world.now() + timedelta(hours=2) - timezone.now()).total_seconds()))
    settings.CLOCK_OFFSET_FILE = str(offset)
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("prune", "--cluster", "sim", "-r", "scale-down", stdout=out)
    message = str(refused.value)
    assert message.startswith("no data: Prometheus had no samples of GPU utilization")
    assert "the end of the 30-minute window" in message and "nothing was scaled" in message
    assert "GPU pods seen" not in out.getvalue()
    assert replicas(world) == 2
    run = PruneRun.objects.get()
    assert run.status == "failed" and run.errors == [message] and not run.decisions.exists()
    page = admin_client.get(f"/admin/pruning/prunerun/{run.pk}/change/").content.decode()
    assert "no data: Prometheus had no samples of GPU utilization" in page


def test_gpus_reporting_with_no_pod_on_them_are_no_missing_data(world):
    """A namespace filter no GPU pod matches: the census counts none, but the GPUs report,
    so the dry run is an ordinary one of 0 GPU pods."""
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), "-n", "nobody-here", stdout=out)
    assert "0 GPU pods seen" in out.getvalue()
    assert PruneRun.objects.get().status == "succeeded"


def test_a_runs_duration_reads_in_milliseconds_on_the_run_list(world, admin_client):
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), stdout=io.StringIO())
    listing = admin_client.get("/admin/pruning/prunerun/").content.decode()
    shown = re.search(r'<td class="field-duration_seconds">([^<]*)</td>', listing).group(1)
    assert re.fullmatch(r"\d+(\.\d{1,3})?", shown), shown   # not 0.12345678901234567


def test_the_dashboard_starts_a_dry_run_that_says_what_it_found_is_audited_and_changes_nothing(
        world, settings, tmp_path, admin_client):
    from audit.models import AuditEntry

    clock_at_the_cluster(world, settings, tmp_path)
    dashboard = admin_client.get("/capacity/clusters/sim/").content.decode()
    assert 'action="/pruning/clusters/sim/dry-run/"' in dashboard and "Dry run a prune now" in dashboard

    page = admin_client.post("/pruning/clusters/sim/dry-run/", {"window_minutes": "30", "grace_seconds": "300"},
                             follow=True)
    run = PruneRun.objects.get()
    assert page.redirect_chain[-1][0] == f"/admin/pruning/prunerun/{run.pk}/change/"
    said = [str(m) for m in page.context["messages"]]
    pod = run.decisions.get(decision="prune").pod
    assert said == [f"Dry run #{run.pk} on sim: 3 GPU pod(s) seen, 1 busy, 2 looked idle over 30 min (each pod "
                    f"looked at once it ran 30 min + 300 s of grace), 1 would be scaled to zero: team-a/{pod} → "
                    f"Deployment web. Nothing was changed."]
    assert (run.mode, run.actor, run.status) == ("dry-run", "admin", "succeeded")
    assert replicas(world) == 2
    entry = AuditEntry.objects.get(app="pruning", action="prune_dry_run")
    assert (entry.actor.username, entry.target, entry.new["outcome"]) == ("admin", "Cluster/sim", said[0])


def test_a_dry_run_from_the_panel_with_bad_input_or_no_data_says_why(world, settings, tmp_path, admin_client):
    from datetime import timedelta

    from django.utils import timezone

    page = admin_client.post("/pruning/clusters/sim/dry-run/", {"window_minutes": "ten"}, follow=True)
    assert [str(m) for m in page.context["messages"]] == [
        "Dry run not started, nothing recorded: the idle window (minutes) must be a whole number, got 'ten'"]
    assert not PruneRun.objects.exists()

    offset = tmp_path / "offset"
    offset.write_text(str((world.now() + timedelta(hours=2) - timezone.now()).total_seconds()))
    settings.CLOCK_OFFSET_FILE = str(offset)
    page = admin_client.post("/pruning/clusters/sim/dry-run/", {}, follow=True)
    run = PruneRun.objects.get()
    said = [str(m) for m in page.context["messages"]]
    assert len(said) == 1 and said[0].startswith(
        f"Dry run #{run.pk} on sim failed: no data: Prometheus had no samples of GPU utilization")
    assert run.status == "failed" and replicas(world) == 2
    runs = admin_client.get("/capacity/clusters/sim/").content.decode()
    row = re.search(rf'<a href="/admin/pruning/prunerun/{run.pk}/change/">#{run.pk}</a>.*?</tr>', runs, re.S).group(0)
    assert "failed<br>" in row and "no data: Prometheus had no samples of GPU utilization" in row
