"""An operator's database, migrated by the release before the upgrade work and holding rows
in every table, migrates forward with `manage.py migrate` and the product reads it as a
user would: a defrag job left mid-protocol resumes and reaches safe, a prune decision that
scaled a Deployment down is restored from its stored state, the savings page adds the
rows up, every admin page opens, and the beat schedule keeps the operator's tuning.

The release's migration leaves are recorded in `release_2026_11.json`: the database is
migrated back to them (third-party apps stay at what is installed), filled through the
historical models of that state, then migrated to whatever is latest, so the test keeps
proving the upgrade as migrations are added after the release.

It runs in a PostgreSQL database of its own: a copy of this process's test database
(already migrated: copying it takes a fraction of the seconds migrating an empty one
does), emptied, which Django's default connection points at for the test only, so the
shared test database stays at the latest migration whatever happens here. Migrating back
needs the migrations added after the release to be reversible, as
tests/audit/test_migrations.py already does.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from datetime import timedelta
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.apps import apps as global_apps
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.management import create_permissions
from django.contrib.contenttypes.management import create_contenttypes
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.urls import reverse

RELEASE_FILE = Path(__file__).with_name("release_2026_11.json")
RELEASE = json.loads(RELEASE_FILE.read_text())
# The tables the product fills besides its own apps' (config/schedule.py installs the beat's).
THIRD_PARTY_FILLED = ("django_celery_beat",)

NS_MODEL, NS_PYNODE, NS_BATCH = "org-a", "org-b", "org-c"
SERVICE = "mistral-7b"
H100 = "NVIDIA-H100-80GB-HBM3"


def project_apps() -> set[str]:
    """Labels of the apps that live in this repository (not in site-packages)."""
    root = Path(settings.BASE_DIR).resolve()
    return {c.label for c in global_apps.get_app_configs()
            if Path(c.path).resolve().is_relative_to(root) and "site-packages" not in Path(c.path).parts}


# ---- the recorded release --------------------------------------------------------------------

def test_every_migration_the_release_applied_is_still_on_disk():
    """A database at the release has these rows in django_migrations: delete or squash one
    away and `migrate` can no longer place that database in the graph."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    problems = []
    for app, leaf in RELEASE["leaves"].items():
        if (app, leaf) in loader.disk_migrations:
            continue
        squashes = [f"{key[0]}.{key[1]}" for key, m in loader.disk_migrations.items()
                    if (app, leaf) in (m.replaces or ())]
        problems.append(f"{app}.{leaf}" + (f" (replaced by {', '.join(squashes)})" if squashes else " (deleted)"))
    assert not problems, (
        f"Migrations applied by release {RELEASE['release']} ({RELEASE_FILE.name}) are gone: {'; '.join(problems)}. "
        "Databases migrated by that release record them in django_migrations, so they must stay on disk (with "
        "their ancestors) until no supported installation is older; restore them, or record a newer release "
        "file once upgrades from this one are no longer supported.")
    unknown = set(RELEASE["leaves"]) - project_apps()
    assert not unknown, f"{RELEASE_FILE.name} names apps that are not this project's: {sorted(unknown)}"


# ---- a database of its own -------------------------------------------------------------------

@pytest.fixture
def release_database(transactional_db):
    """Point the default connection, for the test, at an emptied copy of the test database."""
    from clusters.kube import forget_gateways
    from django.contrib.contenttypes.models import ContentType

    connection = connections["default"]
    assert connection.vendor == "postgresql", (
        "the upgrade test needs PostgreSQL (production's database); the tests start one (tests/pgserver.py)")
    original = connection.settings_dict["NAME"]
    name = f"{original}_upgrade"

    def recreate(*, create: bool) -> None:
        # Django's own way to reach the server outside the test database (it creates that one so).
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if create:
                cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{original}"')

    connection.close()   # IMPORTANT: before the copy: PostgreSQL copies no database in use
    recreate(create=True)
    connection.settings_dict["NAME"] = name
    # No row of the earlier tests (the schedules, content types and permissions their
    # `migrate` wrote): the release's own are written below.
    call_command("flush", interactive=False, verbosity=0, inhibit_post_migrate=True)
    ContentType.objects.clear_cache()   # its ids are the other database's
    try:
        yield name
    finally:
        forget_gateways()
        connection.close()
        connection.settings_dict["NAME"] = original
        ContentType.objects.clear_cache()
        recreate(create=False)


def migrate_to_release():
    """Migrate the empty database to the release: the product's apps to the recorded leaves,
    the others to what is installed, then content types and permissions of that state (the
    post-migrate work the release's `migrate` did). Returns the historical apps."""
    connection = connections["default"]
    executor = MigrationExecutor(connection)
    ours = project_apps()
    targets = [(app, leaf) for app, leaf in RELEASE["leaves"].items()]
    targets += [node for node in executor.loader.graph.leaf_nodes() if node[0] not in ours]
    # An app of the project the release did not have: none of its tables yet.
    born_since = {app for app, _ in executor.loader.graph.leaf_nodes() if app in ours} - set(RELEASE["leaves"])
    executor.migrate(targets + [(app, None) for app in sorted(born_since)])
    old = executor.loader.project_state(targets).apps
    for config in global_apps.get_app_configs():
        create_contenttypes(config, verbosity=0, using=connection.alias, apps=old)
        create_permissions(config, verbosity=0, using=connection.alias, apps=old)
    return old


# ---- the cluster the rows describe -----------------------------------------------------------

def _node(name: str, *, pool: str, cordoned: bool = False) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": H100, "karpenter.sh/nodepool": pool,
                                                  "kubernetes.io/hostname": name}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"},
                       "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _gpu_spec(gpus: int, pool: str) -> dict:
    return {"nodeSelector": {"karpenter.sh/nodepool": pool},
            "containers": [{"name": "model", "image": "registry.example.com/model:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                          "requests": {"nvidia.com/gpu": str(gpus)}}}]}


def _ksvc(name: str, namespace: str, *, min_scale: int, gpus: int, pool: str) -> dict:
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": str(min_scale),
                                                               "autoscaling.knative.dev/max-scale": "10"}},
                                  "spec": _gpu_spec(gpus, pool)}}}


def scenario() -> list[dict]:
    """Three H100 nodes serving org-a's model (3 replicas of 1 GPU), one node for org-b's
    pynode and org-c's batch Deployment (scaled to zero by the pruner), and a node a
    defrag job drained two hours ago, still cordoned."""
    batch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "batch", "namespace": NS_BATCH},
             "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "batch"}},
                      "template": {"metadata": {"labels": {"app": "batch"}}, "spec": _gpu_spec(1, "shared")}}}
    return ([_node(f"h100-{i}", pool="h100") for i in (1, 2, 3)]
            + [_node("shared-1", pool="shared"), _node("h100-9", pool="h100", cordoned=True)]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
               for ns in (NS_MODEL, NS_PYNODE, NS_BATCH)]
            + [_ksvc(SERVICE, NS_MODEL, min_scale=3, gpus=1, pool="h100"),
               _ksvc("llama", NS_PYNODE, min_scale=1, gpus=2, pool="shared"), batch])


@dataclass
class SimCluster:
    """The running simulated cluster, and the official client an operator reads it with."""

    server: object
    kubeconfig: str
    control: object
    core: object
    apps: object

    def now(self):
        return self.server.sim.clock.now()


@pytest.fixture
def cluster(tmp_path):
    """The simulated cluster (manual clock), settled: every pod Running and Ready."""
    import kubernetes.client
    import kubernetes.config

    from simcluster.control import SimControl
    from simcluster.testing import ClusterServer

    kubeconfig = str(tmp_path / "kubeconfig")
    server = ClusterServer(scenario(), kubeconfig_out=kubeconfig)
    server.start()
    try:
        control = SimControl(server.url)
        control.advance(60)
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        api = kubernetes.client.ApiClient(config)
        yield SimCluster(server=server, kubeconfig=kubeconfig, control=control,
                         core=kubernetes.client.CoreV1Api(api), apps=kubernetes.client.AppsV1Api(api))
    finally:
        server.stop()


def model_pods_by_node(cluster) -> dict[str, list]:
    pods: dict[str, list] = {}
    for pod in cluster.core.list_namespaced_pod(NS_MODEL).items:
        if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
            pods.setdefault(pod.spec.node_name, []).append(pod)
    return pods


# ---- the release's rows -----------------------------------------------------------------------

def fill(old, cluster, *, now, sim_now) -> dict:
    """A row in every table, as the release's code would have written them. Returns ids and
    names the checks read. `now` is wall-clock time (the panel's), `sim_now` the cluster's."""
    get = old.get_model
    User = get("auth", "User")
    ops = User.objects.create(username="ops", is_staff=True, is_superuser=True, email="ops@example.com")
    viewer = User.objects.create(username="viewer", is_staff=True)
    group = get("auth", "Group").objects.create(name="on-call")
    viewer.groups.add(group)

    row = get("clusters", "Cluster").objects.create(
        name="east", kubeconfig_path=cluster.kubeconfig, knative_version="1.15.2", versions_seen_at=now,
        api_groups={"serving.knative.dev": ["v1"], "apps": ["v1"]}, api_groups_seen_at=now,
        knative_lever="podautoscaler", knative_lever_reason="Knative 1.15 reads the PodAutoscaler annotation")

    Org = get("orgs", "Org")
    acme = Org.objects.create(slug="acme", cluster=row, namespace=NS_MODEL, last_activity_at=now,
                              applied="disabled", reconciled_at=now)
    beta = Org.objects.create(slug="beta", cluster=row, namespace=NS_PYNODE, last_activity_at=now - timedelta(hours=2),
                              applied="disabled", reconciled_at=now)
    gamma = Org.objects.create(slug="gamma", cluster=row, namespace=NS_BATCH, last_activity_at=now,
                               snoozed_until=now - timedelta(days=1), exemption_reason="quarter close (over)")
    get("orgs", "WorkloadExemption").objects.create(
        org=acme, kind="inferenceservice", name="llama-eval", reason="eval suite runs nightly", created_at=now,
        created_by=ops)
    get("orgs", "ActivityToken").objects.create(caller="gateway", digest=hashlib.sha256(b"t0k3n").hexdigest(),
                                                user=ops)
    # beta's pynode slept 5 h ago and woke 2 h ago: 1 replica x 2 GPUs x 3 h freed by dormancy.
    Switch = get("orgs", "DormancySwitch")
    for at, direction, cause, floor in ((now - timedelta(hours=5), "dormant", "sweep", ("1", "0")),
                                        (now - timedelta(hours=2), "active", "activity", ("0", "1"))):
        Switch.objects.create(org=beta, at=at, direction=direction, cause=cause, applied_at=at,
                              patched=[f"ksvc {NS_PYNODE}/llama: {floor[0]} -> {floor[1]}"])
        setting = ("disabled", "enabled") if direction == "dormant" else ("enabled", "disabled")
        get("audit", "AuditEntry").objects.create(
            app="orgs", at=at, action="scale_to_zero_applied", org=beta, cluster=row,
            cause=f"became {direction} ({cause})", target=f"Org/{beta.slug}",
            old={f"ksvc {NS_PYNODE}/llama": floor[0], "setting": setting[0]},
            new={f"ksvc {NS_PYNODE}/llama": floor[1], "setting": setting[1]})

    # A defrag job the release left mid-protocol: its node cordoned (recorded), the pod to
    # move not orphaned yet, its worker gone (lease lapsed) during the upgrade.
    by_node = model_pods_by_node(cluster)
    node = next((n for n, pods in sorted(by_node.items()) if len(pods) == 1), None)
    assert node, f"the scenario should leave a node with one model pod: {by_node}"
    (pod,) = by_node[node]
    cluster.core.patch_node(node, {"spec": {"unschedulable": True}})
    replicaset = next(o.name for o in pod.metadata.owner_references if o.kind == "ReplicaSet")
    revision_name = pod.metadata.labels["serving.knative.dev/revision"]
    started = sim_now - timedelta(minutes=2)
    Job = get("capacity", "DefragJob")
    job = Job.objects.create(
        cluster=row, node_name=node, state="cordoned", version=3, log_seq=2, created_at=started,
        started_at=started, cordoned_by_job=True, cordon_intent_at=started, requested_by=ops, operator=ops,
        lease_owner="task:3f0c-dead-worker", lease_expires_at=sim_now - timedelta(seconds=30),
        heartbeat_at=sim_now - timedelta(seconds=60),
        report={"node": node, "gpu_product": H100, "unschedulable": False,
                "pods": [{"namespace": NS_MODEL, "name": pod.metadata.name, "uid": pod.metadata.uid, "gpus": 1,
                          "phase": "Running", "role": "model", "reason": "", "revision": revision_name,
                          "replicaset": replicaset, "owner_chain": [f"ReplicaSet/{replicaset}"]}],
                "revisions": [{"namespace": NS_MODEL, "revision": revision_name, "replicaset": replicaset,
                               "kpa_scale": 3, "replicas": 3, "pods": [pod.metadata.name], "overprovision": 1}],
                "lines": ["Found pods to defrag:"]})
    Line = get("capacity", "DefragLogLine")
    Line.objects.create(job=job, seq=1, text="Recorded 1 revision(s)")
    Line.objects.create(job=job, seq=2, text=f"Node {node} has been cordoned (marked unschedulable).")
    revision = get("capacity", "DefragRevision").objects.create(
        job=job, namespace=NS_MODEL, revision=revision_name, replicaset=replicaset, initial_kpa_scale=3,
        initial_replicas=3, overprovision=1)
    get("capacity", "DefragOrphan").objects.create(job=job, revision=revision, namespace=NS_MODEL,
                                                   pod_name=pod.metadata.name, uid=pod.metadata.uid, gpus=1)
    Entry = get("audit", "AuditEntry")
    Entry.objects.create(app="defrag", at=started, action="node_cordon", actor=ops, target=f"Node/{node}",
                         cluster=row, subject_type="defrag_job", subject_id=job.pk,
                         old={"unschedulable": False}, new={"unschedulable": True})
    # h100-9 drained 2 h ago and still cordoned: its 8 GPUs freed since.
    Job.objects.create(
        cluster=row, node_name="h100-9", state="drained", created_at=now - timedelta(hours=3),
        started_at=now - timedelta(hours=3), safe_at=now - timedelta(hours=2, minutes=30),
        finished_at=now - timedelta(hours=2), report={"pods": [{"namespace": NS_MODEL, "name": "p", "gpus": 2}]})

    # The pruner scaled org-c's batch Deployment (1 GPU) to zero an hour ago; an earlier
    # decision (2 GPUs, 4 h ago) was restored an hour ago.
    deployment = cluster.apps.read_namespaced_deployment("batch", NS_BATCH)
    Run = get("pruning", "PruneRun")
    run = Run.objects.create(cluster=row, actor="", mode="scale-down", status="succeeded",
                             evaluated_at=now - timedelta(hours=1), duration_seconds=2.5,
                             parameters={"window_minutes": 30, "threshold": 0.05}, query="max_over_time(...)",
                             pods_seen=5, busy_pods=4, idle_candidates=1, planned=1, acted=1,
                             skip_counts={"too-young": 1},
                             notes=["knative-serving/config-autoscaler allows a zero initial scale"])
    Decision = get("pruning", "PruneDecision")
    restorable = Decision.objects.create(
        run=run, namespace=NS_BATCH, pod="batch-5d9c7b-x2kqp", owner_kind="Deployment", owner_api_version="apps/v1",
        owner_name="batch", owner_uid=deployment.metadata.uid, gpus=["GPU-9"], max_utilization=0.0,
        decision="prune", reason="idle", method="scale", effect="replicas 1 -> 0", result="succeeded",
        event_sent=True, restore_state={"replicas": 1}, applied_state={"replicas": 0},
        acted_at=now - timedelta(hours=1))
    Decision.objects.create(run=run, namespace=NS_MODEL, pod="young-1", count=1, pods=["young-1"],
                            decision="skip", reason="too-young")
    earlier = Run.objects.create(cluster=row, mode="scale-down", status="succeeded",
                                 evaluated_at=now - timedelta(hours=4))
    Decision.objects.create(run=earlier, namespace=NS_BATCH, pod="train-1", owner_kind="Deployment",
                            owner_name="train", gpus=["GPU-1", "GPU-2"], decision="prune", reason="idle",
                            method="scale", result="succeeded", restore_state={"replicas": 1},
                            applied_state={"replicas": 0}, acted_at=now - timedelta(hours=4), restore="restored",
                            restored_at=now - timedelta(hours=1), restored_by="ops")
    Entry.objects.create(app="pruning", at=now - timedelta(hours=1), action="workload_scale_down",
                         target=f"Deployment {NS_BATCH}/batch", cluster=row, org=gamma,
                         subject_type="prune_decision", subject_id=restorable.pk,
                         old={"replicas": 1}, new={"replicas": 0})

    get("capacity", "BinpackRun").objects.create(
        cluster=row, started_at=now - timedelta(minutes=5), finished_at=now - timedelta(minutes=5), state="done",
        trigger="schedule", planned=1, written=1, formula="gpus_free_on_node",
        changes=[{"pod": f"{NS_MODEL}/x", "node": "h100-1", "old": None, "new": 100, "result": "written"}])
    served = get("capacity", "ServedModel").objects.create(
        cluster=row, namespace=NS_MODEL, name=SERVICE, kind="pynode", model=SERVICE, framework="vllm", org=acme,
        org_slug="acme", knative_service=SERVICE, ready=True, gpus_held=3, synced_at=now,
        revisions=[{"name": revision_name, "created": "2026-11-20T09:00:00Z", "ready": True, "pods_running": 3,
                    "pods_pending": 0, "gpus_held": 3, "pending_for_gpus": 0}])
    get("capacity", "ResourceSpec").objects.create(cluster=row, model=SERVICE, gpu_count=1, memory_request="32Gi",
                                                   created_at=now - timedelta(days=1), created_by=ops)
    get("capacity", "RunbookAction").objects.create(
        at=now - timedelta(days=1), actor=ops, cluster=row, action="model_redeploy", target=f"{NS_MODEL}/{SERVICE}",
        served_model=served, state="done", settled_at=now - timedelta(days=1), new={"stamp": "2026-11-25T10:00Z"})

    # The beat: one row still at an interval an earlier release installed (never tuned),
    # one an operator slowed down and paused, and an operator's own task on a crontab.
    Interval = get("django_celery_beat", "IntervalSchedule")
    Periodic = get("django_celery_beat", "PeriodicTask")
    Periodic.objects.create(name="capacity: defrag jobs resume", task="capacity.tasks.defrag_jobs_resume",
                            interval=Interval.objects.create(every=60, period="seconds"))
    Periodic.objects.create(name="orgs: dormancy sweep", task="orgs.tasks.dormancy_sweep", enabled=False,
                            interval=Interval.objects.create(every=7200, period="seconds"))
    crontab = get("django_celery_beat", "CrontabSchedule").objects.create(minute="0", hour="6", timezone="UTC")
    Periodic.objects.create(name="ops: morning prune report", task="pruning.tasks.prune_all_clusters",
                            crontab=crontab)
    solar = get("django_celery_beat", "SolarSchedule").objects.create(event="sunrise", latitude=52.37,
                                                                      longitude=4.89)
    Periodic.objects.create(name="ops: sunrise sweep", task="orgs.tasks.dormancy_sweep", solar=solar, enabled=False)
    clocked = get("django_celery_beat", "ClockedSchedule").objects.create(clocked_time=now + timedelta(days=2))
    Periodic.objects.create(name="ops: one-off registry sync", task="capacity.runbook.tasks.registry_sync_all_clusters",
                            clocked=clocked, one_off=True)
    get("django_celery_beat", "PeriodicTasks").objects.update_or_create(ident=1, defaults={"last_update": now})

    return {"job": job.pk, "node": node, "pod_uid": pod.metadata.uid, "revision": revision_name,
            "restorable": restorable.pk}


def empty_tables(old) -> list[str]:
    wanted = (set(RELEASE["leaves"]) | set(THIRD_PARTY_FILLED))
    return [model._meta.label for model in old.get_models()
            if model._meta.app_label in wanted and not model._meta.proxy and model._meta.managed
            and not model.objects.exists()]


# ---- the upgrade ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_database_of_the_release_migrates_forward_and_the_product_reads_it(release_database, cluster, client,
                                                                            monkeypatch):
    from config import clock

    # The panel's clock stands still at the time the rows were written: the savings of a
    # prune and a drain still under way then add up to whole hours, however slow the run.
    now = clock.now()
    monkeypatch.setattr(clock, "now", lambda: now)
    old = migrate_to_release()
    ids = fill(old, cluster, now=now, sim_now=cluster.now())
    assert not empty_tables(old), (
        f"tables of the release without a row: {empty_tables(old)}; fill() must write one in each, so their "
        "upgrade is proven")

    call_command("migrate", interactive=False, verbosity=0)

    from django.contrib.contenttypes.models import ContentType
    ContentType.objects.clear_cache()
    executor = MigrationExecutor(connections["default"])
    assert not executor.migration_plan(executor.loader.graph.leaf_nodes()), "the database is at the latest"

    fill_after_release(now=now)

    from django.contrib.auth.models import User
    client.force_login(User.objects.get(username="ops"))
    _the_defrag_job_resumes(cluster, client, ids)
    _the_savings_add_up(client)
    _the_prune_decision_restores(cluster, client, ids)
    _every_admin_page_opens(client)
    _the_beat_keeps_the_operators_schedule()


def fill_after_release(*, now) -> None:
    """A row in each table a migration after the release created (the release's database has
    none of them, so fill() cannot write one), written as the product writes it, so that every
    admin page still has a row to open."""
    from capacity.binpack.models import BinpackNodeFreed, BinpackRun
    from capacity.campaigns.models import (Campaign, CampaignNode, CampaignPolicy, CampaignProposal,
                                           CampaignRehearsal, NodeState)
    from capacity.campaigns.planning import CampaignMove, CampaignPlan
    from capacity.campaigns.planning import CampaignNode as PlannedNode
    from clusters.selectors import cluster_find
    from savings.services import gpu_price_set

    gpu_price_set(gpu_model=H100, price="2.50", actor=None, now=now, currency="USD")
    cluster = cluster_find(name="east")
    # The release's binpack run marked h100-1, which was then free for an hour: 8 GPU-hours.
    BinpackNodeFreed.objects.create(
        cluster=cluster, run=BinpackRun.objects.get(cluster=cluster), node="h100-1", marked_at=now - timedelta(hours=3),
        gpus=8, gpu_model=H100, workloads=[f"{NS_MODEL}/x"], freed_at=now - timedelta(hours=2),
        last_seen_free_at=now - timedelta(hours=1), ended_at=now - timedelta(hours=1),
        end_reason="held GPU pods again")
    plan = CampaignPlan(
        selector={"karpenter.sh/nodepool": "h100"}, goal=None, scoring="MostAllocated",
        nodes=(PlannedNode(node="h100-2", position=1, gpus=8, gpus_moved=1,
                           moves=(CampaignMove(pod=f"{NS_MODEL}/y", gpus=1, source="h100-2", to="h100-1"),),
                           why="its 1 pod (1 GPU) fits on h100-1 (1 GPU)"),),
        left_out=(), kept_empty=(), pool_nodes=2, pool_gpus=16, gpus_requested=4, lower_bound=1)
    CampaignProposal.objects.create(
        cluster=cluster, pool="h100", selector=dict(plan.selector), scoring=plan.scoring, computed_at=now,
        plan=plan.to_dict(), freed=plan.freed, gpus_freed=plan.gpus_freed, pods_moved=plan.pods_moved,
        lower_bound=plan.lower_bound)
    campaign = Campaign.objects.create(
        cluster=cluster, selector=dict(plan.selector), max_in_flight=1, state="aborted", plan=plan.to_dict(),
        created_at=now - timedelta(hours=1), finished_at=now - timedelta(minutes=50))
    CampaignNode.objects.create(campaign=campaign, node_name="h100-2", position=1, state=NodeState.ABORTED)
    CampaignRehearsal.objects.create(
        cluster=cluster, dump_path="/srv/dumps/east.json", dump_sha256="0" * 64, dump_nodes=2, dump_pods=4,
        selector=dict(plan.selector), max_in_flight=1, scoring=plan.scoring, state="failed", plan=plan.to_dict(),
        planned=plan.freed, error="the dump's pool has no GPU node", started_at=now - timedelta(hours=2),
        finished_at=now - timedelta(hours=2))
    CampaignPolicy.objects.create(cluster=cluster, selector="karpenter.sh/nodepool=h100")   # off, as by default


def _the_defrag_job_resumes(cluster, client, ids) -> None:
    """The resume beat finds the job (its worker's lease lapsed); stepped from its recorded
    state it orphans the pod, waits for the replacement and rests at safe."""
    from audit.selectors import entries_of_subject
    from capacity.defrag.models import DefragJob, JobState
    from capacity.defrag.services import defrag_job_step, defrag_jobs_due
    from clusters.kube import KubeGateway

    assert ids["job"] in defrag_jobs_due(now=cluster.now())
    gateway = KubeGateway.from_kubeconfig(cluster.kubeconfig, name="east", retry_attempts=3, backoff=0.0,
                                          sleep=lambda s: None)
    job = DefragJob.objects.get(pk=ids["job"])
    for _ in range(60):
        job = defrag_job_step(job=job, gateway=gateway, now=cluster.now())
        if job.state in (JobState.SAFE, JobState.BLOCKED, JobState.FAILED):
            break
        cluster.control.advance(5)
    assert job.state == JobState.SAFE, (job.state, job.log[-5:], job.error)
    assert job.log[:2] == ["Recorded 1 revision(s)", f"Node {ids['node']} has been cordoned (marked unschedulable)."]
    pod = next(p for p in cluster.core.list_namespaced_pod(NS_MODEL).items if p.metadata.uid == ids["pod_uid"])
    assert not pod.metadata.owner_references, "the pod is orphaned and keeps serving on the cordoned node"
    assert cluster.core.read_node(ids["node"]).spec.unschedulable
    serving = [p for p in cluster.core.list_namespaced_pod(
        NS_MODEL, label_selector=f"serving.knative.dev/revision={ids['revision']}").items
        if p.metadata.owner_references and p.status.phase == "Running"]
    assert len(serving) == 3 and ids["node"] not in {p.spec.node_name for p in serving}
    progress = client.get(f"/capacity/defrag-jobs/{job.pk}/progress.json")
    assert progress.status_code == 200 and progress.json()["state"] == "safe", progress.content
    actions = list(entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)
                   .values_list("action", flat=True))
    assert actions[0] == "node_cordon" and actions[-1] == "job_safe" and "pod_orphan" in actions


def _the_savings_add_up(client) -> None:
    """Dormancy 1 x 2 GPUs x 3 h, pruning 2 GPUs x 3 h + 1 GPU x 1 h (still down), the
    drained node 8 GPUs x 2 h, the node binpack freed 8 GPUs x 1 h: 37 GPU-hours."""
    rows = list(csv.DictReader(io.StringIO(
        client.get("/savings/clusters/east/savings.csv", {"days": "7"}).content.decode())))

    def hours(org, mechanism):
        return sum(float(r["gpu_hours"]) for r in rows if r["org"] == org and r["mechanism"] == mechanism)

    assert hours("beta", "dormancy") == pytest.approx(6.0, abs=0.01)
    assert hours("gamma", "pruning") == pytest.approx(7.0, abs=0.01)
    assert hours("(whole nodes)", "defrag/drain") == pytest.approx(16.0, abs=0.01)
    assert hours("(whole nodes)", "binpack") == pytest.approx(8.0, abs=0.01)
    page = client.get("/savings/clusters/east/")
    assert page.status_code == 200
    assert re.search(r'id="savings-total">37\.00<', page.content.decode())


def _the_prune_decision_restores(cluster, client, ids) -> None:
    """The restore's confirmation page reads the stored state; confirming scales it back."""
    from pruning.models import PruneDecision

    changelist = reverse("admin:pruning_prunedecision_changelist")
    form = {"action": "restore_selected", "_selected_action": [str(ids["restorable"])]}
    preview = client.post(changelist, form)
    assert preview.status_code == 200
    assert re.search(r'<ul id="restore-restored"><li>Deployment org-c/batch: back to .*replicas.*1',
                     preview.content.decode(), re.S)
    client.post(changelist, {**form, "confirm": "yes"})
    decision = PruneDecision.objects.get(pk=ids["restorable"])
    assert (decision.restore, decision.restored_by) == (PruneDecision.Restore.RESTORED, "ops")
    assert cluster.apps.read_namespaced_deployment("batch", NS_BATCH).spec.replicas == 1


def _every_admin_page_opens(client) -> None:
    """The changelist and the change page of every registered model, as a superuser."""
    from admin_interface.cache import del_cached_active_theme

    # The admin's theme row is made by the first page that finds none in the theme cache; an
    # earlier test in this process may have left its theme there.
    del_cached_active_theme()
    failures = []
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        status = client.get(changelist).status_code
        if status != 200:
            failures.append(f"{changelist}: {status}")
        first = model_admin.get_queryset(_request()).first()
        if first is None:
            failures.append(f"{opts.label}: no row to open (fill() writes one in every table)")
            continue
        change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[first.pk])
        status = client.get(change).status_code
        if status != 200:
            failures.append(f"{change}: {status}")
    assert not failures, failures


def _request():
    from django.contrib.auth.models import User
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = User.objects.get(username="ops")
    return request


def _the_beat_keeps_the_operators_schedule() -> None:
    from django_celery_beat.models import PeriodicTask

    from config.schedule import SCHEDULES

    rows = {t.name: t for t in PeriodicTask.objects.select_related("interval")}
    assert all(s.name in rows for s in SCHEDULES), "every schedule of config/schedule.py is installed"
    resume = rows["capacity: defrag jobs resume"]
    assert resume.interval.every == 10, "a row still at an earlier release's interval follows the new one"
    sweep = rows["orgs: dormancy sweep"]
    assert (sweep.interval.every, sweep.enabled) == (7200, False), "the operator's tuning is kept"
    assert {"ops: morning prune report", "ops: sunrise sweep", "ops: one-off registry sync"} <= set(rows)
