"""Which Celery queue each task runs on, and why (the README's queue table says the same).

Four queues, so that work of one kind never waits behind work of another:

- `beat`: what beat fires itself. These tasks read the database and queue per-cluster
  work; none talks to a cluster, so a fan-out is never stuck behind a slow API server.
- `sweep`: one cluster's periodic read and repair (the scale-to-zero reconcile and retry,
  API discovery, the model registry sync, the check of the nodes binpack marked, the campaign proposals) and the GPU map's background refresh (a page
  found its reading older than CAPACITY_MAP_CACHE_SECONDS; one at a time per cluster).
  One task per cluster: a slow cluster holds one worker slot, the other clusters' sweeps
  go on in the others.
- `apply`: scale to zero enabled or disabled on one org. A wake is queued at a higher
  priority (orgs.services.HIGH_PRIORITY) and jumps the sleeps an hourly sweep queued,
  and never waits behind a cluster's reconcile read.
- `long`: the operations that run for seconds to a minute at fleet size: defrag steps,
  prune runs, binpack writes, settling runbook actions left acting. Completing the prune
  runs of a dead worker is fired by beat but reads the cluster, so it runs here too.

Durability is the same on every queue: acks_late and reject_on_worker_lost are the tasks'
defaults (config/settings.py), and the Redis transport's priority lanes and visibility
timeout are transport-wide, so they hold on each queue alike (tests/ops/test_queues.py).
"""
from __future__ import annotations

BEAT, SWEEP, APPLY, LONG = "beat", "sweep", "apply", "long"

# (queue, what runs there, why): the README's table.
QUEUES: tuple[tuple[str, str, str], ...] = (
    (BEAT, "the tasks beat fires: fan-outs (one task per cluster, per job), the dormancy sweep, "
           "skip-row expiry",
     "database only, never a cluster's API: a fan-out is never stuck behind a slow cluster"),
    (SWEEP, "per cluster: scale-to-zero reconcile and retry, API discovery, model registry sync, "
            "the GPU map's background refresh, the check of the nodes binpack marked, campaign proposals",
     "one task per cluster: one slow cluster holds one worker slot, not every cluster's sweep"),
    (APPLY, "scale to zero on one org (wake and sleep); a wake at a higher priority",
     "a wake jumps the sleeps a sweep queued and never waits behind a reconcile read"),
    (LONG, "defrag and campaign steps, prune runs and their completion, binpack writes, runbook settles",
     "seconds to a minute at fleet size: kept off the queues that must answer within their beat"),
)

# The queue earlier releases put every task on. A sweep worker drains it too, so a message
# queued before an upgrade (a defrag step's next check, an apply) still runs.
LEGACY = "celery"

_ROUTED: dict[str, tuple[str, ...]] = {
    BEAT: (
        "orgs.tasks.dormancy_sweep",
        "orgs.tasks.scale_to_zero_reconcile",
        "orgs.tasks.scale_to_zero_retry",
        "clusters.tasks.discovery_refresh_all",
        "pruning.tasks.prune_all_clusters",
        "pruning.tasks.prune_skip_rows_expire",
        "capacity.binpack.tasks.binpack_all_clusters",
        "capacity.binpack.tasks.binpack_freed_check_all_clusters",
        "capacity.runbook.tasks.registry_sync_all_clusters",
        "capacity.runbook.tasks.runbook_actions_settle_all",
        "capacity.tasks.defrag_jobs_resume",
        "capacity.campaigns.tasks.campaign_proposals_all",
        "capacity.tasks.campaigns_resume",
        "capacity.gpumap.tasks.gpu_readings_keep",
    ),
    SWEEP: (
        "orgs.tasks.scale_to_zero_reconcile_cluster",
        "orgs.tasks.scale_to_zero_retry_cluster",
        "clusters.tasks.discovery_refresh_cluster",
        "capacity.runbook.tasks.registry_sync_cluster",
        "capacity.gpumap.tasks.gpu_view_refresh",
        "capacity.gpumap.tasks.gpu_reading_keep",
        "capacity.binpack.tasks.binpack_freed_check_cluster",
        "capacity.campaigns.tasks.campaign_proposals_cluster",
    ),
    APPLY: (
        "orgs.tasks.org_scale_to_zero_apply",
    ),
    LONG: (
        "capacity.tasks.defrag_job_run",
        "capacity.tasks.campaign_run",
        "pruning.tasks.prune_cluster",
        "pruning.tasks.prune_runs_reconcile",
        "capacity.binpack.tasks.binpack_cluster",
        "capacity.runbook.tasks.runbook_actions_settle_cluster",
    ),
}

# Celery's task_routes: task name -> its queue. A task not named here goes to the default
# queue, SWEEP (config/settings.py), and tests/ops/test_queues.py fails until it is named.
ROUTES: dict[str, dict[str, str]] = {task: {"queue": queue} for queue, tasks in _ROUTED.items() for task in tasks}

ALL: tuple[str, ...] = tuple(name for name, _, _ in QUEUES)


def queue(name: str):
    """The kombu queue `name` on a direct exchange and routing key of its own name (what
    Celery makes of a queue it was not told of)."""
    from kombu import Exchange, Queue

    return Queue(name, Exchange(name, type="direct"), routing_key=name)
