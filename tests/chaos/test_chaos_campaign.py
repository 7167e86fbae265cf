"""A consolidation campaign under the chaos suite: real Celery workers (two prefork workers
and beat, Redis broker, this test's PostgreSQL) SIGKILLed at random moments while a campaign
started through the product frees a pool of half-full nodes of a faulty simulated cluster;
then its invariants (tests/chaos/campaign.py).

CHAOS_CAMPAIGN_SCENARIOS (default 1) and CHAOS_SEED (default: drawn and printed) choose the run.
"""
from __future__ import annotations

import os
import random

import pytest

from clusters.services import schedules_install
from config.celery import app
from tests.celery_workers import broker_url, celery_processes, workers_broker  # noqa: F401 - fixtures

from .campaign import CAMPAIGN_ENV, CampaignChaos
from .driver import BEAT_TASKS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_campaign_under_kills_and_faults_keeps_every_invariant(sim_cluster_factory, celery_processes,
                                                                workers_broker, settings, capsys):
    from django.contrib.auth.models import User
    from django.test import Client
    from django_celery_beat.models import PeriodicTask

    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10 ** 6))
    scenarios = int(os.environ.get("CHAOS_CAMPAIGN_SCENARIOS") or 1)

    def say(text):
        with capsys.disabled():
            print(text, flush=True)

    say(f"\ncampaign chaos seed {seed}, {scenarios} scenario(s) (replay: CHAOS_SEED={seed} "
        f"CHAOS_CAMPAIGN_SCENARIOS={scenarios} pytest {__file__})")
    settings.CLOCK_OFFSET_FILE = str(celery_processes.offset_file)   # this process reads the workers' clock
    schedules_install()
    PeriodicTask.objects.exclude(task__in=BEAT_TASKS).update(enabled=False)
    panel = Client()      # the operator's browser: a superuser's session on the panel, in this process
    panel.force_login(User.objects.create_superuser("chaos-operator", password="unused"))
    celery_processes.env.update(CAMPAIGN_ENV)
    driver = CampaignChaos(seed=seed, procs=celery_processes,
                           make_cluster=lambda objects, name, speed: sim_cluster_factory(objects, name=name,
                                                                                         speed=speed),
                           send_task=lambda name, args: app.send_task(name, args=args), say=say, panel=panel,
                           workdir=celery_processes.tmp_path)
    driver.workers_start(str(celery_processes.tmp_path / "beat-schedule"))
    try:
        stats = driver.run(scenarios)
    finally:
        say(driver.stats.table())
    assert stats.scenarios == scenarios
    assert sum(stats.campaigns.values()) == scenarios, stats.campaigns
    assert sum(stats.kills.values()) >= 1, "no worker was killed: the scenario tested nothing"
    assert not stats.violations, f"chaos seed {seed}: {len(stats.violations)} invariant violation(s):\n" + \
        "\n".join(stats.violations)
