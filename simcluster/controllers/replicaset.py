"""The ReplicaSet controller, as pkg/controller/replicaset does it (see KUBERNETES.md).

Each pass: claim the namespace's pods (keep / release / adopt), create missing pods
from the template, delete extra ones in the upstream scale-down order, write status.
"""
from __future__ import annotations

import heapq
import math
import random
from datetime import datetime, timedelta
from functools import cmp_to_key

from ..clock import parse_time
from ..resources import PODS, REPLICASETS
from ..selectors import selector_from_match_labels
from ..store import copy
from ._util import (by_controller, by_namespace, controller_ref, controller_uid, deletion_cost, is_deleting,
                    owner_ref, pod_active, pod_available, pod_from_template, pod_ready, pod_ready_since,
                    record_event, unique_name, write_status)

COMPONENT = "replicaset-controller"


# ---- claiming (controller_ref_manager.go ClaimObject) ------------------------------------
def selector_predicate(selector: dict | None):
    """An apps/v1 selector; an empty one selects nothing (it is invalid upstream)."""
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return lambda labels: False
    return selector_from_match_labels(selector)


def claim(store, rtype, owner: dict, candidates: list[dict], matches) -> list[dict]:
    """The candidates `owner` controls after claiming: kept, adopted (orphans whose
    labels match, neither side being deleted) and, by side effect, released (owned but no
    longer matching; ownerReference removed)."""
    uid = owner["metadata"]["uid"]
    owner_deleting = is_deleting(owner)
    claimed = []
    for obj in candidates:
        labels = obj["metadata"].get("labels") or {}
        ref = controller_ref(obj)
        if ref is not None:
            if ref.get("uid") != uid:
                continue
            if matches(labels):
                claimed.append(obj)
            elif not owner_deleting:
                release(store, rtype, obj, uid)
            continue
        if owner_deleting or is_deleting(obj) or not matches(labels):
            continue
        # Another owner may have adopted it earlier in this pass: upstream's adoption
        # patch would fail its uid/resourceVersion precondition, so re-read first.
        current = store.get(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if current is None or current["metadata"].get("uid") != obj["metadata"].get("uid"):
            continue
        if current is not obj:
            if controller_ref(current) is not None:
                continue
            obj = current
        new = copy(obj)
        refs = [r for r in new["metadata"].get("ownerReferences") or () if r.get("uid") != uid]
        new["metadata"]["ownerReferences"] = refs + [owner_ref(owner)]
        claimed.append(store.put(rtype, new))
    return claimed


class ClaimCandidates:
    """A namespace's objects as `claim` reads them for one owner: those the owner
    controls and the orphans, in the namespace's order. `claim` passes over objects
    another owner controls, so leaving them out changes nothing, and each owner's pass
    costs its own objects and the orphans instead of the whole namespace."""

    def __init__(self, objects: list[dict]):
        self._objects = objects
        self._controlled: dict[str | None, list[dict]] = {}
        self._orphans: list[dict] = []
        self._position: dict[int, int] | None = None
        for obj in objects:
            ref = controller_ref(obj)
            if ref is None:
                self._orphans.append(obj)
            else:
                self._controlled.setdefault(ref.get("uid"), []).append(obj)

    def of(self, owner_uid: str) -> list[dict]:
        own = self._controlled.get(owner_uid, [])
        if not self._orphans or not own:
            return own or self._orphans
        if self._position is None:
            self._position = {id(obj): at for at, obj in enumerate(self._objects)}
        return list(heapq.merge(own, self._orphans, key=lambda obj: self._position[id(obj)]))


def release(store, rtype, obj: dict, owner_uid: str) -> dict:
    new = copy(obj)
    refs = [r for r in new["metadata"].get("ownerReferences") or () if r.get("uid") != owner_uid]
    if refs:
        new["metadata"]["ownerReferences"] = refs
    else:
        new["metadata"].pop("ownerReferences", None)
    return store.put(rtype, new)


# ---- scale-down order (controller_utils.go ActivePodsWithRanks.Less) ---------------------
_PHASE_ORDINAL = {"Pending": 0, "Unknown": 1, "Running": 2}


def _log2_bucket(moment: datetime, now: datetime) -> int:
    nanos = (now - moment).total_seconds() * 1e9
    return int(math.log2(nanos)) if nanos > 0 else -1


def _max_restarts(pod: dict) -> int:
    return max((cs.get("restartCount") or 0 for cs in (pod.get("status") or {}).get("containerStatuses") or ()),
               default=0)


def _newer_first(t1: datetime | None, t2: datetime | None, uid1: str, uid2: str, now: datetime) -> int | None:
    """Rules 6 and 8: the newer (or zero) time first, in log2 buckets of age, then lower
    uid. None when the times are equal."""
    if t1 == t2:
        return None
    if t1 is None or t2 is None:
        return -1 if t1 is None else 1   # afterOrZero: a zero time counts as newest
    diff = _log2_bucket(t1, now) - _log2_bucket(t2, now)
    if diff == 0:
        return -1 if uid1 < uid2 else (1 if uid1 > uid2 else 0)
    return -1 if diff < 0 else 1


def deletion_order(pods: list[dict], ranks: dict[str, int], now: datetime) -> list[dict]:
    """`pods` with those to delete first at the front, exactly as upstream ranks them."""

    def compare(a: dict, b: dict) -> int:
        na, nb = (a.get("spec") or {}).get("nodeName") or "", (b.get("spec") or {}).get("nodeName") or ""
        # 1. unassigned before assigned
        if na != nb and (not na or not nb):
            return -1 if not na else 1
        # 2. Pending < Unknown < Running
        pa = _PHASE_ORDINAL.get((a.get("status") or {}).get("phase"), 0)
        pb = _PHASE_ORDINAL.get((b.get("status") or {}).get("phase"), 0)
        if pa != pb:
            return -1 if pa < pb else 1
        # 3. not ready before ready
        ra, rb = pod_ready(a), pod_ready(b)
        if ra != rb:
            return -1 if not ra else 1
        # 4. lower deletion cost first
        ca, cb = deletion_cost(a), deletion_cost(b)
        if ca != cb:
            return -1 if ca < cb else 1
        # 5. more active siblings on the same node first
        ka, kb = ranks[a["metadata"]["uid"]], ranks[b["metadata"]["uid"]]
        if ka != kb:
            return -1 if ka > kb else 1
        ua, ub = a["metadata"]["uid"], b["metadata"]["uid"]
        # 6. both ready: more recently ready first
        if ra and rb:
            result = _newer_first(pod_ready_since(a), pod_ready_since(b), ua, ub, now)
            if result is not None:
                return result
        # 7. more restarts first
        xa, xb = _max_restarts(a), _max_restarts(b)
        if xa != xb:
            return -1 if xa > xb else 1
        # 8. newer creation first
        result = _newer_first(parse_time(a["metadata"].get("creationTimestamp")),
                              parse_time(b["metadata"].get("creationTimestamp")), ua, ub, now)
        if result is not None:
            return result
        return 0   # 9. equal

    return sorted(pods, key=cmp_to_key(compare))


def sibling_ranks(pods: list[dict], related: list[dict]) -> dict[str, int]:
    """getPodsRankedByRelatedPodsOnSameNode: per pod, the active related pods on its node."""
    on_node: dict[str, int] = {}
    for pod in related:
        if pod_active(pod):
            node = (pod.get("spec") or {}).get("nodeName") or ""
            on_node[node] = on_node.get(node, 0) + 1
    return {p["metadata"]["uid"]: on_node.get((p.get("spec") or {}).get("nodeName") or "", 0) for p in pods}


# ---- the controller ----------------------------------------------------------------------
class ReplicaSetController:
    name = "replicaset"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def reconcile(self, sim) -> None:
        store = sim.store
        replicasets = store.all(REPLICASETS)
        if not replicasets:
            return
        pods_by_ns = by_namespace(store.all(PODS))
        candidates = {namespace: ClaimCandidates(pods) for namespace, pods in pods_by_ns.items()}
        # Sibling ReplicaSets (same Deployment) share the "rank" of rule 5.
        siblings = by_controller(replicasets)
        for rs in sorted(replicasets, key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"])):
            namespace = rs["metadata"]["namespace"]
            claimable = candidates[namespace].of(rs["metadata"]["uid"]) if namespace in candidates else []
            self._sync(sim, rs, claimable, pods_by_ns.get(namespace, []), siblings)

    def _sync(self, sim, rs: dict, claimable: list[dict], namespace_pods: list[dict], siblings: dict) -> None:
        store = sim.store
        now = sim.clock.now()
        spec = rs.get("spec") or {}
        matches = selector_predicate(spec.get("selector"))
        pods = claim(store, PODS, rs, claimable, matches)
        active = [p for p in pods if pod_active(p)]
        wanted = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        if not is_deleting(rs):
            diff = len(active) - wanted
            if diff < 0:
                active += self._create(sim, rs, -diff)
            elif diff > 0:
                doomed = deletion_order(active, sibling_ranks(active, self._related_pods(rs, namespace_pods, siblings)),
                                        now)[:diff]
                for pod in doomed:
                    store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                    record_event(sim, REPLICASETS, rs, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}",
                                 component=COMPONENT)
                doomed_uids = {p["metadata"]["uid"] for p in doomed}
                active = [p for p in active if p["metadata"]["uid"] not in doomed_uids]
        self._write_status(sim, rs, active, now)

    @staticmethod
    def _related_pods(rs: dict, namespace_pods: list[dict], siblings: dict) -> list[dict]:
        """getIndirectlyRelatedPods: the pods matching the selector of any ReplicaSet that
        shares `rs`'s controller (a Deployment's old and new ReplicaSets). A ReplicaSet
        without a controller has none, so rule 5 (node doubling) ties for its pods."""
        owner_uid = controller_uid(rs)
        if not owner_uid:
            return []
        related, seen = [], set()
        for sibling in siblings.get(owner_uid, [rs]):
            matches = selector_predicate((sibling.get("spec") or {}).get("selector"))
            for pod in namespace_pods:
                uid = pod["metadata"]["uid"]
                if uid not in seen and matches(pod["metadata"].get("labels") or {}):
                    seen.add(uid)
                    related.append(pod)
        return related

    def _create(self, sim, rs: dict, count: int) -> list[dict]:
        store = sim.store
        meta = rs["metadata"]
        created = []
        for _ in range(count):
            name = unique_name(store, PODS, meta["namespace"], f"{meta['name']}-", self.rng)
            pod = pod_from_template((rs.get("spec") or {}).get("template"), owner=rs, name=name,
                                    namespace=meta["namespace"])
            pod["metadata"]["generateName"] = f"{meta['name']}-"
            created.append(store.create(PODS, pod))
            record_event(sim, REPLICASETS, rs, "SuccessfulCreate", f"Created pod: {name}", component=COMPONENT)
        return created

    @staticmethod
    def _write_status(sim, rs: dict, active: list[dict], now: datetime) -> None:
        spec = rs.get("spec") or {}
        min_ready = spec.get("minReadySeconds") or 0
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        labeled = ready = available = 0
        for pod in active:   # one pass: a pass per count was most of a pass at 50,000 pods
            labels = pod["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in template_labels.items()):
                labeled += 1
            if not pod_ready(pod):
                continue
            ready += 1
            if not min_ready or pod_available(pod, min_ready, now):
                available += 1
            elif since := pod_ready_since(pod):
                sim.wake_at(since + timedelta(seconds=min_ready))
        status = {k: v for k, v in (rs.get("status") or {}).items() if k == "conditions"}
        status.update({
            "replicas": len(active),
            "fullyLabeledReplicas": labeled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": rs["metadata"].get("generation", 1),
        })
        write_status(sim.store, REPLICASETS, rs, status)
