"""/metrics: the families the alert rules read (deploy/alerts.yaml), scraped with the
bearer token as Prometheus scrapes them, with values for rows the tests create."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.celery_workers import broker_url, workers_broker  # noqa: F401 - fixtures
from tests.ops.helpers import value

TOKEN = "alert-metrics-token"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


@pytest.fixture
def scrape_token(client, settings):
    """`scrape()` → {(sample name, frozenset(labels)): value}, GET /metrics with the token."""
    settings.METRICS_TOKEN = TOKEN

    def get() -> dict:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200, response.content
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}

    return get


def _cluster(name: str, **fields):
    from clusters.models import Cluster

    return Cluster.objects.create(name=name, kubeconfig_path=f"/nonexistent/{name}", **fields)


@pytest.mark.django_db
def test_stuck_defrag_jobs_lapsed_leases_and_gpus_freed(scrape_token):
    from capacity.binpack.models import BinpackRun
    from capacity.defrag.models import DefragJob, JobState
    from capacity.runbook.models import RunbookAction
    from pruning.models import PruneDecision, PruneRun

    east, west = _cluster("east"), _cluster("west")
    # Waiting, started at T0 with a 30 min limit, next check before it: due by T0 + 30 min.
    DefragJob.objects.create(cluster=east, node_name="n1", state=JobState.WAITING, created_at=T0 - timedelta(hours=1),
                             started_at=T0, timeout_seconds=1800, next_check_at=T0 + timedelta(minutes=5),
                             lease_owner="task:dead", lease_expires_at=T0 + timedelta(minutes=6))
    # Never started (reads kept failing): its limit counts from confirmation; its check is later.
    DefragJob.objects.create(cluster=east, node_name="n2", state=JobState.CONFIRMED, created_at=T0 + timedelta(hours=1),
                             timeout_seconds=600, next_check_at=T0 + timedelta(hours=2))
    # An abort with its deadline; a drain asked at T0 with a 10 min limit.
    DefragJob.objects.create(cluster=west, node_name="n3", state=JobState.ABORTING, created_at=T0,
                             abort_requested_at=T0, abort_started_at=T0, abort_deadline_at=T0 + timedelta(minutes=5))
    DefragJob.objects.create(cluster=west, node_name="n4", state=JobState.DRAINING, created_at=T0,
                             started_at=T0 - timedelta(days=1), drain_requested_at=T0 - timedelta(minutes=20),
                             timeout_seconds=600)
    # Resting and final jobs are never overdue and their leases are nobody's concern.
    DefragJob.objects.create(cluster=west, node_name="n5", state=JobState.SAFE, created_at=T0 - timedelta(days=9),
                             lease_owner="task:old", lease_expires_at=T0 - timedelta(days=9))
    DefragJob.objects.create(cluster=west, node_name="n6", state=JobState.ABORT_STUCK, created_at=T0)
    BinpackRun.objects.create(cluster=west, started_at=T0, trigger=BinpackRun.Trigger.SCHEDULE,
                              state=BinpackRun.State.WRITING, lease_owner="w",
                              lease_expires_at=T0 + timedelta(minutes=1))
    BinpackRun.objects.create(cluster=west, started_at=T0 - timedelta(days=1), trigger=BinpackRun.Trigger.SCHEDULE,
                              state=BinpackRun.State.DONE)
    RunbookAction.objects.create(at=T0, cluster=east, action="model_redeploy", target="team/m",
                                 state=RunbookAction.State.ACTING, acting_owner="w",
                                 acting_expires_at=T0 + timedelta(seconds=60))
    RunbookAction.objects.create(at=T0 - timedelta(days=3), cluster=east, action="model_redeploy", target="team/m",
                                 state=RunbookAction.State.DONE)
    PruneRun.objects.create(cluster=east, status=PruneRun.Status.RUNNING, evaluated_at=T0, lease_owner="w",
                            lease_expires_at=T0 + timedelta(seconds=30))
    done = PruneRun.objects.create(cluster=east, status=PruneRun.Status.FAILED, evaluated_at=T0)
    # Kept freed: 2 GPUs, and 1 whose restore failed; not: restored, changed since, failed, skipped.
    for pod, gpus, decision, result, restore in (("a", 2, "prune", "succeeded", ""),
                                                 ("b", 1, "prune", "succeeded", "failed"),
                                                 ("c", 4, "prune", "succeeded", "restored"),
                                                 ("d", 4, "prune", "succeeded", "changed"),
                                                 ("e", 4, "prune", "failed", ""), ("f", 4, "skip", "", "")):
        PruneDecision.objects.create(run=done, namespace="team", pod=pod, decision=decision, reason="idle",
                                     result=result, restore=restore, gpus=[f"GPU-{pod}-{i}" for i in range(gpus)])

    samples = scrape_token()

    overdue = "gpu_capacity_defrag_job_overdue_since_timestamp_seconds"
    assert value(samples, overdue, cluster="east") == (T0 + timedelta(minutes=30)).timestamp()
    # The drain's limit (asked 20 min before T0, 10 min given) comes before the abort's deadline.
    assert value(samples, overdue, cluster="west") == (T0 - timedelta(minutes=10)).timestamp()
    assert value(samples, "gpu_capacity_defrag_jobs", cluster="west", state="abort-stuck") == 1
    lease = "gpu_capacity_lease_takeover_due_timestamp_seconds"
    # The dead worker's lease ends at T0 + 6 min, after the job's next check: due then.
    assert value(samples, lease, kind="defrag_job", cluster="east") == (T0 + timedelta(minutes=6)).timestamp()
    assert (lease, frozenset({"kind": "defrag_job", "cluster": "west"})) not in samples
    assert value(samples, lease, kind="binpack_run", cluster="west") == (T0 + timedelta(minutes=1)).timestamp()
    assert value(samples, lease, kind="runbook_action", cluster="east") == (T0 + timedelta(seconds=60)).timestamp()
    assert value(samples, "gpu_capacity_prune_run_lease_takeover_due_timestamp_seconds", cluster="east") \
        == (T0 + timedelta(seconds=30)).timestamp()
    assert value(samples, "gpu_capacity_prune_runs_total", cluster="east", mode="dry-run", status="failed") == 1
    assert value(samples, "gpu_capacity_prune_gpus_freed", cluster="east") == 3


@pytest.mark.django_db
def test_partial_scale_to_zero_applies_keep_their_first_time(scrape_token, sim_cluster_factory):
    """Applies against a cluster that answers every read with a 500 leave the org partial;
    a second partial apply keeps the first one's time; a complete apply clears it."""
    from orgs.models import Org
    from orgs.services import org_scale_to_zero_apply

    sim = sim_cluster_factory(name="partial-sim")
    org = Org.objects.create(slug="team", cluster=sim.cluster, namespace="team", dormant=True,
                             last_activity_at=T0 - timedelta(days=3))
    Org.objects.create(slug="fine", cluster=sim.cluster, namespace="fine")
    sim.control.set_faults(seed=0, error_rate=1.0, match={"verbs": ["list", "get"]})
    org_scale_to_zero_apply(org_id=org.id, now=T0)
    org_scale_to_zero_apply(org_id=org.id, now=T0 + timedelta(minutes=3))

    samples = scrape_token()
    assert Org.objects.get(pk=org.pk).pending
    assert value(samples, "gpu_capacity_scale_to_zero_partial_orgs", cluster="partial-sim") == 1
    assert value(samples, "gpu_capacity_scale_to_zero_partial_since_timestamp_seconds", cluster="partial-sim") \
        == T0.timestamp()

    sim.control.clear_faults()
    outcome = org_scale_to_zero_apply(org_id=org.id, now=T0 + timedelta(minutes=4))

    assert outcome.complete, outcome.summary()
    samples = scrape_token()
    assert value(samples, "gpu_capacity_scale_to_zero_partial_orgs", cluster="partial-sim") == 0
    assert ("gpu_capacity_scale_to_zero_partial_since_timestamp_seconds",
            frozenset({"cluster": "partial-sim"}.items())) not in samples


@pytest.mark.django_db
def test_cluster_reachability_and_periodic_last_runs(scrape_token):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from config.schedule import SCHEDULES

    _cluster("up", api_groups_seen_at=T0)
    _cluster("down", api_groups_seen_at=T0 - timedelta(hours=2), api_groups_error="connection refused")
    _cluster("new")
    sweep = PeriodicTask.objects.get(name="orgs: dormancy sweep")
    PeriodicTask.objects.filter(pk=sweep.pk).update(last_run_at=T0)
    PeriodicTask.objects.filter(name="pruning: expire skip rows").update(enabled=False)
    PeriodicTask.objects.filter(name="orgs: scale-to-zero retry").update(
        interval=IntervalSchedule.objects.create(every=2, period=IntervalSchedule.MINUTES))

    samples = scrape_token()

    assert value(samples, "gpu_capacity_cluster_api_reachable", cluster="up") == 1
    assert value(samples, "gpu_capacity_cluster_api_reachable", cluster="down") == 0
    assert value(samples, "gpu_capacity_cluster_api_reachable", cluster="new") == 0
    assert value(samples, "gpu_capacity_cluster_api_last_success_timestamp_seconds", cluster="down") \
        == (T0 - timedelta(hours=2)).timestamp()
    assert ("gpu_capacity_cluster_api_last_success_timestamp_seconds", frozenset({"cluster": "new"}.items())) \
        not in samples
    sweep_labels = dict(schedule="orgs: dormancy sweep", task="orgs.tasks.dormancy_sweep")
    assert value(samples, "gpu_capacity_periodic_task_last_run_timestamp_seconds", **sweep_labels) == T0.timestamp()
    assert value(samples, "gpu_capacity_periodic_task_interval_seconds", **sweep_labels) == 3600
    assert value(samples, "gpu_capacity_periodic_task_interval_seconds", schedule="orgs: scale-to-zero retry",
                 task="orgs.tasks.scale_to_zero_retry") == 120
    exported = {dict(labels)["schedule"] for name, labels in samples
                if name == "gpu_capacity_periodic_task_interval_seconds"}
    assert exported == {p.name for p in SCHEDULES} - {"pruning: expire skip rows"}


@pytest.mark.django_db
def test_queue_lengths_from_the_redis_broker(scrape_token, workers_broker):
    """Messages waiting on Redis, every priority lane counted, per queue; a broker that does
    not answer shows as not scraped (within the timeout), and the rest of /metrics is served."""
    from config.celery import app

    for priority in (0, 5, 9):
        app.send_task("capacity.tasks.defrag_job_run", args=(1,), priority=priority)   # routed to `long`
    app.send_task("orgs.tasks.org_scale_to_zero_apply", args=(1,), priority=0)       # routed to `apply`

    samples = scrape_token()
    assert value(samples, "gpu_capacity_broker_scrape_ok") == 1
    assert value(samples, "gpu_capacity_queue_messages", queue="long") == 3
    assert value(samples, "gpu_capacity_queue_messages", queue="apply") == 1
    for queue in ("beat", "sweep", "celery"):
        assert value(samples, "gpu_capacity_queue_messages", queue=queue) == 0
        assert ("gpu_capacity_queue_messages", frozenset({"queue": queue}.items())) in samples


@pytest.mark.django_db
def test_a_broker_that_does_not_answer_is_reported_not_raised(scrape_token):
    import socket
    import time

    from config.celery import app

    listener = socket.socket()   # accepts connections (the backlog) and never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    old = app.conf.broker_url, app.conf.broker_transport_options
    app.conf.broker_url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    app.conf.broker_transport_options = {}
    try:
        started = time.monotonic()
        samples = scrape_token()
        took = time.monotonic() - started
    finally:
        app.conf.broker_url, app.conf.broker_transport_options = old
        listener.close()
    assert value(samples, "gpu_capacity_broker_scrape_ok") == 0
    assert value(samples, "gpu_capacity_database_scrape_ok") == 1
    assert not any(name == "gpu_capacity_queue_messages" for name, _ in samples)
    assert took < 5


@pytest.mark.django_db(transaction=True)   # beat's scheduler closes and reopens its connections
def test_beat_records_each_schedules_run_as_it_sends_it(scrape_token):
    """The scheduler beat runs writes each run it sends at once (CELERY_BEAT_SYNC_EVERY), not
    only the first after start-up, so /metrics never shows a 10 s schedule minutes late."""
    from django_celery_beat.models import PeriodicTask

    from config import clock
    from config.beat import ClockedDatabaseScheduler
    from config.celery import app

    due = {"orgs: dormancy sweep": "orgs.tasks.dormancy_sweep",
           "pruning: expire skip rows": "pruning.tasks.prune_skip_rows_expire"}
    PeriodicTask.objects.filter(name__in=due).update(last_run_at=clock.now() - timedelta(hours=2))
    scheduler = ClockedDatabaseScheduler(app=app)
    for _ in range(3):   # a tick sends one due entry; the others were just installed, not due
        scheduler.tick()
    sent = clock.now()

    samples = scrape_token()
    for schedule, task in due.items():
        ran = value(samples, "gpu_capacity_periodic_task_last_run_timestamp_seconds", schedule=schedule, task=task)
        assert sent.timestamp() - 5 < ran <= sent.timestamp(), schedule
        assert PeriodicTask.objects.get(name=schedule).total_run_count == 1
