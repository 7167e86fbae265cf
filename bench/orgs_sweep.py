"""The hourly dormancy sweep's costs, each against a floor measured in the same run.

    .venv/bin/python bench/orgs_sweep.py [--scales 1,5] [--runs 5]

1. Database work of one sweep (read, plan, mark and record: `orgs.services.dormancy_sweep`)
   for 20,000 orgs at 1x and 100,000 at 5x, of which 10 % go dormant, on PostgreSQL,
   against ONE bare equivalent UPDATE (same rows, same SET, nothing read back, nothing
   recorded).                                                             target ratio <= 2
   And against the least database work of the same result: that UPDATE and the INSERT
   of the switches it must record, in one statement, nothing read back.
   Queueing the cluster work on commit is broker work, not database work: it is left out
   (`_enqueue_apply` stubbed) so the figure is the database's. Runs alternate between the
   two, each on a table reset and vacuumed alike.
2. Kubernetes writes against the objects whose state really changes, on a small simulated
   cluster: a sweep, then a reconcile with nothing to do, then a wake-up.    target = 1

Needs PostgreSQL: BENCH_POSTGRES_URL, else the server on 127.0.0.1:5432, else a private
one started for the run (tests/pgserver.py, needs Debian's postgresql) and stopped after.
A throw-away database is created and dropped, and the temporary folder removed.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _runs import Report, bench_arguments, scales_of  # noqa: E402


def _postgres() -> str:
    """BENCH_POSTGRES_URL, else the server on 127.0.0.1:5432 when one answers, else a
    private server started as the tests start theirs (tests/pgserver.py), stopped at exit."""
    if os.environ.get("BENCH_POSTGRES_URL"):
        return os.environ["BENCH_POSTGRES_URL"].rstrip("/")
    try:
        psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
        return "postgres://postgres@127.0.0.1:5432"
    except psycopg.OperationalError:
        pass
    from tests.pgserver import start_private_postgres

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_private_postgres(port=port)
    atexit.register(server.stop)
    print(f"no PostgreSQL on 127.0.0.1:5432: started a private one on port {port}", flush=True)
    return server.url("postgres").rsplit("/", 1)[0]


SERVER = _postgres()
DB_NAME = f"bench_orgs_sweep_{os.getpid()}"
_tmp = Path(tempfile.mkdtemp(prefix="orgs-sweep-bench-"))
atexit.register(shutil.rmtree, _tmp, ignore_errors=True)   # a bench leaves nothing in /tmp
os.environ["DATABASE_URL"] = f"{SERVER}/{DB_NAME}"
os.environ["REDIS_URL"] = ""
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["VAR_DIR"] = str(_tmp)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)
os.environ.pop("KUBECONFIG", None)
os.environ["LOG_LEVEL"] = "ERROR"  # the eager tasks log each apply at INFO

BASE_ORGS = 20_000
DORMANT_EVERY = 10   # one org in ten is idle for 30 h: 10 % go dormant


def _admin() -> psycopg.Connection:
    return psycopg.connect(SERVER.replace("postgres://", "postgresql://", 1) + "/postgres", autocommit=True)


def _drop_database() -> None:
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


with _admin() as admin:
    admin.execute(f'CREATE DATABASE "{DB_NAME}"')
atexit.register(_drop_database)   # whatever ends the run (--help, an error), the database goes

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

from clusters import kube  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from config import clock  # noqa: E402
from config.celery import app as celery_app  # noqa: E402
from orgs import services  # noqa: E402
from orgs.models import DormancySwitch, Org  # noqa: E402
from clusters.labels import OWNER_MIN_SCALE  # noqa: E402
from orgs.planning import MIN_SCALE  # noqa: E402

BARE_UPDATE = ("UPDATE orgs_org SET dormant = TRUE, dormant_since = %s "
               "WHERE NOT dormant AND scale_to_zero_allowed AND last_activity_at < %s")


def populate(cluster: Cluster, now, orgs: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO orgs_org (slug, namespace, cluster_id, last_activity_at, scale_to_zero_allowed, dormant,
                                  dormant_since, applied, drift, last_error, reconciled_at, mechanism, created_at)
            SELECT 'org-' || g, 'org-' || g, %s,
                   %s - CASE WHEN g %% {DORMANT_EVERY} = 0 THEN interval '30 hours' ELSE interval '2 hours' END,
                   TRUE, FALSE, NULL, '', '[]'::jsonb, '', NULL, '', %s
            FROM generate_series(1, {orgs}) AS g""", [cluster.id, now, now])


def reset() -> None:
    """Back to every org active and no switches; vacuumed so each run starts alike."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orgs_org SET dormant = FALSE, dormant_since = NULL WHERE dormant")
        cursor.execute("DELETE FROM orgs_dormancyswitch")
        cursor.execute("VACUUM ANALYZE orgs_org")
        cursor.execute("VACUUM ANALYZE orgs_dormancyswitch")


# The same marking and the switches it must record, with the rule in SQL and nothing read
# back: what the sweep's database work costs at the least.
BARE_UPDATE_RECORDED = f"""
WITH switched AS ({BARE_UPDATE} RETURNING id)
INSERT INTO orgs_dormancyswitch (org_id, at, direction, cause, actor_id, actor_label, patched, errors)
SELECT id, %s, 'dormant', 'sweep', NULL, '', '[]'::jsonb, '[]'::jsonb FROM switched"""


def timed_bare(now, *, recorded: bool = False) -> tuple[float, int]:
    cutoff = now - timedelta(hours=24)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        if recorded:
            cursor.execute(BARE_UPDATE_RECORDED, [now, cutoff, now])
        else:
            cursor.execute(BARE_UPDATE, [now, cutoff])
        count = cursor.rowcount
    return time.perf_counter() - started, count


def timed_sweep(now) -> tuple[float, int]:
    started = time.perf_counter()
    result = services.dormancy_sweep(now=now)
    elapsed = time.perf_counter() - started
    assert DormancySwitch.objects.count() == len(result.switched)
    return elapsed, len(result.switched)


def bench_database(scale: int, runs: int, report: Report) -> None:
    orgs = BASE_ORGS * scale
    cluster = Cluster.objects.create(name=f"bench-db-{scale}", kubeconfig_path="/nonexistent")
    now = clock.now()
    populate(cluster, now, orgs)
    queued = []
    enqueue = services._enqueue_apply
    services._enqueue_apply = lambda org_id, switch_id, *, urgent: queued.append((org_id, switch_id))
    bare, bare_recorded, sweep = [], [], []
    try:
        for _ in range(runs):  # interleaved: a noisy neighbour hits all alike
            reset()
            elapsed, count = timed_bare(now)
            assert count == orgs // DORMANT_EVERY, count
            bare.append(elapsed)
            reset()
            elapsed, count = timed_bare(now, recorded=True)
            assert count == orgs // DORMANT_EVERY, count
            bare_recorded.append(elapsed)
            reset()
            queued.clear()
            elapsed, count = timed_sweep(now)
            assert count == orgs // DORMANT_EVERY and len(queued) == count and all(s for _, s in queued)
            sweep.append(elapsed)
    finally:
        services._enqueue_apply = enqueue
        Org.objects.all().delete()
        cluster.delete()
    print(f"scale {scale}x: {orgs:,} orgs, {orgs // DORMANT_EVERY:,} going dormant, "
          f"PostgreSQL {connection.pg_version // 10000}", flush=True)
    report.add(scale, "1. sweep: read, plan, mark + record", sweep, floor="one bare UPDATE", floor_samples=bare,
               note="target ratio <= 2")
    report.add(scale, "1. sweep (against marking + recording)", sweep,
               floor="bare UPDATE + INSERT of the switches, one statement", floor_samples=bare_recorded)


# --- Kubernetes writes on a small simulated cluster ----------------------------------------------
def small_scenario() -> list[dict]:
    objects = [{"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}}]
    for i in range(6):
        ns = f"org-{i}"
        objects.append({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns, "labels": {"capacity.io/org": ns}}})
        # org-1's pynode already holds min-scale 0 (someone set it): nothing to write there.
        objects.append({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                        "metadata": {"name": "pynode", "namespace": ns, "labels": {"capacity.io/component": "pynode"}},
                        "spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "0" if i == 1 else "1"}},
                                              "spec": {"containers": [{"image": "pynode:1"}]}}}})
        for model, floor in (("llm", 1), ("big", 2)):
            objects.append({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                            "metadata": {"name": model, "namespace": ns},
                            "spec": {"predictor": {"minReplicas": floor,
                                                   "model": {"modelFormat": {"name": "sklearn"}}}}})
        # A raw-deployment model cannot scale to zero: never written.
        objects.append({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                        "metadata": {"name": "raw", "namespace": ns,
                                     "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}},
                        "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}}}}})
    return objects


def min_scales(gw) -> dict[str, str | None]:
    """Every object scale to zero may write, with the min-scale it holds (and, for a pynode,
    the owner's value the product wrote down)."""
    state = {}
    for ksvc in gw.list(kube.KNATIVE_SERVICES):
        annotations = ksvc["spec"]["template"]["metadata"].get("annotations") or {}
        # The owner's own value, written down on the Service the first time the switch
        # changes or takes over its min-scale, is state the switch changes too.
        recorded = (ksvc["metadata"].get("annotations") or {}).get(OWNER_MIN_SCALE)
        state[f"ksvc {ksvc['metadata']['namespace']}/{ksvc['metadata']['name']}"] = (
            annotations.get(MIN_SCALE), recorded)
    for resource, kind in ((kube.REVISIONS, "revision"), (kube.PODAUTOSCALERS, "podautoscaler")):
        for obj in gw.list(resource):
            annotations = obj["metadata"].get("annotations") or {}
            state[f"{kind} {obj['metadata']['namespace']}/{obj['metadata']['name']}"] = annotations.get(MIN_SCALE)
    return state


def bench_writes() -> None:
    from simcluster.control import SimControl
    from simcluster.testing import ClusterServer

    kubeconfig = _tmp / "kubeconfig"
    server = ClusterServer(small_scenario(), kubeconfig_out=str(kubeconfig))
    server.start()
    try:
        control = SimControl(server.url)
        control.advance(0)
        cluster = Cluster.objects.create(name="bench-sim", kubeconfig_path=str(kubeconfig))
        services.orgs_sync(cluster=cluster, now=clock.now())
        Org.objects.filter(slug__in=["org-0", "org-1", "org-2", "org-3"]).update(
            last_activity_at=clock.now() - timedelta(hours=30))
        Org.objects.filter(slug="org-3").update(scale_to_zero_allowed=False)  # protected: stays warm
        gw = kube.gateway_for(cluster)
        celery_app.conf.task_always_eager = True
        print(f"2. Kubernetes writes, {Org.objects.count()} orgs x (1 pynode + 2 models + 1 raw model), Knative 1.21")

        def step(label: str, action) -> None:
            # Writes that Knative's own controllers then make (new revisions, PA copies) are
            # theirs, not ours: the count compares our writes with the objects they change.
            before = min_scales(gw)
            writes_before = gw.calls_total(("patch", "create", "replace", "delete"))
            action()
            writes = gw.calls_total(("patch", "create", "replace", "delete")) - writes_before
            after = min_scales(gw)
            changed = sorted(k for k in before if k.startswith(("ksvc", "revision")) and before[k] != after.get(k))
            verdict = "OK" if writes == len(changed) else "MISSED"
            ratio = f"{writes / len(changed):.2f}" if changed else ("1.00" if not writes else "inf")
            print(f"   {label:<38} writes {writes:3d}  objects changed {len(changed):3d}  ratio {ratio}  {verdict}")
            control.advance(0)

        step("sweep (3 orgs go dormant)", lambda: services.dormancy_sweep(now=clock.now()))
        step("reconcile, nothing drifted", lambda: services.orgs_reconcile(now=clock.now()))
        step("activity wakes org-0", lambda: services.org_mark_active(org_slug="org-0", cause="activity"))
        step("reconcile after the wake", lambda: services.orgs_reconcile(now=clock.now()))
    finally:
        celery_app.conf.task_always_eager = False
        kube.forget_gateways()
        server.stop()


def main() -> None:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args()
    scales = scales_of(args)
    report = Report("orgs_sweep", runs=args.runs)
    call_command("migrate", verbosity=0)
    try:
        for scale in scales:
            bench_database(scale, args.runs, report)
        report.print()
        bench_writes()
    finally:
        connections.close_all()
        _drop_database()


if __name__ == "__main__":
    main()
