"""Queues: every task has its queue (config/queues.py), beat fires only the fan-outs, and a
message routed to each queue is run by a real worker started on that queue alone (`-Q`), on
Redis with the priority lanes the settings give every queue."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from capacity.binpack.models import BinpackRun
from clusters import kube
from clusters.models import Cluster
from config import clock, queues
from config.celery import app, task_send
from config.schedule import SCHEDULES
from orgs import services
from orgs.models import Org
from orgs.planning import MIN_SCALE
from tests.celery_workers import broker_url, celery_processes, wait_for, workers_broker  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
PRIORITY_SEP = "\x06\x16"   # how kombu's Redis transport names a queue's priority lane: <queue><sep><step>


def _product_tasks() -> set[str]:
    app.loader.import_default_modules()
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_task_has_a_queue_and_beat_fires_only_database_fan_outs():
    tasks = _product_tasks()
    assert tasks - set(queues.ROUTES) == set(), "a task with no queue of its own would land on the default"
    assert set(queues.ROUTES) - tasks == set(), "a route names a task that does not exist"
    # Beat's tasks read the database and queue the rest; completing a dead worker's prune run
    # reads the cluster, so it runs beside the prune runs themselves.
    for periodic in SCHEDULES:
        expected = queues.LONG if periodic.task == "pruning.tasks.prune_runs_reconcile" else queues.BEAT
        assert queues.ROUTES[periodic.task]["queue"] == expected, periodic.name
    # The work a fan-out queues lands on the queue that says what it is.
    assert {queues.ROUTES[t]["queue"] for t in ("capacity.tasks.defrag_job_run", "pruning.tasks.prune_cluster",
                                                "capacity.binpack.tasks.binpack_cluster",
                                                "capacity.runbook.tasks.runbook_actions_settle_cluster")} == {"long"}
    assert queues.ROUTES["orgs.tasks.org_scale_to_zero_apply"]["queue"] == "apply"
    assert app.conf.task_default_queue == queues.SWEEP
    assert [q.name for q in app.conf.task_queues] == [*queues.ALL, queues.LEGACY]
    assert len({q.routing_key for q in app.conf.task_queues}) == len(app.conf.task_queues), \
        "a shared routing key would copy one message into several queues"


def test_the_readme_deploy_compose_and_demo_name_every_queue():
    readme = (ROOT / "README.md").read_text()
    for name, _, _ in queues.QUEUES:
        assert f"| `{name}` |" in readme, f"the README's queue table lacks {name}"
    compose = (ROOT / "docker-compose.yml").read_text()
    deploy = (ROOT / "deploy" / "worker.yaml").read_text()
    for name in queues.ALL:
        assert f"-Q {name}" in compose.replace(",", " -Q ") and f"-Q {name}" in deploy.replace(",", " -Q "), name


def scenario() -> list[dict]:
    docs = [{"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}}]
    for org in ("acme", "globex"):
        docs.append({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": org, "labels": {"capacity.io/org": org}}})
        docs.append({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                     "metadata": {"name": "pynode", "namespace": org, "labels": {"capacity.io/component": "pynode"}},
                     "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1"}},
                                           "spec": {"containers": [{"image": "pynode:1"}]}}}})
    return docs


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_message_on_each_queue_is_run_by_the_worker_started_on_that_queue(sim_cluster_factory, celery_processes,
                                                                            workers_broker):
    sim = sim_cluster_factory(scenario())
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    Org.objects.filter(slug="acme").update(last_activity_at=clock.now() - timedelta(hours=25))
    globex = Org.objects.get(slug="globex")

    # Queued as the product queues (the task's own options), before any worker runs: each
    # message waits in its own queue's priority lane.
    task_send("orgs.tasks.dormancy_sweep")                                        # beat, then apply
    task_send("clusters.tasks.discovery_refresh_cluster", args=[sim.cluster.id])  # sweep
    task_send("capacity.binpack.tasks.binpack_cluster", args=[sim.cluster.id])    # long
    task_send("orgs.tasks.org_scale_to_zero_apply", args=[globex.id], priority=services.HIGH_PRIORITY)  # apply, a wake
    broker = redis.Redis.from_url(workers_broker)
    lanes = {key.decode() for key in broker.keys("*") if not key.startswith((b"_kombu", b"unacked", b"capacity-test"))}
    default = app.conf.task_default_priority
    assert lanes == {f"beat{PRIORITY_SEP}{default}", f"sweep{PRIORITY_SEP}{default}", f"long{PRIORITY_SEP}{default}",
                     "apply"}, "priority 0 is the queue's own list, any other its lane"

    procs = celery_processes
    for name in queues.ALL:
        procs.start(name, "worker", "-Q", name, "--pool=solo", "--without-gossip", "--without-mingle",
                    "--without-heartbeat", "-n", f"queue-{name}-{os.getpid()}@%h", "--loglevel=INFO")
    for name in queues.ALL:
        wait_for(lambda name=name: "ready." in procs.log(name), f"the {name} worker is ready", procs)

    gw = sim.gateway

    def min_scale(org):
        return gw.get(kube.KNATIVE_SERVICES, "pynode", namespace=org)["spec"]["template"]["metadata"]["annotations"][
            MIN_SCALE]

    wait_for(lambda: Org.objects.get(slug="acme").applied == "enabled", "the sweep's apply enabled acme", procs)
    assert min_scale("acme") == "0"
    wait_for(lambda: Org.objects.get(slug="globex").applied == "disabled", "globex's first apply ran", procs)
    assert min_scale("globex") == "1", "an awake org keeps its floor"
    wait_for(lambda: Cluster.objects.get(pk=sim.cluster.id).api_groups_seen_at is not None, "discovery ran", procs)
    wait_for(lambda: BinpackRun.objects.filter(cluster_id=sim.cluster.id, finished_at__isnull=False).exists(),
             "the binpack run finished", procs)

    ran = {"beat": ["orgs.tasks.dormancy_sweep"],
           "sweep": ["clusters.tasks.discovery_refresh_cluster"],
           "apply": ["orgs.tasks.org_scale_to_zero_apply"],
           "long": ["capacity.binpack.tasks.binpack_cluster"]}
    for name, tasks in ran.items():
        for task in tasks:
            for other in queues.ALL:
                received = f"Task {task}[" in procs.log(other)
                assert received == (other == name), f"{task} ran on the {other} worker\n{procs.logs()}"
    assert procs.log("apply").count("] received") == 2, "the sweep's apply and globex's: each run once"
