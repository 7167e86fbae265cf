"""The chaos suite under pytest: a few seeded scenarios on real Celery workers (two prefork
workers and beat, Redis broker, this test's PostgreSQL) against a faulty simulated cluster.

CHAOS_SCENARIOS (default 2) and CHAOS_SEED (default: drawn and printed) choose the run;
`python -m tests.chaos --scenarios N --seed S` sets them for a soak and prints the table.
"""
from __future__ import annotations

import os
import random

import pytest

from clusters.services import schedules_install
from config.celery import app
from tests.celery_workers import broker_url, celery_processes, workers_broker  # noqa: F401 - fixtures

from .driver import BEAT_TASKS, GAP_BOUND_S, PRUNER_ENV, ChaosDriver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(3600)]

SUMMARY_FILE_ENV = "CHAOS_SUMMARY_FILE"   # where `python -m tests.chaos` reads the table back


def test_chaos_scenarios_keep_every_invariant(sim_cluster_factory, celery_processes, workers_broker, settings,
                                              capsys):
    from django_celery_beat.models import PeriodicTask

    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10 ** 6))
    scenarios = int(os.environ.get("CHAOS_SCENARIOS") or 2)
    with capsys.disabled():
        print(f"\nchaos seed {seed}, {scenarios} scenario(s) (replay: python -m tests.chaos "
              f"--scenarios {scenarios} --seed {seed})", flush=True)
    settings.CLOCK_OFFSET_FILE = str(celery_processes.offset_file)   # this process reads the workers' clock
    settings.ORGS_ACTIVITY_THROTTLE_SECONDS = 0                      # every racing activity reaches the DB
    schedules_install()
    PeriodicTask.objects.exclude(task__in=BEAT_TASKS).update(enabled=False)

    def make_cluster(objects, name, speed):
        return sim_cluster_factory(objects, name=name, speed=speed)

    def send_task(name, args):
        app.send_task(name, args=args)

    def say(text):
        with capsys.disabled():
            print(text, flush=True)

    # The operator's browser: a superuser's session on the panel, in this process.
    from django.contrib.auth.models import User
    from django.test import Client

    panel = Client()
    panel.force_login(User.objects.create_superuser("chaos-operator", password="unused"))
    celery_processes.env.update(PRUNER_ENV)       # the workers prune for real (scale down)
    driver = ChaosDriver(seed=seed, procs=celery_processes, make_cluster=make_cluster, send_task=send_task, say=say,
                         panel=panel, workdir=celery_processes.tmp_path)
    driver.workers_start(str(celery_processes.tmp_path / "beat-schedule"))
    try:
        stats = driver.run(scenarios)
    finally:
        table = driver.stats.table()
        say(table)
        if os.environ.get(SUMMARY_FILE_ENV):
            with open(os.environ[SUMMARY_FILE_ENV], "w", encoding="utf-8") as fh:
                fh.write(table + "\n")
    assert stats.scenarios == scenarios
    # A killed worker's job is stepped again within one lease plus one resume beat (and the
    # fast-forward's granularity): within a minute.
    assert GAP_BOUND_S["whole"] <= 60 and GAP_BOUND_S["pool"] <= 60
    assert max(stats.gaps["whole"] + stats.gaps["pool"], default=0.0) <= GAP_BOUND_S["whole"], stats.gaps
    assert not stats.violations, f"chaos seed {seed}: {len(stats.violations)} invariant violation(s):\n" + \
        "\n".join(stats.violations)
