"""Knative's `config-autoscaler` (knative-serving namespace): the cluster-wide defaults
the KPA and the revision reconciler read (knative.dev/serving pkg/autoscaler/config).

Keys modelled (absent keys take Knative's defaults; the scenario's SimSettings give the
stable window and grace period defaults):
  enable-scale-to-zero (true), stable-window (60s), scale-to-zero-grace-period (30s),
  scale-to-zero-pod-retention-period (0s), scale-down-delay (0s), initial-scale (1),
  allow-zero-initial-scale (false), min-scale (0), max-scale (0 = unbounded).
A value that does not parse keeps the default: real Knative would refuse to load the
ConfigMap and keep its previous configuration, which for a fresh install is the default.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...resources import CONFIGMAPS
from .._serving import KNATIVE_NAMESPACE
from . import labels as L

CONFIG_NAME = "config-autoscaler"


@dataclass(frozen=True)
class AutoscalerConfig:
    enable_scale_to_zero: bool
    stable_window: float             # seconds
    scale_to_zero_grace: float       # seconds
    pod_retention: float             # seconds the last pod stays once the PA is inactive
    scale_down_delay: float          # seconds a scale-down waits at reduced load
    initial_scale: int
    allow_zero_initial_scale: bool
    min_scale: int
    max_scale: int


def _flag(data: dict, key: str, default: bool) -> bool:
    value = str(data.get(key, "")).strip().lower()
    return {"true": True, "false": False}.get(value, default)


def _seconds(data: dict, key: str, default: float) -> float:
    parsed = L.parse_duration(data[key]) if key in data else None
    return default if parsed is None else parsed


def _count(data: dict, key: str, default: int, minimum: int) -> int:
    try:
        value = int(str(data.get(key, default)).strip())
    except ValueError:
        return default
    return value if value >= minimum else default


def autoscaler_config(sim) -> AutoscalerConfig:
    cm = sim.store.get(CONFIGMAPS, KNATIVE_NAMESPACE, CONFIG_NAME)
    data = (cm or {}).get("data") or {}
    allow_zero = _flag(data, "allow-zero-initial-scale", False)
    return AutoscalerConfig(
        enable_scale_to_zero=_flag(data, "enable-scale-to-zero", True),
        stable_window=_seconds(data, "stable-window", sim.settings.stable_window_seconds),
        scale_to_zero_grace=_seconds(data, "scale-to-zero-grace-period", sim.settings.scale_to_zero_grace_seconds),
        pod_retention=_seconds(data, "scale-to-zero-pod-retention-period", 0.0),
        scale_down_delay=_seconds(data, "scale-down-delay", 0.0),
        # initial-scale 0 in the ConfigMap is only valid with allow-zero-initial-scale.
        initial_scale=_count(data, "initial-scale", 1, 0 if allow_zero else 1),
        allow_zero_initial_scale=allow_zero,
        min_scale=_count(data, "min-scale", 0, 0),
        max_scale=_count(data, "max-scale", 0, 0),
    )


def initial_scale(config: AutoscalerConfig, annotations: dict | None) -> int:
    """GetInitialScale (pkg/reconciler/autoscaling/kpa/resources): the revision's
    `initial-scale` annotation, except 0 where allow-zero-initial-scale is off (Knative's
    webhook refuses that value; here it falls back), else the cluster's initial-scale."""
    value = L.scale_annotation(annotations, "initial-scale")
    if value is None:
        return config.initial_scale
    try:
        wanted = int(str(value).strip())
    except ValueError:
        return config.initial_scale
    if wanted < 0 or (wanted == 0 and not config.allow_zero_initial_scale):
        return config.initial_scale
    return wanted
