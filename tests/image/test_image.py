"""The built image run as deploy/*.yaml run it: migrate, the panel under gunicorn, a worker per
queue taking its tasks, beat, uid 10001 on a read-only root filesystem."""
from __future__ import annotations

import re

import pytest
import requests

from config.schedule import SCHEDULES

# The first test's set-up builds the image when `make image` has not (cold: minutes).
pytestmark = pytest.mark.timeout(900)


def test_migrate_ran_every_app_migration(stack):
    assert "Applying audit." in stack.migrate_output and "Applying savings." in stack.migrate_output
    check = stack.manage("migrate", "--check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_probes_answer_and_readyz_sees_database_broker_and_cluster(stack):
    health = requests.get(f"{stack.web_url}/healthz", timeout=5)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = stack.wait_for(lambda: (r := requests.get(f"{stack.web_url}/readyz", timeout=10)).status_code == 200 and r,
                           "readyz answers 200")
    checks = ready.json()["checks"]
    assert {"database", "broker"} < set(checks) and len(checks) == 3, checks     # and the default cluster
    assert all(check["status"] == "ok" for check in checks.values()), checks


def test_login_page_and_its_static_files_are_served(stack):
    login = requests.get(f"{stack.web_url}/admin/login/", timeout=10)
    assert login.status_code == 200 and 'name="username"' in login.text
    stylesheets = re.findall(r'href="(/static/[^"]+\.css)"', login.text)
    assert stylesheets, "the login page links its stylesheets"
    for href in stylesheets:
        css = requests.get(f"{stack.web_url}{href}", timeout=10)
        assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css"), href
        assert len(css.content) > 0, href


def test_a_panel_page_after_login(stack):
    created = stack.manage("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com",
                           env={"DJANGO_SUPERUSER_PASSWORD": "image-test-password"})
    assert created.returncode == 0, created.stderr
    session = requests.Session()
    login_page = session.get(f"{stack.web_url}/admin/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
    session.post(f"{stack.web_url}/admin/login/?next=/admin/", timeout=10,
                 data={"username": "ops", "password": "image-test-password", "csrfmiddlewaretoken": token},
                 headers={"Referer": f"{stack.web_url}/admin/login/"})
    page = session.get(f"{stack.web_url}/capacity/clusters/default/gpu-map/", timeout=30)
    assert page.status_code == 200 and "/admin/login/" not in page.url
    for node in ("n1", "n2", "n3"):
        assert node in page.text


def test_every_process_runs_as_uid_10001_on_a_read_only_root(stack):
    for name in ("web", "worker-beat", "worker-sweep", "worker-apply", "worker-long", "beat", "simcluster"):
        assert stack.podman.exec(name, "id", "-u").stdout.strip() == "10001", name
        refused = stack.podman.exec(name, "touch", "/app/written")
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr, name
    # writable only where the manifests mount an emptyDir: web /app/var and /tmp, beat /tmp alone
    assert stack.podman.exec("web", "touch", "/app/var/written", "/tmp/written").returncode == 0
    assert stack.podman.exec("beat", "touch", "/tmp/written").returncode == 0
    assert "Read-only file system" in stack.podman.exec("beat", "touch", "/app/var/written").stderr


DEFRAG_START = """
from capacity.defrag.services import defrag_discover, defrag_job_start
from clusters.services import cluster_resolve
cluster = cluster_resolve()
job = defrag_job_start(cluster=cluster, node_name="{node}", plan=defrag_discover(cluster=cluster, node_name="{node}"),
                       poll_interval_seconds=0.5)
print(job.pk)
"""


def test_a_defrag_job_started_from_the_panel_reaches_safe_on_the_long_worker(stack):
    from defrag_cluster import Kube

    kube = Kube(str(stack.kubeconfig))
    node = kube.node_with_pods()
    started = stack.manage("shell", "-c", DEFRAG_START.format(node=node))
    assert started.returncode == 0, started.stderr
    job_id = int(started.stdout.split()[-1])
    stack.wait_for(lambda: stack.sql("SELECT state FROM capacity_defragjob WHERE id = %s", job_id) == [("safe",)],
                   f"defrag job {job_id} reaches safe")
    assert kube.node_cordoned(node)
    assert "capacity.tasks.defrag_job_run" in stack.podman.log("worker-long")
    # The pool processes' counters, merged through PROMETHEUS_MULTIPROC_DIR on the /tmp tmpfs.
    stepped = 'gpu_capacity_task_duration_seconds_count{state="SUCCESS",task="capacity.tasks.defrag_job_run"}'
    stack.wait_for(lambda: stepped in (worker_metrics(stack, "worker-long") or ""),
                   "the long worker counts its defrag steps")


def worker_metrics(stack, worker: str) -> str | None:
    """The worker's /metrics text; None while it does not answer 200."""
    try:
        answer = requests.get(f"http://127.0.0.1:{stack.metrics_ports[worker]}/metrics", timeout=5)
    except requests.RequestException:
        return None
    return answer.text if answer.status_code == 200 else None


def test_every_worker_serves_its_metrics_on_the_manifests_port_variable(stack):
    # A family shows once a process of the worker counted something: the body may be empty.
    for worker in stack.metrics_ports:
        stack.wait_for(lambda: worker_metrics(stack, worker) is not None, f"{worker} answers /metrics with 200")


def test_the_beat_workers_fan_out_runs_each_clusters_reconcile_on_the_sweep_worker(stack):
    called = stack.podman.exec("web", "celery", "-A", "config", "call", "orgs.tasks.scale_to_zero_reconcile")
    assert called.returncode == 0, called.stderr
    succeeded = re.compile(r"Task orgs\.tasks\.scale_to_zero_reconcile_cluster\[[^]]+\] succeeded")
    stack.wait_for(lambda: succeeded.search(stack.podman.log("worker-sweep")), "the sweep worker ran the reconcile")
    assert re.search(r"Task orgs\.tasks\.scale_to_zero_reconcile\[[^]]+\] succeeded", stack.podman.log("worker-beat"))


def test_a_dormant_orgs_scale_to_zero_runs_on_the_apply_worker(stack):
    from defrag_cluster import Kube

    assert stack.sql("UPDATE orgs_org SET last_activity_at = now() - interval '25 hours' WHERE slug = 'acme'") == 1
    swept = stack.manage("sweep_dormancy", "--queue")
    assert swept.returncode == 0 and "1 org(s) turned dormant" in swept.stdout, swept.stdout + swept.stderr
    stack.wait_for(lambda: stack.sql("SELECT count(*) FROM orgs_dormancyswitch WHERE applied_at IS NOT NULL")[0][0],
                   "the switch to dormant is applied")
    service = Kube(str(stack.kubeconfig)).custom.get_namespaced_custom_object(
        "serving.knative.dev", "v1", "acme", "services", "pynode")
    assert service["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"
    assert "orgs.tasks.org_scale_to_zero_apply" in stack.podman.log("worker-apply")


def test_beat_installs_the_schedule_and_sends_what_is_due(stack):
    installed = {name for (name,) in stack.sql("SELECT name FROM django_celery_beat_periodictask")}
    assert {periodic.name for periodic in SCHEDULES} <= installed
    # the shortest interval (defrag jobs resume, 10 s) comes due while the stack runs
    stack.wait_for(lambda: "Sending due task capacity: defrag jobs resume" in stack.podman.log("beat"),
                   "beat sends the defrag resume")
    assert stack.podman.running("beat")


def test_every_package_of_the_tree_is_in_the_image_and_nothing_of_development(stack):
    from containers import ROOT

    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
    assert {"audit", "savings", "capacity", "orgs", "simcluster"} <= set(packages)
    imported = stack.podman.exec("web", "python", "-c", f"import {', '.join(packages)}; print('imported')")
    assert imported.stdout.strip() == "imported", imported.stderr
    for absent in ("tests", ".git", ".venv", "docs", "bench", "var/db.sqlite3", ".env"):
        assert stack.podman.exec("web", "test", "-e", f"/app/{absent}").returncode == 1, absent
