"""The periodic check of the nodes binpack marked: one reading of the cluster, judged by
`freed.freed_check`, recorded as `BinpackNodeFreed` rows the savings page counts.

Each record started or ended is audited (actor: the schedule). The check changes nothing
in the cluster. It is idempotent and survives a killed worker: its writes are one
transaction per reading, a record is unique per (run, node) and is ended (and audited)
only by the one update that finds it open, so a rerun, or a check of the same cluster
running at the same time, finds the records already made and adds nothing twice."""
from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import transaction

from audit.services import audit
from capacity.binpack import freed
from capacity.binpack.models import BinpackNodeFreed
from capacity.binpack.selectors import binpack_frees_open, binpack_marks_pending
from clusters import kube
from clusters.selectors import snapshot_take
from config import clock

if TYPE_CHECKING:
    from clusters.models import Cluster

logger = logging.getLogger(__name__)


def _when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S %Z}"


def binpack_freed_nodes_check(*, cluster: Cluster, gateway: kube.KubeGateway | None = None,
                              now: datetime | None = None) -> freed.FreedCheck | None:
    """Read `cluster` once and record which marked nodes are free now, which stay free, and
    which stopped being free. None (and no reading) when there is no mark to judge and no
    open record. A cluster that cannot be read raises its KubeError and records nothing."""
    now = now or clock.now()
    if not binpack_marks_pending(cluster=cluster, now=now) and not binpack_frees_open(cluster=cluster):
        return None
    snapshot = snapshot_take(gateway or kube.gateway_for(cluster), now=now)
    with transaction.atomic():
        check = freed.freed_check(snapshot, marks=binpack_marks_pending(cluster=cluster, now=snapshot.taken_at),
                                  open_=binpack_frees_open(cluster=cluster))
        at = check.taken_at
        for start in check.start:
            m = start.mark
            row, created = BinpackNodeFreed.objects.get_or_create(
                run_id=m.run_id, node=m.node,
                defaults={"cluster": cluster, "marked_at": m.marked_at, "gpus": m.gpus, "gpu_model": m.gpu_model,
                          "workloads": list(m.workloads), "freed_at": at, "last_seen_free_at": at,
                          "removed_at": at if start.removed else None})
            if created:
                state = "gone from the cluster" if start.removed else "with no GPU pod"
                audit(app="binpack", action="binpack_node_freed", at=at, actor=None, cluster=cluster,
                      target=f"Node/{m.node}", subject=("binpack_node_freed", row.pk),
                      cause=f"binpack run #{m.run_id} marked it to be emptied first at {_when(m.marked_at)}; seen "
                            f"{state} at {_when(at)} while its workloads still run elsewhere",
                      old={"node": m.node, "state": "holding GPU pods", "gpus": m.gpus},
                      new={"node": m.node, "state": f"free ({state})", "gpus": m.gpus,
                           "counted_from": at.isoformat()})
        for seen in check.seen:
            rows = BinpackNodeFreed.objects.filter(pk=seen.id, ended_at__isnull=True, last_seen_free_at__lt=at)
            rows.update(last_seen_free_at=at)
            if seen.removed:
                BinpackNodeFreed.objects.filter(pk=seen.id, removed_at__isnull=True).update(removed_at=at)
        for end in check.end:
            if not BinpackNodeFreed.objects.filter(pk=end.id, ended_at__isnull=True).update(
                    ended_at=end.at, end_reason=end.reason[:500]):
                continue     # ended by a check that ran meanwhile
            row = BinpackNodeFreed.objects.get(pk=end.id)
            audit(app="binpack", action="binpack_node_freed_ended", at=at, actor=None, cluster=cluster,
                  target=f"Node/{row.node}", subject=("binpack_node_freed", row.pk),
                  cause=f"no longer counted as freed by binpack: {end.reason}",
                  old={"node": row.node, "state": "free", "counted_from": row.freed_at.isoformat()},
                  new={"node": row.node, "state": "counted until", "counted_until": end.at.isoformat()})
    if check.changes:
        logger.info("binpack freed nodes on %s: %d seen free, %d ended, %d still free, %d marked and not free",
                    cluster, len(check.start), len(check.end), len(check.seen), check.waiting)
    return check
