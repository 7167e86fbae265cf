"""Knative label and annotation keys (knative.dev/serving/pkg/apis/serving)."""
from __future__ import annotations

SERVICE = "serving.knative.dev/service"
CONFIGURATION = "serving.knative.dev/configuration"
CONFIGURATION_UID = "serving.knative.dev/configurationUID"
CONFIGURATION_GENERATION = "serving.knative.dev/configurationGeneration"
REVISION = "serving.knative.dev/revision"
REVISION_UID = "serving.knative.dev/revisionUID"
ROUTING_STATE = "serving.knative.dev/routingState"
AUTOSCALING_PREFIX = "autoscaling.knative.dev/"

# Current key -> the old camelCase key still accepted at lower priority.
SCALE_KEYS = {
    "min-scale": "minScale",
    "max-scale": "maxScale",
    "initial-scale": "initialScale",
    "target": "target",
    "metric": "metric",
    "class": "class",
    "window": "window",
    "scale-down-delay": "scaleDownDelay",
}


def autoscaling_annotations(annotations: dict | None) -> dict:
    return {k: v for k, v in (annotations or {}).items() if k.startswith(AUTOSCALING_PREFIX)}


def scale_annotation(annotations: dict | None, key: str) -> str | None:
    """`autoscaling.knative.dev/<key>`, falling back to the old camelCase spelling."""
    annotations = annotations or {}
    value = annotations.get(AUTOSCALING_PREFIX + key)
    if value is None and key in SCALE_KEYS:
        value = annotations.get(AUTOSCALING_PREFIX + SCALE_KEYS[key])
    return value


def scale_number(annotations: dict | None, key: str, default: float | None = None) -> float | None:
    value = scale_annotation(annotations, key)
    if value is None or str(value).strip() == "":
        return default
    try:
        return float(str(value).rstrip("s"))
    except ValueError:
        return default
