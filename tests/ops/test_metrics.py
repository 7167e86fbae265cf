"""/metrics: the control plane's own families, after real actions on a simulated cluster."""
from __future__ import annotations

from datetime import timedelta

import pytest

from clusters import kube
from clusters.errors import NotFound
from config import clock
from tests.ops.helpers import value


def test_gateway_calls_and_errors_by_verb_and_resource(sim_cluster_factory, scrape):
    sim = sim_cluster_factory(name="metrics-sim")
    before = scrape()

    sim.gateway.list(kube.NODES)
    with pytest.raises(NotFound):
        sim.gateway.get(kube.PODS, "no-such-pod", namespace="default")

    after = scrape()
    calls = "gpu_capacity_kube_api_calls_total"
    errors = "gpu_capacity_kube_api_errors_total"
    for verb, resource in (("list", "nodes"), ("get", "pods")):
        labels = dict(cluster="metrics-sim", verb=verb, resource=resource)
        assert value(after, calls, **labels) - value(before, calls, **labels) == 1
    assert value(after, errors, cluster="metrics-sim", verb="get", resource="pods", code="404") \
        - value(before, errors, cluster="metrics-sim", verb="get", resource="pods", code="404") == 1
    assert value(after, errors, cluster="metrics-sim", verb="list", resource="nodes", code="404") == 0
    assert sim.gateway.errors[("get", "pods")] == 1  # the gateway's own counter agrees


def test_a_sweep_shows_as_a_dormancy_switch_and_a_task_duration(sim_cluster_factory, scrape):
    from orgs.models import Org
    from orgs.tasks import dormancy_sweep

    sim = sim_cluster_factory(name="sweep-sim")
    Org.objects.create(slug="idle-org", cluster=sim.cluster, namespace="idle-org",
                       last_activity_at=clock.now() - timedelta(hours=30))
    Org.objects.create(slug="busy-org", cluster=sim.cluster, namespace="busy-org",
                       last_activity_at=clock.now() - timedelta(hours=1))
    before = scrape()
    duration = dict(task="orgs.tasks.dormancy_sweep", state="SUCCESS")

    result = dormancy_sweep.apply().get()

    assert result["dormant"] == ["idle-org"]
    after = scrape()
    assert value(after, "gpu_capacity_dormancy_switches_total", cluster="sweep-sim", direction="dormant",
                 cause="sweep") == 1
    assert value(after, "gpu_capacity_dormancy_switches_total", cluster="sweep-sim", direction="active",
                 cause="sweep") == 0
    assert value(after, "gpu_capacity_orgs", cluster="sweep-sim", state="dormant") == 1
    assert value(after, "gpu_capacity_orgs", cluster="sweep-sim", state="active") == 1
    assert value(after, "gpu_capacity_task_duration_seconds_count", **duration) \
        - value(before, "gpu_capacity_task_duration_seconds_count", **duration) == 1
    assert value(after, "gpu_capacity_task_duration_seconds_bucket", le="+Inf", **duration) \
        == value(after, "gpu_capacity_task_duration_seconds_count", **duration)


def test_defrag_jobs_by_state_and_prune_decisions_by_result(sim_cluster_factory, scrape):
    from capacity.defrag.models import DefragJob, JobState
    from pruning.models import PruneDecision, PruneRun

    sim = sim_cluster_factory(name="jobs-sim")
    DefragJob.objects.create(cluster=sim.cluster, node_name="gpu-node-1", state=JobState.WAITING,
                             created_at=clock.now())
    DefragJob.objects.create(cluster=sim.cluster, node_name="gpu-node-2", state=JobState.ABORTED,
                             created_at=clock.now())
    run = PruneRun.objects.create(cluster=sim.cluster, mode=PruneRun.Mode.SCALE_DOWN,
                                  status=PruneRun.Status.PARTIAL, evaluated_at=clock.now())
    for pod, decision, result in (("a", "prune", "succeeded"), ("b", "prune", "succeeded"),
                                  ("c", "prune", "failed"), ("d", "skip", "")):
        PruneDecision.objects.create(run=run, namespace="team", pod=pod, decision=decision,
                                     reason="idle" if decision == "prune" else "too-young", result=result)

    samples = scrape()

    assert value(samples, "gpu_capacity_database_scrape_ok") == 1
    jobs = {state: value(samples, "gpu_capacity_defrag_jobs", cluster="jobs-sim", state=state)
            for state in JobState.values}
    assert jobs == {state: (1 if state in ("waiting", "aborted") else 0) for state in JobState.values}
    decisions = "gpu_capacity_prune_decisions_total"
    assert value(samples, decisions, cluster="jobs-sim", decision="prune", result="succeeded") == 2
    assert value(samples, decisions, cluster="jobs-sim", decision="prune", result="failed") == 1
    assert value(samples, decisions, cluster="jobs-sim", decision="skip", result="none") == 1
    assert value(samples, "gpu_capacity_prune_runs_total", cluster="jobs-sim", mode="scale-down",
                 status="partial") == 1


@pytest.mark.django_db
def test_metrics_need_the_bearer_token_when_one_is_set(client, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert response.status_code == 200
    assert b"gpu_capacity_kube_api_calls_total" in response.content or b"gpu_capacity_defrag_jobs" in response.content


@pytest.mark.django_db
def test_metrics_are_closed_without_a_token_when_debug_is_off(client, settings):
    settings.DEBUG = False
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics")
    assert response.status_code == 403
    assert b"METRICS_TOKEN" in response.content


@pytest.mark.django_db
def test_probes_answer_a_pod_ip_host_over_plain_http(client, settings):
    """The kubelet and Prometheus reach a pod by IP, over HTTP: no 400 DisallowedHost, no redirect."""
    settings.ALLOWED_HOSTS = ["panel.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    settings.METRICS_TOKEN = "tok"
    assert client.get("/healthz", HTTP_HOST="10.42.0.7:8000").status_code == 200
    assert client.get("/metrics", HTTP_HOST="10.42.0.7:8000",
                      HTTP_AUTHORIZATION="Bearer tok").status_code == 200
    # Everything else still gets the Host check and the HTTPS redirect.
    assert client.get("/admin/", HTTP_HOST="panel.example.com").status_code == 301
    assert client.get("/admin/", HTTP_HOST="10.42.0.7:8000").status_code == 400
