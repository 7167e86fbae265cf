"""The Deployment controller, after pkg/controller/deployment (see KUBERNETES.md).

Each pass, per Deployment: claim its ReplicaSets by selector (adopt, keep, release), find
the ReplicaSet whose template matches the Deployment's (the "new" one, named
`<deployment>-<pod-template-hash>`, created when missing), then roll: RollingUpdate
scales the new ReplicaSet up within `maxSurge` and the old ones down within
`maxUnavailable`; Recreate scales the old ones to zero before the new one comes up.
Old ReplicaSets at zero beyond `revisionHistoryLimit` are deleted. Status sums the
ReplicaSets' status.
"""
from __future__ import annotations

from ..resources import DEPLOYMENTS, REPLICASETS
from ..store import copy
from ._util import (by_namespace, int_or_percent, is_deleting, owner_ref, record_event, set_condition,
                    template_hash, write_status)
from .replicaset import claim, selector_predicate

COMPONENT = "deployment-controller"
HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
DESIRED_ANNOTATION = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS_ANNOTATION = "deployment.kubernetes.io/max-replicas"


def _replicas(obj: dict) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _template_without_hash(template: dict | None) -> dict:
    """A ReplicaSet's template as its Deployment wrote it (EqualIgnoreHash)."""
    template = copy(template or {})
    labels = (template.get("metadata") or {}).get("labels")
    if labels:
        labels.pop(HASH_LABEL, None)
        if not labels:
            template["metadata"].pop("labels")
    if template.get("metadata") == {}:
        template.pop("metadata")
    return template


def _normalized(template: dict | None) -> dict:
    template = copy(template or {})
    if not template.get("metadata"):
        template.pop("metadata", None)
    return template


def _available(rs: dict) -> int:
    return int((rs.get("status") or {}).get("availableReplicas") or 0)


def _revision(rs: dict) -> int:
    try:
        return int((rs["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION, 0))
    except (TypeError, ValueError):
        return 0


def _surge_and_unavailable(deployment: dict) -> tuple[int, int]:
    """deploymentutil.ResolveFenceposts: maxSurge rounds up, maxUnavailable down; both 0
    would deadlock, so maxUnavailable becomes 1."""
    wanted = _replicas(deployment)
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    surge = int_or_percent(rolling.get("maxSurge"), wanted, round_up=True, default="25%")
    unavailable = int_or_percent(rolling.get("maxUnavailable"), wanted, round_up=False, default="25%")
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


class DeploymentController:
    name = "deployment"

    def reconcile(self, sim) -> None:
        store = sim.store
        deployments = store.all(DEPLOYMENTS)
        if not deployments:
            return
        rs_by_ns = by_namespace(store.all(REPLICASETS))
        for deployment in sorted(deployments, key=lambda d: (d["metadata"]["namespace"], d["metadata"]["name"])):
            self._sync(sim, deployment, rs_by_ns.get(deployment["metadata"]["namespace"], []))

    def _sync(self, sim, deployment: dict, namespace_rs: list[dict]) -> None:
        store = sim.store
        spec = deployment.get("spec") or {}
        matches = selector_predicate(spec.get("selector"))
        owned = claim(store, REPLICASETS, deployment, namespace_rs, matches)
        if is_deleting(deployment):
            return
        template = _normalized(spec.get("template"))
        # FindNewReplicaSet: the oldest ReplicaSet whose template equals the Deployment's.
        owned.sort(key=lambda rs: (rs["metadata"].get("creationTimestamp") or "", rs["metadata"]["name"]))
        new_rs = next((rs for rs in owned
                       if _template_without_hash((rs.get("spec") or {}).get("template")) == template), None)
        old = [rs for rs in owned if rs is not new_rs]
        if not spec.get("paused"):
            strategy = (spec.get("strategy") or {}).get("type") or "RollingUpdate"
            if strategy == "Recreate":
                # rolloutRecreate: the new ReplicaSet is created only once every old pod is gone.
                new_rs = self._recreate(sim, deployment, new_rs, old)
            else:
                if new_rs is None:
                    new_rs = self._create_new(sim, deployment, old)
                self._rolling(sim, deployment, new_rs, old)
            self._cleanup(sim, deployment, [store.get(REPLICASETS, rs["metadata"]["namespace"], rs["metadata"]["name"])
                                            for rs in old])
        self._write_status(sim, deployment, new_rs, old)

    # ---- the new ReplicaSet --------------------------------------------------------
    def _create_new(self, sim, deployment: dict, old: list[dict]) -> dict:
        store = sim.store
        meta = deployment["metadata"]
        spec = deployment.get("spec") or {}
        collisions = int((deployment.get("status") or {}).get("collisionCount") or 0)
        template = _normalized(spec.get("template"))
        while True:
            pod_hash = template_hash(template, collisions)
            name = f"{meta['name']}-{pod_hash}"
            existing = store.get(REPLICASETS, meta["namespace"], name)
            if existing is None:
                break
            collisions += 1   # a foreign ReplicaSet took the name: hash again, as upstream
        rs_template = copy(template)
        rs_template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = pod_hash
        selector = copy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = pod_hash
        revision = max((_revision(rs) for rs in old), default=0) + 1
        surge, _ = _surge_and_unavailable(deployment)
        strategy = (spec.get("strategy") or {}).get("type") or "RollingUpdate"
        # With nothing old to replace, the new ReplicaSet starts at full size.
        has_old_pods = any(_replicas(rs) > 0 for rs in old)
        start = _replicas(deployment) if not has_old_pods else 0
        if has_old_pods and strategy != "Recreate":
            current = sum(_replicas(rs) for rs in old)
            start = max(0, min(_replicas(deployment), _replicas(deployment) + surge - current))
        rs = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "labels": dict((rs_template["metadata"].get("labels") or {})),
                         "annotations": {REVISION_ANNOTATION: str(revision),
                                         DESIRED_ANNOTATION: str(_replicas(deployment)),
                                         MAX_REPLICAS_ANNOTATION: str(_replicas(deployment) + surge)},
                         "ownerReferences": [owner_ref(deployment)]},
            "spec": {"replicas": start, "selector": selector, "template": rs_template,
                     "minReadySeconds": spec.get("minReadySeconds") or 0},
        }
        created = store.create(REPLICASETS, rs)
        if collisions != int((deployment.get("status") or {}).get("collisionCount") or 0):
            new = copy(deployment)
            new.setdefault("status", {})["collisionCount"] = collisions
            store.put(DEPLOYMENTS, new)
        record_event(sim, DEPLOYMENTS, deployment, "ScalingReplicaSet",
                     f"Scaled up replica set {name} from 0 to {start}", component=COMPONENT)
        return created

    # ---- strategies ----------------------------------------------------------------
    def _scale(self, sim, deployment: dict, rs: dict, replicas: int) -> dict:
        if _replicas(rs) == replicas:
            return rs
        new = copy(rs)
        before = _replicas(rs)
        new["spec"]["replicas"] = replicas
        annotations = new["metadata"].setdefault("annotations", {})
        annotations[DESIRED_ANNOTATION] = str(_replicas(deployment))
        stored = sim.store.put(REPLICASETS, new)
        direction = "up" if replicas > before else "down"
        record_event(sim, DEPLOYMENTS, deployment, "ScalingReplicaSet",
                     f"Scaled {direction} replica set {rs['metadata']['name']} from {before} to {replicas}",
                     component=COMPONENT)
        return stored

    def _rolling(self, sim, deployment: dict, new_rs: dict, old: list[dict]) -> None:
        wanted = _replicas(deployment)
        surge, max_unavailable = _surge_and_unavailable(deployment)
        # reconcileNewReplicaSet
        new_count = _replicas(new_rs)
        if new_count > wanted:
            new_rs = self._scale(sim, deployment, new_rs, wanted)
        elif new_count < wanted:
            current = new_count + sum(_replicas(rs) for rs in old)
            room = wanted + surge - current
            if room > 0:
                new_rs = self._scale(sim, deployment, new_rs, new_count + min(room, wanted - new_count))
        # reconcileOldReplicaSets
        live_old = sorted((rs for rs in old if _replicas(rs) > 0),
                          key=lambda r: r["metadata"].get("creationTimestamp") or "")
        if not live_old:
            return
        min_available = wanted - max_unavailable
        new_unavailable = max(0, _replicas(new_rs) - _available(new_rs))
        all_pods = _replicas(new_rs) + sum(_replicas(rs) for rs in live_old)
        # cleanupUnhealthyReplicas: old pods that are not available go first, since
        # removing them costs no availability.
        max_cleanup = all_pods - min_available - new_unavailable
        if max_cleanup <= 0:
            return
        cleaned, kept = 0, []
        for rs in live_old:
            unhealthy = _replicas(rs) - _available(rs)
            if unhealthy > 0 and cleaned < max_cleanup:
                down = min(max_cleanup - cleaned, unhealthy)
                rs = self._scale(sim, deployment, rs, _replicas(rs) - down)
                cleaned += down
            kept.append(rs)
        # scaleDownOldReplicaSetsForRollingUpdate: then as many available ones as the
        # budget allows, oldest ReplicaSet first.
        available = _available(new_rs) + sum(_available(rs) for rs in kept)
        budget = available - min_available
        for rs in kept:
            if budget <= 0:
                break
            down = min(_replicas(rs), budget)
            if down > 0:
                self._scale(sim, deployment, rs, _replicas(rs) - down)
                budget -= down

    def _recreate(self, sim, deployment: dict, new_rs: dict | None, old: list[dict]) -> dict | None:
        live_old = [rs for rs in old if _replicas(rs) > 0 or int((rs.get("status") or {}).get("replicas") or 0)]
        for rs in live_old:
            self._scale(sim, deployment, rs, 0)
        if any(int((rs.get("status") or {}).get("replicas") or 0) for rs in live_old):
            return new_rs   # wait for every old pod to be gone
        if new_rs is None:
            # The old ones, now at zero, still number the revision.
            current = [sim.store.get(REPLICASETS, rs["metadata"]["namespace"], rs["metadata"]["name"]) or rs
                       for rs in old]
            return self._create_new(sim, deployment, current)
        return self._scale(sim, deployment, new_rs, _replicas(deployment))

    def _cleanup(self, sim, deployment: dict, old: list[dict | None]) -> None:
        limit = (deployment.get("spec") or {}).get("revisionHistoryLimit")
        limit = 10 if limit is None else int(limit)
        idle = sorted((rs for rs in old if rs is not None and _replicas(rs) == 0
                       and not int((rs.get("status") or {}).get("replicas") or 0) and not is_deleting(rs)),
                      key=_revision)
        for rs in idle[:max(0, len(idle) - limit)]:
            sim.store.delete(REPLICASETS, rs["metadata"]["namespace"], rs["metadata"]["name"])

    # ---- status --------------------------------------------------------------------
    @staticmethod
    def _write_status(sim, deployment: dict, new_rs: dict | None, old: list[dict]) -> None:
        store = sim.store

        def fresh(rs: dict | None) -> dict | None:   # as stored after this pass's writes
            return rs and store.get(REPLICASETS, rs["metadata"]["namespace"], rs["metadata"]["name"])

        new_now = fresh(new_rs)
        current = [rs for rs in [new_now, *map(fresh, old)] if rs is not None]

        def total(field: str) -> int:
            return sum(int((rs.get("status") or {}).get(field) or 0) for rs in current)

        wanted = _replicas(deployment)
        _, max_unavailable = _surge_and_unavailable(deployment)
        replicas, available = total("replicas"), total("availableReplicas")
        updated = int(((new_now or {}).get("status") or {}).get("replicas") or 0)
        now = sim.clock.now()
        old_status = deployment.get("status") or {}
        conditions = old_status.get("conditions")
        if available >= wanted - max_unavailable:
            conditions = set_condition(conditions, "Available", "True", now, reason="MinimumReplicasAvailable",
                                       message="Deployment has minimum availability.")
        else:
            conditions = set_condition(conditions, "Available", "False", now, reason="MinimumReplicasUnavailable",
                                       message="Deployment does not have minimum availability.")
        complete = updated == wanted and replicas == wanted and available == wanted
        name = new_rs["metadata"]["name"] if new_rs else ""
        conditions = set_condition(
            conditions, "Progressing", "True", now,
            reason="NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
            message=(f'ReplicaSet "{name}" has successfully progressed.' if complete
                     else f'ReplicaSet "{name}" is progressing.'))
        status = {k: v for k, v in old_status.items() if k == "collisionCount"}
        status.update({
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": replicas, "updatedReplicas": updated, "readyReplicas": total("readyReplicas"),
            "availableReplicas": available, "unavailableReplicas": max(0, wanted - available),
            "conditions": conditions,
        })
        write_status(store, DEPLOYMENTS, deployment, status)

