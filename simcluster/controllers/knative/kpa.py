"""The Knative Pod Autoscaler (KPA), simplified but faithful where the product looks.

desiredScale comes from the load alone — never from how many pods exist — so an
orphaned pod (still labelled with the revision, so counted in actualScale and still
served traffic) does not make the KPA scale its revision down. Knative's averaging
over the stable window is modelled as "the peak concurrency seen in the window".

Timing of a scale-down (each from the PA's `autoscaling.knative.dev/*` annotation, else
`config-autoscaler`, see autoscaler_config.py):
- `scale-down-delay`: a lower desired scale applies only once it has held for the delay
  (the autoscaler keeps the maximum over that time), scale to zero included;
- the PA turns inactive when desired reaches 0 (window + delay after the last load), and
  its last pod goes once it has been inactive for the longer of
  `scale-to-zero-grace-period` and `scale-to-zero-pod-retention-period` (scaler.go,
  handleScaleToZero); only when min-scale allows it (or the revision is unrouted) and
  `enable-scale-to-zero` is on.
- `initial-scale`: until the scale target is first initialized the KPA keeps at least
  that many pods (GetInitialScale: 0 only with `allow-zero-initial-scale`).
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta

from ...resources import DEPLOYMENTS, PODAUTOSCALERS, PODS
from ...store import copy
from .._serving import is_true, merge_conditions, pod_serving, write_status_subresource
from . import labels as L
from .autoscaler_config import AutoscalerConfig, autoscaler_config, initial_scale


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
        config = autoscaler_config(sim)
        now = sim.clock.now()
        self._timers = {t for t in self._timers if t > now}
        for pa in pas:
            if pa["metadata"].get("deletionTimestamp"):
                continue
            meta = pa["metadata"]
            revision = (meta.get("labels") or {}).get(L.REVISION, meta["name"])
            actual = ready.get((meta["namespace"], revision), 0)
            desired = self._desired(sim, config, pa, revision, actual)
            self._scale(store, pa, desired)
            self._status(sim, config, pa, desired, actual)
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pas}
        for key in [k for k in self._history if k not in live]:
            self._history.pop(key, None)
            self._idle_since.pop(key, None)

    def _desired(self, sim, config: AutoscalerConfig, pa: dict, revision: str, actual: int) -> int:
        meta = pa["metadata"]
        key = (meta["namespace"], meta["name"])
        annotations = meta.get("annotations") or {}
        now = sim.clock.now()
        settings = sim.settings

        def seconds(name: str, default: float) -> float:
            value = L.scale_duration(annotations, name)
            return default if value is None else value

        window = seconds("window", config.stable_window)
        delay = seconds("scale-down-delay", config.scale_down_delay)
        retention = seconds("scale-to-zero-pod-retention-period", config.pod_retention)
        load = float(sim.load.get((meta["namespace"], revision), 0.0))

        history = self._history.setdefault(key, [])
        if not history or history[-1][1] != load:
            history.append((now, load))
        # The desired scale at t reads the window before t, and a scale-down waits for
        # the delay: keep the entry in force at (now - window - delay) and every change after.
        horizon = window + delay
        start = now - timedelta(seconds=horizon)
        while len(history) > 1 and history[1][0] <= start:
            history.pop(0)
        if len(history) > 1:
            self._wake(sim, history[1][0] + timedelta(seconds=horizon))
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
            # Desired reaches 0 `horizon` after the last load; the last pod then stays
            # until the PA has been inactive for the grace period and the retention period.
            zero_at = idle_since + timedelta(seconds=horizon + max(config.scale_to_zero_grace, retention))
            if now >= zero_at:
                want = 0
            else:
                want = 1 if actual or is_true(pa, "Active") else 0
                self._wake(sim, zero_at)

        if not is_true(pa, "ScaleTargetInitialized"):
            want = max(want, initial_scale(config, annotations))
        min_scale = L.scale_number(annotations, "min-scale", config.min_scale) or 0
        if (pa.get("spec") or {}).get("reachability") == "Unreachable":
            min_scale = 0   # an unrouted revision may always scale to zero
        if not config.enable_scale_to_zero:
            min_scale = max(min_scale, 1)
        max_scale = L.scale_number(annotations, "max-scale", config.max_scale) or 0
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
    def _status(sim, config: AutoscalerConfig, pa: dict, desired: int, actual: int) -> None:
        meta = pa["metadata"]
        initial = initial_scale(config, meta.get("annotations"))
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
        write_status_subresource(sim.store, PODAUTOSCALERS, pa, status)


def _ready_pods_by_revision(store) -> dict[tuple[str, str], int]:
    """Running, Ready, not terminating pods per revision label — whoever owns them."""
    counts: dict[tuple[str, str], int] = {}
    for pod in store.all(PODS):
        rev = (pod["metadata"].get("labels") or {}).get(L.REVISION)
        if rev and pod_serving(pod):
            key = (pod["metadata"]["namespace"], rev)
            counts[key] = counts.get(key, 0) + 1
    return counts
