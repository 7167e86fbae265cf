"""deploy/alerts.yaml and deploy/grafana-dashboard.json on a real Prometheus: it scrapes the
control plane's /metrics (a live server, with the bearer token, as deploy/prometheus.yml
does) and the simulated cluster's DCGM exporter, evaluates the rule groups, and answers
every panel's query with data. Rows the test writes make some alerts fire; rows that are
on time keep the others quiet."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from capacity.gpumap.selectors import gpu_summary_recent
from config import clock
from simcluster.generate import namespace, node, resources
from tests.conftest import IN_CI
from tests.deploy.test_alerts import DEPLOY, _manifest

TOKEN = "prometheus-alerts-token"
H100 = "NVIDIA-H100-80GB-HBM3"
UTIL = "simcluster.io/gpu-utilization"
DEADLINE_S = 60.0   # Prometheus scrapes and evaluates every second; a few rounds are enough


def _deployment(name: str, ns: str, *, util: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}, "annotations": {UTIL: util}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.product": H100},
                         "containers": [{"name": "main", "image": "registry.example.com/model:1",
                                         "resources": resources(cpu="1", memory="1Gi", gpus=1)}]}}}}


def _query(prometheus_url: str, expr: str) -> list[dict]:
    url = f"{prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _alerts(prometheus_url: str) -> set[tuple]:
    """(alert, state, the labels that say what is wrong) of every alert pending or firing."""
    named = ("__name__", "alertname", "alertstate", "severity")
    return {(a["metric"]["alertname"], a["metric"]["alertstate"],
             tuple(sorted((k, v) for k, v in a["metric"].items() if k not in named)))
            for a in _query(prometheus_url, "ALERTS")}


def _rows(paged, calm) -> None:
    """On `paged`: a defrag job an hour past its limit under a lease that lapsed an hour
    ago, an org partial for an hour, a discovery that fails. On `calm`: the same kinds of
    rows, on time, and a dormant org and a prune that freed 2 GPUs (the savings panel).
    Every schedule ran just now but the hourly sweep (3 hours ago)."""
    from django_celery_beat.models import PeriodicTask

    from capacity.defrag.models import DefragJob, JobState
    from clusters.models import Cluster
    from config import clock
    from orgs.models import DormancySwitch, Org
    from pruning.models import PruneDecision, PruneRun

    now = clock.now()
    hour = timedelta(hours=1)
    Cluster.objects.filter(pk=paged.pk).update(api_groups_seen_at=now - hour, api_groups_error="connection refused")
    Cluster.objects.filter(pk=calm.pk).update(api_groups_seen_at=now)
    DefragJob.objects.create(cluster=paged, node_name="gpu-0", state=JobState.WAITING, created_at=now - 2 * hour,
                             started_at=now - 2 * hour, timeout_seconds=3600, next_check_at=now - hour,
                             lease_owner="task:dead", lease_expires_at=now - hour)
    DefragJob.objects.create(cluster=calm, node_name="gpu-0", state=JobState.WAITING, created_at=now, started_at=now,
                             timeout_seconds=3600, next_check_at=now + timedelta(seconds=10),
                             lease_owner="task:alive", lease_expires_at=now + timedelta(seconds=30))
    Org.objects.create(slug="stuck", cluster=paged, namespace="stuck", pending=["ksvc stuck/x: 403"],
                       pending_since=now - hour)
    fine = Org.objects.create(slug="fine", cluster=calm, namespace="fine", dormant=True)
    DormancySwitch.objects.create(org=fine, at=now, direction="dormant", cause="sweep", applied_at=now)
    run = PruneRun.objects.create(cluster=calm, mode=PruneRun.Mode.SCALE_DOWN, status=PruneRun.Status.SUCCEEDED,
                                  evaluated_at=now)
    PruneDecision.objects.create(run=run, namespace="fine", pod="idle-0", decision="prune", reason="idle",
                                 result="succeeded", gpus=["GPU-0", "GPU-1"], acted_at=now)
    PeriodicTask.objects.update(last_run_at=now)
    PeriodicTask.objects.filter(name="orgs: dormancy sweep").update(last_run_at=now - 3 * hour)


def _one_message_waiting_on_long() -> None:
    """The tests' in-process broker (memory://, shared with the live server's thread) with
    every queue emptied of what earlier tests queued, and one message on `long`."""
    from config import queues
    from config.celery import app

    with app.connection_for_write() as conn:
        for name in (*queues.ALL, queues.LEGACY):
            conn.default_channel.queue_declare(queue=name)
            conn.default_channel.queue_purge(name)
    app.send_task("capacity.tasks.defrag_job_run", args=(0,))   # routed to `long`; no worker here


@pytest.mark.django_db(transaction=True)   # the live server reads the rows from its own thread
def test_prometheus_fires_the_alerts_and_answers_every_panel(live_server, settings, sim_cluster_factory, tmp_path):
    from tests.prometheus_fixtures import PROMETHEUS, PrometheusServer

    if not Path(PROMETHEUS).exists():
        message = f"prometheus not found at {PROMETHEUS} (make system-deps installs it)"
        if IN_CI:
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    sim = sim_cluster_factory([node("gpu-0", pool="h100", product=H100, gpus=8), namespace("team"),
                               _deployment("idle-model", "team", util="0"),
                               _deployment("busy-model", "team", util="80")], name="paged")
    sim.advance(30)   # the pods are scheduled, started and hold their GPUs
    calm = sim_cluster_factory(name="calm")
    _rows(sim.cluster, calm.cluster)
    # The GPUs per pool panel: exported from the reading the dashboard keeps (kept longer
    # than this test waits for its panels).
    gpu_summary_recent(cluster=sim.cluster, now=clock.now())
    _one_message_waiting_on_long()
    settings.METRICS_TOKEN = TOKEN

    token = tmp_path / "metrics-token"
    token.write_text(TOKEN)
    rules = tmp_path / "alerts.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _manifest()["spec"]["groups"]}), encoding="utf-8")
    server = PrometheusServer(tmp_path / "prometheus")
    server.config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "dcgm", "honor_labels": True,
             "static_configs": [{"targets": [urllib.parse.urlsplit(sim.url).netloc]}]},
            {"job_name": "gpu-capacity", "authorization": {"credentials_file": str(token)},
             "static_configs": [{"targets": [urllib.parse.urlsplit(live_server.url).netloc]}]}]}))
    server.start()
    try:
        firing = {
            ("GpuCapacityDefragJobStuck", "firing", (("cluster", "paged"),)),
            ("GpuCapacityLeaseLost", "firing", (("cluster", "paged"), ("kind", "defrag_job"))),
            ("GpuCapacityPeriodicJobNotRunning", "firing",
             (("schedule", "orgs: dormancy sweep"), ("task", "orgs.tasks.dormancy_sweep"))),
            # These wait out their `for` first.
            ("GpuCapacityScaleToZeroPartial", "pending", (("cluster", "paged"),)),
            ("GpuCapacityClusterUnreachable", "pending", (("cluster", "paged"),)),
            ("GpuCapacityQueueBacklog", "pending", (("queue", "long"),)),
        }
        dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text(encoding="utf-8"))
        queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"]
                   if panel.get("type") != "row" for target in panel["targets"]]

        def empty_panels() -> list[tuple[str, str]]:
            return [(title, expr) for title, expr in queries if not _query(server.url, expr)]

        # A rate over an hour needs two scrapes of its series: a few seconds.
        deadline = time.monotonic() + DEADLINE_S
        seen, empty = set(), queries
        while time.monotonic() < deadline and not (firing <= seen and not empty):   # an external process, bounded
            time.sleep(0.5)
            seen, empty = _alerts(server.url), empty_panels()
        assert seen == firing
        assert empty == []
        in_use = {r["metric"]["modelName"]: float(r["value"][1]) for r in
                  _query(server.url, 'count by (modelName) (DCGM_FI_DEV_GPU_UTIL{pod!=""})')}
        assert in_use == {"NVIDIA H100 80GB HBM3": 2.0}
        idle = _query(server.url, 'count by (modelName) (max_over_time(DCGM_FI_DEV_GPU_UTIL{pod!=""}[15m]) < 5)')
        assert [float(r["value"][1]) for r in idle] == [1.0]
        freed = _query(server.url, "max by (cluster) (gpu_capacity_prune_gpus_freed)")
        assert [(r["metric"]["cluster"], float(r["value"][1])) for r in freed] == [("calm", 2.0)]
    finally:
        server.stop()
