"""The Knative Pod Autoscaler (KPA), simplified but faithful where the product looks.

desiredScale comes from the load alone — never from how many pods exist — so an
orphaned pod (still labelled with the revision, so counted in actualScale and still
served traffic) does not make the KPA scale its revision down. Knative's averaging
over the stable window is modelled as "the peak concurrency seen in the window", and
scale to zero happens after `window + scale-to-zero grace` without traffic, only when
min-scale allows it (or the revision is no longer routed).
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta

from ...resources import DEPLOYMENTS, PODAUTOSCALERS, PODS
from ...store import copy
from .._serving import is_true, merge_conditions, pod_ready, write_status
from . import labels as L


class KPAController:
    name = "knative-kpa"

    def __init__(self):
        # (namespace, pa) -> [(moment, concurrency)] load changes inside the stable window.
        self._history: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
        # (namespace, pa) -> when the revision last went without traffic.
        self._idle_since: dict[tuple[str, str], datetime] = {}
        self._timers: set[datetime] = set()   # wake-ups already asked for

    def _wake(self, sim, moment: datetime) -> None:
        # Every round re-derives the same deadlines: ask the simulation once per moment.
        if moment not in self._timers:
            self._timers.add(moment)
            sim.wake_at(moment)

    def reconcile(self, sim) -> None:
        store = sim.store
        pas = store.all(PODAUTOSCALERS)
        if not pas:
            return
        ready = _ready_pods_by_revision(store)
        now = sim.clock.now()
        self._timers = {t for t in self._timers if t > now}
        for pa in pas:
            if pa["metadata"].get("deletionTimestamp"):
                continue
            meta = pa["metadata"]
            revision = (meta.get("labels") or {}).get(L.REVISION, meta["name"])
            actual = ready.get((meta["namespace"], revision), 0)
            desired = self._desired(sim, pa, revision, actual)
            self._scale(store, pa, desired)
            self._status(sim, pa, desired, actual)
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pas}
        for key in [k for k in self._history if k not in live]:
            self._history.pop(key, None)
            self._idle_since.pop(key, None)

    def _desired(self, sim, pa: dict, revision: str, actual: int) -> int:
        meta = pa["metadata"]
        key = (meta["namespace"], meta["name"])
        annotations = meta.get("annotations") or {}
        now = sim.clock.now()
        settings = sim.settings
        window = L.scale_number(annotations, "window", settings.stable_window_seconds)
        grace = settings.scale_to_zero_grace_seconds
        load = float(sim.load.get((meta["namespace"], revision), 0.0))

        history = self._history.setdefault(key, [])
        if not history or history[-1][1] != load:
            history.append((now, load))
        # Keep the entry in force at the window's start and every change after it.
        start = now - timedelta(seconds=window)
        while len(history) > 1 and history[1][0] <= start:
            history.pop(0)
        if len(history) > 1:
            self._wake(sim, history[1][0] + timedelta(seconds=window))
        peak = max(c for _, c in history)
        if load > 0:
            self._idle_since.pop(key, None)
        else:
            idle_since = self._idle_since.setdefault(key, now)

        target = L.scale_number(annotations, "target") or \
            float((pa.get("spec") or {}).get("containerConcurrency") or 0) or \
            settings.default_target_concurrency
        if peak > 0:
            want = math.ceil(peak / target)
        else:
            zero_at = idle_since + timedelta(seconds=window + grace)
            if now >= zero_at:
                want = 0
            else:
                want = 1 if actual or is_true(pa, "ScaleTargetInitialized") else 0
                self._wake(sim, zero_at)

        initial = L.scale_number(annotations, "initial-scale", 1)
        if not is_true(pa, "ScaleTargetInitialized"):
            want = max(want, int(initial))
        min_scale = L.scale_number(annotations, "min-scale", 0) or 0
        if (pa.get("spec") or {}).get("reachability") == "Unreachable":
            min_scale = 0   # an unrouted revision may always scale to zero
        max_scale = L.scale_number(annotations, "max-scale", 0) or 0
        want = max(want, int(min_scale))
        if max_scale > 0:
            want = min(want, int(max_scale))
        return want

    @staticmethod
    def _scale(store, pa: dict, desired: int) -> None:
        """What `PUT .../deployments/<name>/scale` does: set spec.replicas."""
        ref = (pa.get("spec") or {}).get("scaleTargetRef") or {}
        deployment = store.get(DEPLOYMENTS, pa["metadata"]["namespace"], ref.get("name", ""))
        if deployment is None or deployment.get("spec", {}).get("replicas") == desired:
            return
        new = copy(deployment)
        new["spec"]["replicas"] = desired
        store.put(DEPLOYMENTS, new)

    @staticmethod
    def _status(sim, pa: dict, desired: int, actual: int) -> None:
        meta = pa["metadata"]
        annotations = meta.get("annotations") or {}
        initial = int(L.scale_number(annotations, "initial-scale", 1))
        initialized = is_true(pa, "ScaleTargetInitialized") or actual >= max(initial, 1) or initial == 0
        if desired == 0 and actual == 0:
            active = {"type": "Active", "status": "False", "reason": "NoTraffic",
                      "message": "The target is not receiving traffic."}
        elif actual > 0:
            active = {"type": "Active", "status": "True"}
        else:
            active = {"type": "Active", "status": "Unknown", "reason": "Queued",
                      "message": "Requests to the target are being buffered as resources are provisioned."}
        sks = {"type": "SKSReady", "status": "True"} if actual > 0 or desired == 0 else \
            {"type": "SKSReady", "status": "Unknown", "reason": "NoHealthyBackends"}
        init = {"type": "ScaleTargetInitialized", "status": "True"} if initialized else \
            {"type": "ScaleTargetInitialized", "status": "Unknown", "reason": "Queued"}
        parts = [active, init, sks]
        if all(c["status"] == "True" for c in parts):
            ready = {"type": "Ready", "status": "True"}
        else:
            worst = next(c for c in parts if c["status"] != "True")
            ready = {"type": "Ready", "status": worst["status"], "reason": worst.get("reason"),
                     "message": worst.get("message")}
        status = {
            "observedGeneration": meta.get("generation", 1),
            "serviceName": meta["name"],
            "metricsServiceName": f"{meta['name']}-private",
            "desiredScale": desired,
            "actualScale": actual,
            "conditions": merge_conditions((pa.get("status") or {}).get("conditions"),
                                           [active, ready, init, sks], sim.clock.now()),
        }
        write_status(sim.store, PODAUTOSCALERS, pa, status)


def _ready_pods_by_revision(store) -> dict[tuple[str, str], int]:
    """Running, Ready, not terminating pods per revision label — whoever owns them."""
    counts: dict[tuple[str, str], int] = {}
    for pod in store.all(PODS):
        rev = (pod["metadata"].get("labels") or {}).get(L.REVISION)
        if rev and pod_ready(pod):
            key = (pod["metadata"]["namespace"], rev)
            counts[key] = counts.get(key, 0) + 1
    return counts
