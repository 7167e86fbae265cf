"""Every periodic schedule of the product, declared here and nowhere else.

Each fires a task on the `beat` queue that reads the database and queues one task per
cluster (or per job) on the queue of its kind (config/queues.py); the dormancy sweep is
one SQL statement and queues one apply per org it marks.

`python manage.py install_schedules` (run by `migrate` too) writes them into
django-celery-beat, where operators may retune or disable them in the admin; an
installed row keeps the operator's interval and enabled flag (a row still at an interval
an earlier release installed follows the new one).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Periodic:
    name: str
    task: str
    every_seconds: int
    description: str
    priority: int | None = None
    # Intervals earlier releases installed this schedule with (seconds). An installed row
    # still at one of them was never tuned by an operator and moves to `every_seconds`.
    former_every_seconds: tuple[int, ...] = ()


SCHEDULES: tuple[Periodic, ...] = (
    Periodic(
        name="capacity: defrag jobs resume",
        task="capacity.tasks.defrag_jobs_resume",
        # 10 s: a whole worker killed leaves its message unacknowledged until the broker's
        # visibility timeout, so this beat is what picks its job up after the lease (30 s)
        # lapses: stepped again within 40 s of the kill. One indexed query when nothing is due.
        every_seconds=10,
        former_every_seconds=(60, 15),
        description="Re-queue every live defrag job no worker holds whose next check is due (a killed worker's "
                    "job is stepped again within 10 s of its 30 s lease lapsing).",
    ),
    Periodic(
        name="capacity: campaigns resume",
        task="capacity.tasks.campaigns_resume",
        # 10 s, as the defrag jobs' resume: a killed worker's campaign is stepped again within
        # 10 s of its 30 s lease lapsing.
        every_seconds=10,
        description="Re-queue every live consolidation campaign no worker holds whose next pass is due.",
    ),
    Periodic(
        name="orgs: dormancy sweep",
        task="orgs.tasks.dormancy_sweep",
        every_seconds=3600,
        description="Mark orgs idle for ORGS_DORMANT_AFTER as dormant and enable scale to zero.",
    ),
    Periodic(
        name="orgs: scale-to-zero reconcile",
        task="orgs.tasks.scale_to_zero_reconcile",
        every_seconds=600,
        description="Find and repair scale-to-zero settings that did not hold (drift): one task per cluster.",
    ),
    Periodic(
        name="orgs: scale-to-zero retry",
        task="orgs.tasks.scale_to_zero_retry",
        every_seconds=60,
        description="Apply again every org whose wanted scale-to-zero setting is not the applied one "
                    "(a lost queue message, a partial apply), one task per cluster with such orgs: "
                    "a wake lands within 2 minutes.",
    ),
    Periodic(
        name="clusters: API discovery",
        task="clusters.tasks.discovery_refresh_all",
        every_seconds=300,
        description="Read which API groups the product acts on each cluster serves (KServe, Knative, "
                    "Kubeflow, Kthena, metrics), one task per cluster; a group not served means no such workloads.",
    ),
    Periodic(
        name="pruning: idle-GPU prune",
        task="pruning.tasks.prune_all_clusters",
        every_seconds=180,
        description="Run the idle-GPU pruner on every cluster with a Prometheus (PRUNER_RUN_MODE; dry run by default).",
    ),
    Periodic(
        name="pruning: reconcile interrupted runs",
        task="pruning.tasks.prune_runs_reconcile",
        # 10 s: with the run's 30 s lease, a run whose worker died is completed within 40 s.
        every_seconds=10,
        former_every_seconds=(60,),
        description="Complete prune runs whose worker died (lease lapsed) from the cluster's real state, "
                    "so every scale-down that happened is recorded and restorable (within 10 s of the "
                    "run's 30 s lease lapsing).",
    ),
    Periodic(
        name="pruning: expire skip rows",
        task="pruning.tasks.prune_skip_rows_expire",
        every_seconds=3600,
        description="Delete prune skip rows older than PRUNER_SKIP_RETENTION_DAYS (runs keep their counts).",
    ),
    Periodic(
        name="capacity: binpack deletion costs",
        task="capacity.binpack.tasks.binpack_all_clusters",
        every_seconds=300,
        description="Write pod-deletion costs so scale-down frees whole GPU nodes; "
                    "only pods whose cost changes are patched.",
    ),
    Periodic(
        name="capacity: binpack freed nodes check",
        task="capacity.binpack.tasks.binpack_freed_check_all_clusters",
        # 120 s: a node binpack marked is seen free (or holding GPU pods again) within two
        # minutes, what the savings page counts from. A cluster with no mark in the last hour
        # and no node counted free now is not read.
        every_seconds=120,
        description="Read each cluster with nodes binpack marked to be emptied first and record which were "
                    "freed (no GPU pod, or removed), and when one holds GPU pods again: what the savings page "
                    "counts under binpack.",
    ),
    Periodic(
        name="capacity: GPU readings kept",
        task="capacity.gpumap.tasks.gpu_readings_keep",
        # 60 s: Prometheus scrapes /metrics every 30 s, and the GPUs per pool it exports come
        # from the cluster's kept reading (CAPACITY_MAP_CACHE_SECONDS, 15 s by default, plus
        # the refresh wait): a reading drawn each minute leaves no step of the savings page's
        # history without one. A cluster a page read within the setting is not read again.
        every_seconds=60,
        description="Read each cluster's GPUs (one list of nodes and pods) when no page has within "
                    "CAPACITY_MAP_CACHE_SECONDS, so the GPUs per pool on /metrics — the savings page's "
                    "allocated and idle history — have no gaps when no one views the map.",
    ),
    Periodic(
        name="capacity: model registry sync",
        task="capacity.runbook.tasks.registry_sync_all_clusters",
        every_seconds=300,
        description="Sync the model registry (InferenceServices, pynodes, revisions, blocked deployments).",
    ),
    Periodic(
        name="capacity: campaign proposals",
        task="capacity.campaigns.tasks.campaign_proposals_all",
        # 10 min: a proposal is advice the pages show with its age; reading a 5,000-node
        # cluster and planning each pool costs seconds per cluster on the sweep queue.
        every_seconds=600,
        description="Read each cluster once and propose the best campaign of every GPU pool (the nodes that can "
                    "be freed together, each pod moved once), shown on the dashboard and the GPU map.",
    ),
    Periodic(
        name="capacity: settle interrupted runbook actions",
        task="capacity.runbook.tasks.runbook_actions_settle_all",
        # 30 s: with the action's 60 s lease, an action whose process died is settled from the
        # cluster within 90 s, not at the next registry sync. One indexed query when none is due.
        every_seconds=30,
        description="Settle runbook actions left acting by a process that died (lease lapsed) from what the "
                    "cluster shows: done when the change is there, failed otherwise; nothing is sent twice.",
    ),
)
