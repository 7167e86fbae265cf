"""Reads for the pruner: views of the objects a plan needs (`pruning.reads` chooses how
they are read), the orgs that forbid scale to zero, and run records for the admin."""
from __future__ import annotations

from datetime import datetime

from clusters import kube
from clusters.selectors import namespace_version
from orgs.selectors import org_keeps_at_zero

from .actions import read_owner
from .planning import ObjectView, selector_requirements

KSERVE_NAMESPACE = "kserve"
KSERVE_STOP_SINCE = (0, 15)  # serving.kserve.io/stop is honoured from KServe 0.15 on


def _controller(meta: dict) -> tuple[str, str] | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("kind", ""), ref.get("name", "")
    return None


def object_view(obj: dict) -> ObjectView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    if replicas is None and obj.get("kind") in ("Deployment", "ReplicaSet", "StatefulSet"):
        replicas = 1  # the API default when unset
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    return ObjectView(
        kind=obj.get("kind", ""), namespace=meta.get("namespace", ""), name=meta.get("name", ""),
        uid=meta.get("uid", ""), annotations=meta.get("annotations") or {},
        labels=meta.get("labels") or {}, owner=_controller(meta), replicas=replicas,
        min_replicas=(spec.get("predictor") or {}).get("minReplicas"),
        selector=selector_requirements(spec.get("selector")),
        template_annotations=(template.get("metadata") or {}).get("annotations") or {})


def kserve_stop_supported(gateway: kube.KubeGateway) -> bool:
    """Whether this cluster's KServe honours `serving.kserve.io/stop` (>= 0.15).

    Unknown or unreadable versions answer False: `minReplicas: 0` works on every version."""
    version = namespace_version(gateway, KSERVE_NAMESPACE) or ""
    parts = version.lstrip("v").split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= KSERVE_STOP_SINCE
    except (ValueError, IndexError):
        return False


def prune_runs_recent(*, cluster, limit: int) -> list:
    """The cluster's newest prune runs, newest first."""
    from .models import PruneRun

    return list(PruneRun.objects.filter(cluster=cluster).order_by("-started_at")[:limit])


def utilization_history(*, prometheus, run, pods: list[tuple[str, str]], points: int = 60) -> dict:
    """(namespace, pod) -> [(unix time, utilization 0–1)] over the run's window: one range query."""
    from datetime import timedelta

    from .query import utilization_history_promql, workload_of

    if not pods:
        return {}
    window = int(run.parameters.get("window_seconds", 1800))
    scheme = run.parameters.get("label_scheme", "auto")
    step = max(window // points, 1)
    result = prometheus.query_range(utilization_history_promql(pods, label_scheme=scheme),
                                    start=run.evaluated_at - timedelta(seconds=window),
                                    end=run.evaluated_at, step=f"{step}s")
    out: dict[tuple[str, str], list] = {}
    for series in result:
        labels = series.get("metric", {})
        key = workload_of(labels, scheme)
        out.setdefault(key, []).extend((float(t), float(v)) for t, v in series.get("values", []))
    for values in out.values():
        values.sort()
    return out


def prune_actions_freeing(*, cluster, since: datetime) -> list[dict]:
    """Pods of owners the pruner scaled to zero (the action took effect) whose GPUs were still
    freed at or after `since`: not restored, or restored since. One dict per decision row:
    namespace, pod, owner_kind, owner_name, gpus (the GPU UUIDs seen), acted_at, restored_at
    (None while the owner stays scaled to zero)."""
    from django.db.models import Q

    from .models import PruneDecision

    rows = (PruneDecision.objects
            .filter(run__cluster=cluster, decision=PruneDecision.Decision.PRUNE,
                    result=PruneDecision.Result.SUCCEEDED, acted_at__isnull=False)
            .filter(Q(restored_at__isnull=True) | Q(restored_at__gte=since))
            .order_by("acted_at", "id")
            .values("namespace", "pod", "owner_kind", "owner_name", "gpus", "acted_at", "restore", "restored_at"))
    ended = (PruneDecision.Restore.RESTORED, PruneDecision.Restore.CHANGED)
    return [{**row, "restored_at": row["restored_at"] if row["restore"] in ended else None} for row in rows]


def restore_kept_asleep(decision, *, now: datetime) -> str:
    """Why the org of `decision`'s owner, as the cluster shows it now, keeps it at zero
    ("" when nothing does): what a restore then leaves asleep. Raises the gateway's KubeError
    when the owner cannot be read; the restore itself reads it again."""
    cluster = decision.run.cluster
    owner = read_owner(kube.gateway_for(cluster), decision.owner_kind, decision.namespace, decision.owner_name)
    return org_keeps_at_zero(cluster=cluster, workload=owner, now=now)
