"""The hourly dormancy sweep's costs, each against its floor measured in the same run.

    .venv/bin/python bench/orgs_sweep.py [--scales 1,5] [--runs 5]

1. One sweep (`orgs.services.dormancy_sweep`) of 20,000 orgs at 1x and 100,000 at 5x, of
   which 10 % go dormant, on PostgreSQL, against its honest floor: the least work that
   gives the same result with the libraries the product uses (psycopg through Django's
   connection, Celery). The floor is
     a. ONE statement: the dormancy rule in SQL (awake, idle since before the cutoff, scale
        to zero allowed, neither exempt nor snoozed), longest idle first up to the budget,
        the rule re-checked in the UPDATE's WHERE (so activity racing it wins, as in the
        sweep), the switches INSERTed with cause, actor and actor label, and the (org id,
        switch id, slug) of each read back, since the sweep names the orgs it marked and
        queues each switch's apply;
     b. after the commit, one apply task queued per switch, `apply_async` over ONE
        producer (Celery's cheapest way to queue a task message).
   The sweep does the same work: its read, its plan in Python (`orgs.planning`, the one
   statement of the rule, also shown by the dry run), its compare-and-set statement,
   and its queueing. Queueing goes to Celery's in-memory transport (no broker process;
   the messages are counted and purged after each run), so the figure is the product's
   own work, not a broker's round trips.
   Rows: the whole sweep against (a)+(b) (target ratio <= 2), and its database part
   (queueing left out on both sides) against (a). For scale only, the database part
   against one bare UPDATE of the same rows, which does LESS than the sweep must (no
   switch recorded, no hold checked, no budget, nothing read back): not a floor.
   Both sides run with Python's cyclic collector paused, as the sweep pauses it. Runs
   alternate between the measures (each floor next to its measure, before it in even runs and after
   it in odd ones, so each run has its own ratio), each on a table reset and vacuumed alike.
2. Kubernetes writes against the objects whose state really changes, on a small simulated
   cluster: a sweep, then a reconcile with nothing to do, then a wake-up.    target = 1

Needs PostgreSQL: BENCH_POSTGRES_URL, else the server on 127.0.0.1:5432, else a private
one started for the run (tests/pgserver.py, needs Debian's postgresql) and stopped after.
A throw-away database is created and dropped, and the temporary folder removed.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from _django import postgres_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _runs import Report, bench_arguments, per_run, scales_of  # noqa: E402


SERVER = postgres_server()
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
from config.actors import actor_label_current  # noqa: E402
from config.queues import APPLY  # noqa: E402
from orgs import tasks as org_tasks  # noqa: E402
from django.conf import settings  # noqa: E402

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


# The honest floor's database part (see the module's docstring, 1a): the rule, the budget,
# the marking, the switches and what the queueing needs, in one statement.
FLOOR_STATEMENT = """
WITH chosen AS (
    SELECT id FROM orgs_org
    WHERE NOT dormant AND scale_to_zero_allowed AND NOT exempt
      AND (snoozed_until IS NULL OR snoozed_until <= %(now)s) AND last_activity_at < %(cutoff)s
    ORDER BY last_activity_at, id LIMIT %(budget)s
), switched AS (
    UPDATE orgs_org o SET dormant = TRUE, dormant_since = %(now)s FROM chosen c
    WHERE o.id = c.id AND NOT o.dormant AND o.scale_to_zero_allowed AND NOT o.exempt
      AND (o.snoozed_until IS NULL OR o.snoozed_until <= %(now)s) AND o.last_activity_at < %(cutoff)s
    RETURNING o.id, o.slug
), recorded AS (
    INSERT INTO orgs_dormancyswitch (org_id, at, direction, cause, actor_id, actor_label, patched, errors)
    SELECT id, %(now)s, 'dormant', 'sweep', NULL, %(actor_label)s, '[]'::jsonb, '[]'::jsonb FROM switched
    RETURNING id, org_id
)
SELECT r.org_id, r.id, s.slug FROM recorded r JOIN switched s ON s.id = r.org_id"""


def queued_purge() -> int:
    """The apply messages waiting on the in-memory transport, removed; how many there were."""
    with celery_app.connection_for_write() as conn:
        return conn.default_channel.queue_purge(APPLY) or 0


def floor_queue(pairs: list[tuple[int, int]]) -> None:
    task = org_tasks.org_scale_to_zero_apply
    with celery_app.producer_or_acquire() as producer:
        for org_id, switch_id in pairs:
            task.apply_async(args=[org_id], kwargs={"switch_id": switch_id}, priority=services.NORMAL_PRIORITY,
                             producer=producer)


def timed_floor(now, *, queue: bool) -> tuple[float, int]:
    params = {"now": now, "cutoff": now - settings.ORGS_DORMANT_AFTER, "budget": settings.ORGS_SWEEP_BUDGET,
              "actor_label": actor_label_current()}
    started = time.perf_counter()
    gc.disable()   # as the sweep pauses the cyclic collector (orgs.services._cyclic_gc_paused)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(FLOOR_STATEMENT, params)
            rows = cursor.fetchall()
        if queue:
            floor_queue([(org_id, switch_id) for org_id, switch_id, _ in rows])
    finally:
        gc.enable()
    return time.perf_counter() - started, len(rows)


def timed_bare(now) -> tuple[float, int]:
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(BARE_UPDATE, [now, now - settings.ORGS_DORMANT_AFTER])
        count = cursor.rowcount
    return time.perf_counter() - started, count


def timed_sweep(now, *, queue: bool) -> tuple[float, int]:
    enqueue = services._enqueue_applies
    if not queue:
        services._enqueue_applies = lambda pairs: ""
    try:
        started = time.perf_counter()
        result = services.dormancy_sweep(now=now)
        elapsed = time.perf_counter() - started
    finally:
        services._enqueue_applies = enqueue
    assert DormancySwitch.objects.count() == len(result.switched)
    return elapsed, len(result.switched)


def bench_database(scale: int, runs: int, report: Report) -> None:
    orgs = BASE_ORGS * scale
    going = orgs // DORMANT_EVERY
    cluster = Cluster.objects.create(name=f"bench-db-{scale}", kubeconfig_path="/nonexistent")
    now = clock.now()
    populate(cluster, now, orgs)
    samples: dict[str, list[float]] = {k: [] for k in ("sweep", "floor", "sweep_db", "floor_db", "bare")}
    queued_purge()
    try:
        for run in range(runs):  # interleaved: a noisy neighbour hits all alike
            pairs = [(("floor", lambda: timed_floor(now, queue=True)), ("sweep", lambda: timed_sweep(now, queue=True))),
                     (("floor_db", lambda: timed_floor(now, queue=False)),
                      ("sweep_db", lambda: timed_sweep(now, queue=False)))]
            # Floor and measure swap places every other run: the second of two runs of
            # 10,000 queued messages finds the allocator's memory ready, which favours it.
            order = [m for pair in pairs for m in (pair if run % 2 == 0 else pair[::-1])]
            for key, measure in order + [("bare", lambda: timed_bare(now))]:
                reset()
                elapsed, count = measure()
                assert count == going, (key, count)
                waiting = queued_purge()
                assert waiting == (going if key in ("floor", "sweep") else 0), (key, waiting)
                samples[key].append(elapsed)
    finally:
        queued_purge()
        Org.objects.all().delete()
        cluster.delete()
    print(f"scale {scale}x: {orgs:,} orgs, {going:,} going dormant (one apply queued each), "
          f"PostgreSQL {connection.pg_version // 10000}, load average {os.getloadavg()[0]:.1f}", flush=True)
    report.add(scale, "1. sweep: read, plan, mark, record, queue", samples["sweep"],
               floor="one statement (rule, budget, mark, record, read back) + apply_async over one producer",
               floor_samples=samples["floor"], note=per_run(samples["sweep"], samples["floor"], target=2))
    report.add(scale, "1. sweep, database part (not queueing)", samples["sweep_db"],
               floor="the same one statement", floor_samples=samples["floor_db"],
               note=per_run(samples["sweep_db"], samples["floor_db"], target=2))
    report.add(scale, "1. sweep, database part, for scale only", samples["sweep_db"],
               floor="bare UPDATE of the same rows (does less: not a floor)", floor_samples=samples["bare"])


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
