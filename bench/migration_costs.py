"""What the migrations that run code over rows, or build an index on a large table, cost
per row on PostgreSQL: the figures their docstrings' `Cost at fleet size:` lines scale up.

    .venv/bin/python bench/migration_costs.py [--rows 100000]

For each such migration: a database of its own is migrated to the migration's parents,
its table filled with `--rows` rows (seed rows written through the historical models,
then doubled with INSERT … SELECT; one job per 500 log lines for the defrag log copy),
then the migration alone is applied and timed, as `manage.py migrate` applies it.
Prints seconds and rows per second; not a test (tests/upgrade/test_migration_costs.py
requires the docstrings).

Needs PostgreSQL: BENCH_POSTGRES_URL, else the server on 127.0.0.1:5432, else a private
one started for the run (tests/pgserver.py, needs Debian's postgresql) and stopped after.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
from _django import postgres_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SERVER = postgres_server()
DB_NAME = f"bench_migration_costs_{os.getpid()}"
_tmp = Path(tempfile.mkdtemp(prefix="migration-costs-bench-"))
atexit.register(shutil.rmtree, _tmp, ignore_errors=True)
os.environ["DATABASE_URL"] = f"{SERVER}/{DB_NAME}"
os.environ["VAR_DIR"] = str(_tmp)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)
os.environ.pop("KUBECONFIG", None)


def _admin() -> psycopg.Connection:
    return psycopg.connect(SERVER.replace("postgres://", "postgresql://", 1) + "/postgres", autocommit=True)


def _database_fresh() -> None:
    from django.db import connection

    connection.close()
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DB_NAME}"')


def _drop_database() -> None:
    from django.db import connection

    connection.close()
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


atexit.register(_drop_database)

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.db.migrations.executor import MigrationExecutor  # noqa: E402

AT = datetime(2026, 11, 1, tzinfo=timezone.utc)
SEED = 1000


def double_to(model, rows: int) -> int:
    """Copy the table onto itself until it holds at least `rows` rows (ids from its sequence)."""
    columns = ", ".join(f'"{f.column}"' for f in model._meta.concrete_fields if not f.primary_key)
    table = model._meta.db_table
    with connection.cursor() as cursor:
        while True:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            count = cursor.fetchone()[0]
            if count >= rows:
                return count
            cursor.execute(f'INSERT INTO "{table}" ({columns}) SELECT {columns} FROM "{table}" '
                           f'LIMIT {rows - count}')


def _cluster(apps):
    return apps.get_model("clusters", "Cluster").objects.create(name="east", kubeconfig_path="/nonexistent")


def org_audit_records(apps, rows):
    cluster = _cluster(apps)
    org = apps.get_model("orgs", "Org").objects.create(slug="acme", cluster=cluster, namespace="acme",
                                                       last_activity_at=AT)
    Record = apps.get_model("orgs", "AuditRecord")
    Record.objects.bulk_create(Record(at=AT + timedelta(seconds=i), action="scale_to_zero_applied", org=org,
                                      cause="became dormant (dormancy sweep)",
                                      old={"ksvc acme/llama": "1", "setting": "disabled"},
                                      new={"ksvc acme/llama": "0", "setting": "enabled"}) for i in range(SEED))
    return double_to(Record, rows)


def defrag_audit_rows(apps, rows):
    cluster = _cluster(apps)
    job = apps.get_model("capacity", "DefragJob").objects.create(cluster=cluster, node_name="gpu-1", state="drained",
                                                                 created_at=AT)
    Audit = apps.get_model("capacity", "DefragAudit")
    Audit.objects.bulk_create(Audit(job=job, at=AT, action="pod_orphan", target="Pod/acme/llama-1",
                                    old={"ownerReferences": [{"kind": "ReplicaSet", "name": "llama-rs"}]},
                                    new={"ownerReferences": []}) for _ in range(SEED))
    return double_to(Audit, rows)


def runbook_audit_rows(apps, rows):
    cluster = _cluster(apps)
    Audit = apps.get_model("capacity", "RunbookAudit")
    Audit.objects.bulk_create(Audit(at=AT, cluster=cluster, action="model_redeploy", target="acme/llama",
                                    new={"stamp": "2026-11-01T00:00:00Z"}) for _ in range(SEED))
    return double_to(Audit, rows)


def orgs_without_activity(apps, rows):
    cluster = _cluster(apps)
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO orgs_org (slug, namespace, cluster_id, last_activity_at, scale_to_zero_allowed, dormant,
                                  applied, drift, pending, last_error, mechanism, exempt, exemption_reason,
                                  created_at)
            SELECT 'org-' || g, 'org-' || g, %s, CASE WHEN g %% 10 = 0 THEN NULL ELSE %s END, TRUE, FALSE,
                   '', '[]', '[]', '', '', FALSE, '', %s
            FROM generate_series(1, %s) AS g""", [cluster.pk, AT, AT, rows])
    return rows


def defrag_job_logs(apps, rows):
    cluster = _cluster(apps)
    Job = apps.get_model("capacity", "DefragJob")
    lines = [f"Pod acme/llama-{i} orphaned" for i in range(500)]   # the newest 500 lines were kept
    Job.objects.bulk_create(Job(cluster=cluster, node_name=f"gpu-{i}", state="drained", created_at=AT, log=lines)
                            for i in range(max(1, rows // 500)))
    return max(1, rows // 500) * 500


def prune_runs(apps, rows):
    cluster = _cluster(apps)
    Run = apps.get_model("pruning", "PruneRun")
    Run.objects.bulk_create(Run(cluster=cluster, mode="dry-run", status="succeeded", evaluated_at=AT,
                                parameters={"window_minutes": 30, "threshold": 0.05},
                                query="max_over_time(DCGM_FI_DEV_GPU_UTIL[30m])", pods_seen=50000)
                            for _ in range(SEED))
    return double_to(Run, rows)


CASES = (
    ("orgs", "0005_audit_records_to_audit_entries", "org audit records copied", org_audit_records),
    ("capacity", "0009_defrag_audit_to_audit_entries", "defrag audit rows copied", defrag_audit_rows),
    ("capacity", "0008_runbook_write_ahead_intent", "runbook audit rows settled", runbook_audit_rows),
    ("orgs", "0007_org_registered_active", "orgs (a tenth without activity)", orgs_without_activity),
    ("orgs", "0009_org_retired_history_protected", "orgs (retired columns, unique-in-service indexes)",
     orgs_without_activity),
    ("capacity", "0004_defrag_durable", "defrag log lines numbered", defrag_job_logs),
    ("pruning", "0002_write_ahead_leases_skip_counts", "prune runs (new columns, index)", prune_runs),
)


def measure(app: str, name: str, fill, rows: int) -> tuple[int, float]:
    _database_fresh()
    executor = MigrationExecutor(connection)
    parents = sorted(executor.loader.graph.node_map[(app, name)].parents, key=lambda n: n.key)
    executor.migrate([p.key for p in parents])
    executor.loader.build_graph()
    filled = fill(executor.loader.project_state([p.key for p in parents]).apps, rows)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    executor = MigrationExecutor(connection)
    began = time.perf_counter()
    executor.migrate([(app, name)])
    return filled, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table (default 100,000)")
    args = parser.parse_args()
    print(f"{'migration':<46} {'rows':>9} {'seconds':>8} {'rows/s':>9}  what")
    for app, name, what, fill in CASES:
        filled, seconds = measure(app, name, fill, args.rows)
        print(f"{app + '.' + name:<46} {filled:>9,} {seconds:>8.2f} {filled / seconds:>9,.0f}  {what}", flush=True)


if __name__ == "__main__":
    main()
