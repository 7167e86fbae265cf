"""Runbook actions announce themselves before their Kubernetes write, and one whose
process dies is settled from the cluster, never sent again.

The crash is real: a separate process runs the action and SIGKILLs itself right before
its write, or right after the write landed (`runbook_crash_worker.py`), against the
test's PostgreSQL database and simulated cluster. The registry sync then settles the
row once its lease lapsed: done if the cluster shows the change, failed if it does not;
the audit shows the action once either way, and the panel says what is known.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import kubernetes
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User

from capacity.runbook import services
from audit.models import AuditEntry
from capacity.runbook.models import RunbookAction, ServedModel
from capacity.runbook.tasks import registry_sync_cluster
from clusters import kube
from clusters.labels import REDEPLOY_ANNOTATION
from config import clock
from orgs.models import Org
from simcluster.generate import inference_service, namespace, node

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
CRASH_WORKER = Path(__file__).with_name("runbook_crash_worker.py")
NS = "org-acme"
A10G = "NVIDIA-A10G"
OLD, NEW = "zq86d3o-predictor-00001", "zq86d3o-predictor-00002"


def scenario() -> list[dict]:
    """One GPU: a redeploy's new revision waits Pending for the GPU the old one holds."""
    return [node("gpu-a10g-00", pool="a10g", product=A10G, gpus=1, cpu="32", memory="127532Mi"),
            node("cpu-00", pool="cpu", cpu="64", memory="257000Mi"),
            namespace(NS, org="acme"),
            inference_service(NS, "zq86d3o", product=A10G, gpus=1, min_replicas=1, max_replicas=1)]


class World:
    def __init__(self, handle):
        self.handle = handle
        self.cluster = handle.cluster
        api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
        self.api = api
        self.crd = kubernetes.client.CustomObjectsApi(api)
        self.core = kubernetes.client.CoreV1Api(api)

    def model(self, name: str = "zq86d3o") -> ServedModel:
        services.registry_sync(cluster=self.cluster)
        return ServedModel.objects.get(cluster=self.cluster, name=name)

    def revisions(self, prefix: str = "zq86d3o") -> list[str]:
        items = self.crd.list_namespaced_custom_object("serving.knative.dev", "v1", NS, "revisions")["items"]
        return sorted(r["metadata"]["name"] for r in items if r["metadata"]["name"].startswith(prefix))

    def isvcs(self) -> list[str]:
        items = self.crd.list_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices")
        return sorted(i["metadata"]["name"] for i in items["items"] if not i["metadata"].get("deletionTimestamp"))

    def stamp(self) -> str | None:
        isvc = self.crd.get_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices", "zq86d3o")
        return (isvc["metadata"].get("annotations") or {}).get(REDEPLOY_ANNOTATION)

    def pods(self) -> dict[str, str]:
        return {p.metadata.labels["serving.knative.dev/revision"]: p.status.phase
                for p in self.core.list_namespaced_pod(
                    NS, label_selector="serving.kserve.io/inferenceservice=zq86d3o").items
                if not p.metadata.deletion_timestamp}

    def blocked(self) -> ServedModel:
        """Redeployed (in this process): the new revision waits for the old one's GPU."""
        services.model_redeploy(model=self.model(), actor=None)
        self.handle.advance(60)
        model = self.model()
        assert [b["old_revision"] for b in model.blocked] == [OLD]
        return model

    def stuck(self) -> ServedModel:
        """An InferenceService that asks for a GPU the cluster does not have: never Ready."""
        self.crd.create_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices",
                                                 inference_service(NS, "stuck", product="NVIDIA-B200", gpus=1))
        self.handle.advance(60)
        model = self.model("stuck")
        assert not model.ready
        return model


@pytest.fixture
def world(sim_cluster_factory):
    handle = sim_cluster_factory(scenario())
    handle.advance(120)
    Org.objects.create(slug="acme", cluster=handle.cluster, namespace=NS)
    w = World(handle)
    yield w
    w.api.close()


def _database_url() -> str:
    db = django_settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "the crash test shares the database with its child process"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def crash(action: str, model: ServedModel, point: str, revision: str = "-") -> None:
    env = {**os.environ, "DATABASE_URL": _database_url(), "PYTHONPATH": str(ROOT), "KUBE_RETRY_BACKOFF": "0.05"}
    env.pop("KUBECONFIG", None)
    env.pop("CLOCK_OFFSET_FILE", None)
    done = subprocess.run([sys.executable, str(CRASH_WORKER), action, str(model.pk), revision, point],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def after_the_lease():
    return clock.now() + timedelta(seconds=services.ACTING_LEASE_SECONDS + 1)


def the_row(action: str) -> RunbookAction:
    (row,) = RunbookAction.objects.filter(action=action)     # the action is recorded once
    return row


def settle_after_the_lease(world) -> list[RunbookAction]:
    # While the dead process's lease runs, nobody takes its action from it.
    assert services.runbook_actions_settle(cluster=world.cluster, now=clock.now()) == []
    settled = services.runbook_actions_settle(cluster=world.cluster, now=after_the_lease())
    # A second sync finds nothing left to settle.
    assert services.runbook_actions_settle(cluster=world.cluster, now=after_the_lease()) == []
    return settled


# --- redeploy -----------------------------------------------------------------------------------
def test_a_redeploy_killed_after_its_patch_is_settled_done_and_makes_one_revision(world):
    crash("redeploy", world.model(), "after-write")
    row = the_row("model_redeploy")
    assert row.state == "acting" and world.stamp() == row.new[REDEPLOY_ANNOTATION]

    (settled,) = settle_after_the_lease(world)
    assert settled.pk == row.pk
    row.refresh_from_db()
    assert (row.state, row.acting_owner, row.acting_expires_at) == ("done", "", None)
    assert "settled from the cluster" in row.error and "is on the model" in row.error
    world.handle.advance(60)
    assert world.revisions() == [OLD, NEW]                       # one new revision, not two
    assert the_row("model_redeploy").state == "done"


def test_a_redeploy_killed_before_its_patch_is_settled_failed_and_not_sent_again(world):
    crash("redeploy", world.model(), "before-write")
    row = the_row("model_redeploy")
    assert row.state == "acting" and row.new[REDEPLOY_ANNOTATION] and world.stamp() is None

    settle_after_the_lease(world)
    row.refresh_from_db()
    assert row.state == "failed"
    assert "is not on the model: nothing was changed (redeploy again)" in row.error
    world.handle.advance(60)
    assert world.stamp() is None and world.revisions() == [OLD]   # not re-sent by the settle


# --- delete the old revision --------------------------------------------------------------------
def test_an_unblock_killed_after_the_revision_delete_is_done_and_its_pods_stop_now(world, settings):
    model = world.blocked()
    crash("delete-old", model, "after-write", OLD)
    row = the_row("revision_delete_old")
    assert row.state == "acting" and world.revisions() == [NEW]
    assert world.pods()[OLD] == "Running"                          # the dead process never stopped them

    settle_after_the_lease(world)
    row.refresh_from_db()
    assert row.state == "done" and row.new["deleted"] == OLD and "is gone" in row.error
    assert [name.startswith(f"{OLD}-deployment-") for name in row.new["pods_stopped"]] == [True]
    world.handle.advance(settings.RUNBOOK_UNBLOCK_GRACE_SECONDS + 60)
    assert world.pods() == {NEW: "Running"}                       # the new revision got the GPU
    assert list(RunbookAction.objects.values_list("action", "state").order_by("at", "id")) == [
        ("model_redeploy", "done"), ("revision_delete_old", "done")]
    # The audit trail holds each outcome once: the sync's verdict under the operator who asked.
    (entry,) = AuditEntry.objects.filter(app="runbook", subject_type="runbook_action", subject_id=row.pk)
    assert (entry.action, entry.actor, entry.target) == ("revision_delete_old", row.actor, row.target)
    assert "settled from the cluster" in entry.cause and entry.new["pods_stopped"] == row.new["pods_stopped"]


def test_an_unblock_killed_before_the_revision_delete_is_failed_and_nothing_deleted(world):
    model = world.blocked()
    crash("delete-old", model, "before-write", OLD)
    settle_after_the_lease(world)
    row = the_row("revision_delete_old")
    assert row.state == "failed" and f"{OLD} is still there: nothing was deleted" in row.error
    (entry,) = AuditEntry.objects.filter(app="runbook", subject_type="runbook_action", subject_id=row.pk)
    assert entry.action == "revision_delete_old_failed" and entry.new == {} and "still there" in entry.cause
    assert world.revisions() == [OLD, NEW] and world.pods() == {OLD: "Running", NEW: "Pending"}


# --- delete a model stuck deploying -----------------------------------------------------------------
def test_a_stuck_delete_killed_after_the_delete_is_done(world):
    stuck = world.stuck()
    crash("delete-stuck", stuck, "after-write")
    assert the_row("model_delete_stuck").state == "acting" and "stuck" not in world.isvcs()

    registry_sync_cluster.run(world.cluster.pk)                  # the lease still runs: left alone
    assert the_row("model_delete_stuck").state == "acting"
    settle_after_the_lease(world)
    row = the_row("model_delete_stuck")
    assert row.state == "done" and row.new["deleted"] == ["InferenceService/stuck"]
    assert "is gone or being deleted" in row.error
    assert ServedModel.objects.get(pk=stuck.pk).gone and world.isvcs() == ["zq86d3o"]


def test_a_stuck_delete_killed_before_the_delete_is_failed_and_the_model_stays(world):
    stuck = world.stuck()
    crash("delete-stuck", stuck, "before-write")
    settle_after_the_lease(world)
    row = the_row("model_delete_stuck")
    assert row.state == "failed" and "InferenceService stuck is still there: nothing was deleted" in row.error
    assert world.isvcs() == ["stuck", "zq86d3o"] and not ServedModel.objects.get(pk=stuck.pk).gone


# --- the registry sync settles them; the panel says what is known -----------------------------
def operator(client) -> User:
    user = User.objects.create_user("oncall", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=(
        "view_servedmodel", "view_runbookaction", "redeploy_servedmodel")))
    client.force_login(user)
    return user


def test_the_registry_sync_settles_a_dead_redeploy_and_the_panel_shows_each_state(world, client, settings,
                                                                                  tmp_path):
    operator(client)
    model = world.model()
    crash("redeploy", model, "before-write")
    listing = client.get("/admin/capacity/servedmodel/").content.decode()
    assert "redeploy</a> acting since" in listing and "the cluster write may be under way" in listing

    offset = tmp_path / "clock-offset"                             # the product's clock past the lease
    offset.write_text(str(services.ACTING_LEASE_SECONDS - 5))
    settings.CLOCK_OFFSET_FILE = str(offset)
    registry_sync_cluster.run(world.cluster.pk)                    # the lease has not lapsed yet
    listing = client.get("/admin/capacity/servedmodel/").content.decode()
    assert "its process stopped before recording the outcome" not in listing
    offset.write_text(str(services.ACTING_LEASE_SECONDS + 1))
    listing = client.get("/admin/capacity/servedmodel/").content.decode()
    assert "its process stopped before recording the outcome; the next registry sync settles it" in listing

    registry_sync_cluster.run(world.cluster.pk)
    listing = client.get("/admin/capacity/servedmodel/").content.decode()
    assert "redeploy</a> failed at" in listing and "nothing was changed (redeploy again)" in listing
    audit = client.get("/admin/capacity/runbookaction/").content.decode()
    assert "failed at" in audit and "nothing was changed" in audit

    # Pressed again, it is done, and the list no longer shows the failure.
    client.post("/admin/capacity/servedmodel/", {"action": "redeploy", "_selected_action": [model.pk],
                                                 "confirm": "yes"})
    assert list(RunbookAction.objects.values_list("state", flat=True).order_by("at", "id")) == ["failed", "done"]
    listing = client.get("/admin/capacity/servedmodel/").content.decode()
    assert "redeploy</a> failed" not in listing and "redeploy</a> acting" not in listing


# --- errors that say whether to retry -------------------------------------------------------------
def test_a_redeploy_the_api_keeps_failing_is_retried_then_failed_with_its_reason(world, client):
    operator(client)
    model = world.model()
    gateway = kube.gateway_for(world.cluster)
    world.handle.control.set_faults(seed=1, error_rate=1.0, match={"verbs": ["patch"]})
    try:
        page = client.post("/admin/capacity/servedmodel/", {"action": "redeploy", "_selected_action": [model.pk],
                                                            "confirm": "yes"}, follow=True)
    finally:
        world.handle.control.clear_faults()
    assert gateway.calls_total(("patch",)) == django_settings.KUBE_RETRY_ATTEMPTS   # transient: retried
    row = the_row("model_redeploy")
    assert row.state == "failed" and row.error.startswith("transient: ")
    assert "the cluster shows it was not done: nothing was changed" in row.error
    assert "redeploy not done: 500" in page.content.decode()
    world.handle.advance(60)
    assert world.revisions() == [OLD]


def test_an_unblock_refused_by_the_api_fails_at_once_with_its_reason(world):
    model = world.blocked()
    gateway = kube.gateway_for(world.cluster)
    before = gateway.calls_total(("delete",))
    world.handle.control.set_faults(seed=1, conflict_rate=1.0, match={"verbs": ["delete"]})
    try:
        with pytest.raises(Exception, match="409"):
            services.revision_delete_old(model=model, revision=OLD, actor=None)
    finally:
        world.handle.control.clear_faults()
    assert gateway.calls_total(("delete",)) - before == 1          # a refusal is not retried
    row = the_row("revision_delete_old")
    assert row.state == "failed" and row.error.startswith("refused: 409")
    assert world.revisions() == [OLD, NEW]


def test_a_write_whose_outcome_cannot_be_read_stays_acting_until_the_sync_settles_it(world, monkeypatch):
    model = world.model()
    announce = services._intent_announce

    def announce_then_the_api_goes_down(**kwargs):
        row = announce(**kwargs)
        world.handle.control.set_faults(seed=2, error_rate=1.0)
        return row

    monkeypatch.setattr(services, "_intent_announce", announce_then_the_api_goes_down)
    try:
        with pytest.raises(services.RunbookUnsettled, match="recorded as acting and the registry sync settles it"):
            services.model_redeploy(model=model, actor=None)
    finally:
        world.handle.control.clear_faults()
    assert the_row("model_redeploy").state == "acting"
    settle_after_the_lease(world)
    row = the_row("model_redeploy")
    assert row.state == "failed" and "nothing was changed" in row.error


def test_a_writer_whose_answer_came_after_the_sync_settled_it_records_done(world):
    """The sync read the cluster before a slow write landed and said failed: the writer,
    holding the write's own answer, records done over it."""
    row = services._intent_announce(action="model_redeploy", actor=None, cluster=world.cluster, target=f"{NS}/x",
                                    model=None, old={}, new={REDEPLOY_ANNOTATION: "t", "kind": "InferenceService"})
    RunbookAction.objects.filter(pk=row.pk).update(state="failed", acting_owner="", error="settled: not there")
    settled = services._intent_settle(row, state="done", new={"written": True})
    assert settled.state == "done" and "the write's own answer says it was done" in settled.error
    # A verdict read from the cluster never overrides one already recorded.
    other = services._intent_announce(action="model_redeploy", actor=None, cluster=world.cluster,
                                      target=f"{NS}/y", model=None, old={}, new={})
    RunbookAction.objects.filter(pk=other.pk).update(state="done", acting_owner="")
    assert services._intent_settle(other, state="failed", owner="settle:me", first_hand=False).state == "done"


def test_the_settle_beat_settles_a_dead_action_without_waiting_for_the_registry_sync(world, settings, tmp_path,
                                                                                      celery_eager):
    from capacity.runbook.tasks import runbook_actions_settle_all
    from config.schedule import SCHEDULES

    stuck = world.stuck()
    crash("delete-stuck", stuck, "after-write")
    assert runbook_actions_settle_all.run() == 0                  # the lease still runs: nothing queued
    assert the_row("model_delete_stuck").state == "acting"

    offset = tmp_path / "clock-offset"
    offset.write_text(str(services.ACTING_LEASE_SECONDS + 1))
    settings.CLOCK_OFFSET_FILE = str(offset)
    assert runbook_actions_settle_all.run() == 1                  # one cluster queued, settled in the caller
    assert the_row("model_delete_stuck").state == "done"
    assert runbook_actions_settle_all.run() == 0                  # nothing left
    [beat] = [p for p in SCHEDULES if p.task == "capacity.runbook.tasks.runbook_actions_settle_all"]
    assert beat.every_seconds + services.ACTING_LEASE_SECONDS <= 120
