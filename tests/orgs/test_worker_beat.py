"""The hourly sweep through a real Celery worker and beat, on real Redis and PostgreSQL.

`celery -A config worker` and `celery -A config beat` run as subprocesses against this
test's PostgreSQL database (a transactional test, so they see committed rows), a Redis
database number of the test's own as broker, and a simulated cluster registered as a
`Cluster` row. Time is injected through CLOCK_OFFSET_FILE: writing one number moves the
worker's and beat's "now" an hour ahead, and beat must fire the sweep on that clock.
"""
from __future__ import annotations

import os
from datetime import timedelta

import pytest

from clusters import kube
from clusters.services import schedules_install
from config import clock
from orgs import services
from orgs.models import DormancySwitch, Org
from orgs.planning import MIN_SCALE
from tests.celery_workers import broker_url, celery_processes, wait_for  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SWEEP_TASK = "orgs.tasks.dormancy_sweep"

ORGS = ("acme", "initech", "globex")


def scenario() -> list[dict]:
    """Knative 1.21, and per org a namespace with a pynode at min-scale "1"."""
    docs = [{"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}}]
    for org in ORGS:
        docs.append({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": org, "labels": {"capacity.io/org": org}}})
        docs.append({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                     "metadata": {"name": "pynode", "namespace": org,
                                  "labels": {"capacity.io/component": "pynode"}},
                     "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "1"}},
                                           "spec": {"containers": [{"image": "pynode:1"}]}}}})
    return docs


def test_beat_fires_the_hourly_sweep_on_the_injected_clock_and_the_worker_scales_to_zero(
        sim_cluster_factory, celery_processes):
    from django_celery_beat.models import PeriodicTask

    sim = sim_cluster_factory(scenario())
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    real_now = clock.now()
    Org.objects.filter(slug="acme").update(last_activity_at=real_now - timedelta(hours=25))
    # Idle 23.5 h by the wall clock: only the worker's injected clock makes it 24.5 h.
    Org.objects.filter(slug="initech").update(last_activity_at=real_now - timedelta(hours=23, minutes=30))
    Org.objects.filter(slug="globex").update(last_activity_at=real_now - timedelta(hours=2))

    # The schedules as migrate installs them; only the sweep runs here, and it last ran now,
    # so by the wall clock its next run is an hour away.
    schedules_install()
    PeriodicTask.objects.exclude(task=SWEEP_TASK).update(enabled=False)
    PeriodicTask.objects.filter(task=SWEEP_TASK).update(enabled=True, last_run_at=real_now, total_run_count=0)
    sweep = PeriodicTask.objects.get(task=SWEEP_TASK)
    assert (sweep.interval.every, sweep.interval.period) == (3600, "seconds")

    procs = celery_processes
    procs.start("worker", "worker", "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"orgs-test-{os.getpid()}@%h", "--loglevel=INFO")
    procs.start("beat", "beat", "--loglevel=DEBUG", "--pidfile=", "-s", str(procs.tmp_path / "beat-schedule"))
    wait_for(lambda: "ready." in procs.log("worker"), "the worker is ready", procs)
    # CELERY_BEAT_MAX_INTERVAL reaches beat (Celery itself ignores that name; config/beat.py applies it).
    wait_for(lambda: "Ticking with max interval->1.00 second" in procs.log("beat"), "beat ticks every second", procs)
    # Beat has read the schedule and is ticking on the real clock: the sweep is not due.
    wait_for(lambda: "DatabaseScheduler: Fetching database schedule" in procs.log("beat"), "beat read the schedule",
             procs)
    assert not Org.objects.filter(dormant=True).exists()
    assert "Sending due task orgs: dormancy sweep" not in procs.log("beat")

    # Move worker and beat past the next hourly run (one hour and a minute ahead).
    procs.offset_file.write_text(str(3600 + 60))

    wait_for(lambda: Org.objects.filter(slug="acme", dormant=True).exists(), "acme turns dormant", procs)
    wait_for(lambda: (gw.get(kube.KNATIVE_SERVICES, "pynode", namespace="acme")["spec"]["template"]["metadata"]
                      ["annotations"].get(MIN_SCALE) == "0"), "acme's pynode gets min-scale 0", procs)
    wait_for(lambda: DormancySwitch.objects.filter(org__slug="initech", applied_at__isnull=False).exists(),
             "initech's switch is applied", procs)
    wait_for(lambda: DormancySwitch.objects.filter(org__slug="acme", applied_at__isnull=False).exists(),
             "acme's switch is applied", procs)

    assert "Sending due task orgs: dormancy sweep (orgs.tasks.dormancy_sweep)" in procs.log("beat")
    acme = Org.objects.get(slug="acme")
    assert acme.applied == "enabled" and acme.last_error == ""
    # The sweep ran at the injected time: dormant since an hour ahead of the wall clock.
    assert acme.dormant_since - real_now >= timedelta(hours=1)
    [switch] = acme.switches.all()
    assert (switch.direction, switch.cause, switch.actor) == ("dormant", "sweep", None)
    assert switch.patched == ["ksvc acme/pynode: min-scale 1 → 0 (owner's value 1 recorded)"] and switch.errors == []

    initech = Org.objects.get(slug="initech")
    assert initech.dormant, "the worker's sweep reads the injected clock: 23.5 h + 1 h is over 24 h"
    assert gw.get(kube.KNATIVE_SERVICES, "pynode", namespace="initech")["spec"]["template"]["metadata"][
        "annotations"][MIN_SCALE] == "0"
    globex = Org.objects.get(slug="globex")
    assert not globex.dormant and not globex.switches.exists()
    assert gw.get(kube.KNATIVE_SERVICES, "pynode", namespace="globex")["spec"]["template"]["metadata"][
        "annotations"][MIN_SCALE] == "1", "an active org keeps its floor"

    procs.stop()  # beat writes its schedule state on the way out
    sweep.refresh_from_db()
    assert sweep.total_run_count == 1, "one hour moved: the hourly sweep fired once"
    assert sweep.last_run_at - real_now >= timedelta(hours=1)
