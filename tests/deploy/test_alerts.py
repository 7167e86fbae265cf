"""deploy/alerts.yaml and deploy/grafana-dashboard.json: the rules pass promtool's check
and the unit tests of tests/deploy/alerts_test.yaml, follow the kube-prometheus convention, point
at their runbook in deploy/README.md, and every alert expression and panel query names only
metrics that are exported: the control plane's /metrics, scraped here with a row behind
every family, and the simulated cluster's DCGM exporter."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.celery_workers import broker_url, workers_broker  # noqa: F401 - fixtures
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
METRICS_TOKEN = "dashboard-check-token"

# PromQL words that are neither metrics nor functions (a function is a word before "(").
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def _manifest() -> dict:
    return yaml.safe_load((DEPLOY / "alerts.yaml").read_text(encoding="utf-8"))


def _alerts() -> list[dict]:
    return [rule for group in _manifest()["spec"]["groups"] for rule in group["rules"] if "alert" in rule]


def _panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text(encoding="utf-8"))
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] if panel.get("type") != "row"
            for target in panel.get("targets", [])]


def _promtool() -> str:
    if not Path(PROMTOOL).exists():
        message = f"promtool not found at {PROMTOOL} (make system-deps installs it)"
        if IN_CI:
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return PROMTOOL


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def _rules_file(tmp_path: Path) -> Path:
    """spec.groups of the PrometheusRule as a plain Prometheus rules file."""
    path = tmp_path / "alerts.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": _manifest()["spec"]["groups"]}, sort_keys=False), encoding="utf-8")
    return path


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: every word that is not a function call
    (a word before "("), a keyword, a label name (in braces, or in by/without/on/ignoring/
    group_left/group_right lists), a string or a duration."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    words = re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text)
    return {m.group(1) for m in words if not m.group(2) and m.group(1).lower() not in KEYWORDS}


def test_metric_names_are_found_in_expressions():
    expr = ('max by (cluster) (sum without (mode) (increase(gpu_capacity_prune_runs_total{status="failed"}[30m])))'
            ' >= 3 unless on (cluster) label_replace(time() - min by (cluster) (other_metric:rate5m), '
            '"kind", "x", "", "") or absent(third) * 2 offset 5m')
    assert metric_names(expr) == {"gpu_capacity_prune_runs_total", "other_metric:rate5m", "third"}


def test_the_rule_groups_pass_promtool_check(tmp_path):
    done = _run(_promtool(), "check", "rules", str(_rules_file(tmp_path)), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


def test_the_alert_unit_tests_pass_promtool(tmp_path):
    _rules_file(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / "alerts_test.yaml")
    done = _run(_promtool(), "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not():
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))["tests"]
             for case in test["alert_rule_test"]]
    for alert in _alerts():
        name = alert["alert"]
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name}: no case fires it"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), f"{name}: no case keeps it quiet"


def test_the_manifest_follows_the_kube_prometheus_convention():
    manifest = _manifest()
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["namespace"] == "gpu-capacity"
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", readme, flags=re.M)}
    names = [alert["alert"] for alert in _alerts()]
    assert len(names) == len(set(names)) >= 8
    for alert in _alerts():
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], alert["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "deploy/README.md" and anchor == alert["alert"].lower(), alert["alert"]
        assert anchor in anchors, f"{alert['alert']}: deploy/README.md has no section #{anchor}"


def test_the_dashboard_queries_parse_as_promql(tmp_path):
    """Each panel's query as a recording rule: promtool parses it as Prometheus would."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(_panel_queries())]}]}
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    done = _run(_promtool(), "check", "rules", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _rows_behind_every_family(sim) -> None:
    """A row for each family of /metrics that is empty without one."""
    from capacity.binpack.models import BinpackRun
    from capacity.defrag.models import DefragJob, JobState
    from capacity.gpumap.selectors import gpu_summary_recent
    from capacity.runbook.models import RunbookAction
    from config import clock
    from orgs.models import DormancySwitch, Org
    from pruning.models import PruneDecision, PruneRun

    now, cluster = clock.now(), sim.cluster
    type(cluster).objects.filter(pk=cluster.pk).update(api_groups_seen_at=now)
    DefragJob.objects.create(cluster=cluster, node_name="gpu-node-1", state=JobState.WAITING, created_at=now,
                             started_at=now, lease_owner="task:x", lease_expires_at=now + timedelta(seconds=30))
    BinpackRun.objects.create(cluster=cluster, started_at=now, trigger=BinpackRun.Trigger.SCHEDULE,
                              state=BinpackRun.State.WRITING, lease_owner="w", lease_expires_at=now)
    RunbookAction.objects.create(at=now, cluster=cluster, action="model_redeploy", target="team/m",
                                 state=RunbookAction.State.ACTING, acting_owner="w", acting_expires_at=now)
    run = PruneRun.objects.create(cluster=cluster, status=PruneRun.Status.RUNNING, evaluated_at=now,
                                  lease_owner="w", lease_expires_at=now)
    PruneDecision.objects.create(run=run, namespace="team", pod="p", decision="prune", reason="idle",
                                 result="succeeded", gpus=["GPU-1"])
    org = Org.objects.create(slug="team", cluster=cluster, namespace="team", pending=["ksvc team/x: 500"],
                             pending_since=now)
    DormancySwitch.objects.create(org=org, at=now, direction="dormant", cause="sweep")
    # The GPUs per pool are exported from the reading the dashboard keeps.
    gpu_summary_recent(cluster=cluster, now=now)


@pytest.mark.django_db
def test_every_alert_expression_and_panel_query_names_an_exported_metric(client, settings, sim_cluster_factory,
                                                                       workers_broker):
    sim = sim_cluster_factory(name="dashboard-sim")
    _rows_behind_every_family(sim)
    settings.METRICS_TOKEN = METRICS_TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 200
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=10) as dcgm:
        exporter_text = dcgm.read().decode()
    exported = {sample.name for text in (response.content.decode(), exporter_text)
                for family in text_string_to_metric_families(text) for sample in family.samples}
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpu_capacity_queue_messages",
            "gpu_capacity_lease_takeover_due_timestamp_seconds"} <= exported

    used = {}
    for alert in _alerts():
        used.setdefault(alert["alert"], set()).update(metric_names(alert["expr"]))
    for title, expr in _panel_queries():
        used.setdefault(f"panel {title!r}", set()).update(metric_names(expr))
    assert all(used.values()), {where: names for where, names in used.items() if not names}
    missing = {where: sorted(names - exported) for where, names in used.items() if names - exported}
    assert missing == {}


def test_the_service_monitor_scrapes_the_web_service_with_the_metrics_token():
    service = next(d for d in yaml.safe_load_all((DEPLOY / "web.yaml").read_text(encoding="utf-8"))
                   if d and d["kind"] == "Service")
    monitor = yaml.safe_load((DEPLOY / "servicemonitor.yaml").read_text(encoding="utf-8"))
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # The Secret deploy/README.md has the operator create, under the key settings read.
    assert endpoint["authorization"]["credentials"] == {"name": "gpu-capacity", "key": "METRICS_TOKEN"}
    assert "--from-literal=METRICS_TOKEN=" in (DEPLOY / "README.md").read_text(encoding="utf-8")
