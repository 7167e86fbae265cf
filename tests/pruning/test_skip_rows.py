"""Skip rows stay few and short-lived: a beat of dry runs over pods that have gone does
not flood the decision list, and the run page still counts every skipped pod."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from kubernetes import client as k8s

from clusters.models import Cluster
from config import clock
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, prune_run_execute, prune_skip_rows_expire

from pruning_world import World, deployment

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        w.create(deployment("web", "team-a", util="0"))
        w.create(deployment("batch", "team-b", replicas=6, util="0"))
        w.record_history(minutes=40)
        # The batch job ended: its pods are gone, their GPU history is still in the window.
        k8s.AppsV1Api(w.api).patch_namespaced_deployment_scale("batch", "team-b", {"spec": {"replicas": 0}})
        w.control.advance(60)
        w.cluster = Cluster.objects.create(name="sim", kubeconfig_path=w.kubeconfig)
        yield w


def test_six_dry_runs_over_vanished_pods_write_one_row_per_reason_each(world):
    prom = world.prometheus()
    runs = [prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(), cluster=world.cluster,
                              params=PruneParams()) for _ in range(6)]
    gone = PruneDecision.objects.filter(reason="pod-not-found")
    assert gone.count() == 6                                    # not 36
    assert [d.count for d in gone] == [6] * 6
    row = gone.first()
    assert len(row.pods) == 6 and all(p.startswith("team-b/batch-") for p in row.pods)
    assert all(r.skip_counts == {"pod-not-found": 6} and r.idle_candidates == 7 for r in runs)
    assert PruneDecision.objects.filter(decision="prune").count() == 6     # web, once per run


def test_the_run_page_shows_skip_counts(world, admin_client):
    prom = world.prometheus()
    world.cluster.prometheus_url = prom.url
    world.cluster.save()
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                            cluster=world.cluster, params=PruneParams())
    page = admin_client.get(f"/admin/pruning/prunerun/{run.pk}/change/").content.decode()
    assert '<span id="skip-counts">6 pods: pod-not-found 6</span>' in page
    assert "(+5 more)" in page                                  # the shared row says how many it stands for
    assert page.count('<canvas data-chart=') == 2                # web, and one chart for the shared row
    counts = re.findall(r'<td class="field-count">\s*<p>(\d+)</p>', page)
    assert sorted(counts) == ["1", "6"]                         # the decisions' count column


def test_skip_rows_expire_after_the_retention_and_runs_keep_their_counts(world):
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            cluster=world.cluster, params=PruneParams())
    week = timedelta(days=7)
    assert prune_skip_rows_expire(now=clock.now() + week - timedelta(minutes=1), retention=week) == 0
    assert prune_skip_rows_expire(now=clock.now() + week + timedelta(minutes=1), retention=week) == 1
    assert list(run.decisions.values_list("decision", flat=True)) == ["prune"]
    run.refresh_from_db()
    assert run.skip_counts == {"pod-not-found": 6}


def test_the_beat_runs_the_reconcile_every_ten_seconds_and_the_expiry(settings):
    from django_celery_beat.models import PeriodicTask

    from clusters.services import schedules_install
    from pruning.tasks import prune_skip_rows_expire as expire_task

    schedules_install()
    reconcile = PeriodicTask.objects.get(task="pruning.tasks.prune_runs_reconcile")
    # 10 s: a run whose worker died is completed within its 30 s lease plus one beat.
    assert (reconcile.interval.every, reconcile.interval.period, reconcile.enabled) == (10, "seconds", True)
    assert PeriodicTask.objects.get(task="pruning.tasks.prune_skip_rows_expire").enabled
    old = PruneRun.objects.create(evaluated_at=clock.now())
    PruneRun.objects.filter(pk=old.pk).update(started_at=clock.now() - timedelta(days=8))
    PruneDecision.objects.create(run=old, namespace="n", pod="p", decision="skip", reason="too-young", count=3)
    settings.PRUNER_SKIP_RETENTION_DAYS = 7
    assert expire_task() == 1 and not PruneDecision.objects.exists()
