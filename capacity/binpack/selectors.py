"""Reads of binpack's records: the marks the periodic check judges, the freed records it
extends or ends, and the freed nodes the savings page counts."""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from capacity.binpack.freed import MARK_HORIZON, Mark, OpenFree
from capacity.binpack.models import BinpackNodeFreed, BinpackRun

if TYPE_CHECKING:
    from clusters.models import Cluster


def binpack_marks_pending(*, cluster: Cluster, now: datetime) -> list[Mark]:
    """Each node's latest mark by a run of `cluster` that wrote, made within MARK_HORIZON of
    `now`, unless a freed record already came of that mark (or of a later one)."""
    runs = (BinpackRun.objects.filter(cluster=cluster, dry_run=False, started_at__gte=now - MARK_HORIZON,
                                      started_at__lte=now)
            .exclude(marked=[]).order_by("-started_at", "-pk").values_list("pk", "started_at", "marked"))
    latest: dict[str, Mark] = {}
    for pk, started_at, marked in runs:
        for m in marked:
            if m["node"] not in latest:
                latest[m["node"]] = Mark(run_id=pk, marked_at=started_at, node=m["node"], gpus=int(m["gpus"]),
                                         gpu_model=m.get("gpu_model", ""), workloads=tuple(m.get("workloads", ())))
    if not latest:
        return []
    recorded = {(run, node) for run, node in BinpackNodeFreed.objects.filter(
        cluster=cluster, node__in=list(latest)).values_list("run_id", "node")}
    return [m for m in latest.values() if (m.run_id, m.node) not in recorded]


def binpack_frees_open(*, cluster: Cluster) -> list[OpenFree]:
    return [OpenFree(id=r.pk, node=r.node, workloads=tuple(r.workloads), last_seen_free_at=r.last_seen_free_at,
                     removed=r.removed_at is not None)
            for r in BinpackNodeFreed.objects.filter(cluster=cluster, ended_at__isnull=True).order_by("pk")]


def binpack_nodes_freed(*, cluster: Cluster, until: datetime, since: datetime | None = None) -> list[dict]:
    """The freed records of `cluster` that overlap [since, until], oldest first: node, run_id,
    gpus, gpu_model, freed_at, ended_at (None: free now), removed_at."""
    rows = BinpackNodeFreed.objects.filter(cluster=cluster, freed_at__lte=until)
    if since is not None:
        rows = rows.exclude(ended_at__lt=since)
    return list(rows.order_by("freed_at", "pk").values(
        "node", "run_id", "gpus", "gpu_model", "freed_at", "ended_at", "removed_at"))
