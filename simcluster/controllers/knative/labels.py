"""Knative label and annotation keys (knative.dev/serving/pkg/apis/serving)."""
from __future__ import annotations

import re

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
    "scale-to-zero-pod-retention-period": "scaleToZeroPodRetentionPeriod",
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


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text) -> float | None:
    """A Go duration ("60s", "1m30s", "1.5h", "0") in seconds; None when it is not one.
    Knative's duration annotations and config keys are parsed with time.ParseDuration."""
    text = str(text).strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    if not text or text[0] == "-":
        return None
    text = text.lstrip("+")
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos else None


def scale_duration(annotations: dict | None, key: str) -> float | None:
    """`autoscaling.knative.dev/<key>` as a duration in seconds (None: absent or invalid)."""
    value = scale_annotation(annotations, key)
    return None if value is None else parse_duration(value)
