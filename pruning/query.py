"""The one PromQL query of a prune run, built so that no filter text can change its shape.

Per GPU series it returns one value: the highest utilization (0–1) seen over the window —
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` where the exporter has it, else `DCGM_FI_DEV_GPU_UTIL / 100`
(KUBERNETES.md, DCGM) — plus GAP_OFFSET when the series has a gap: some `step`-long slot
of the window without a sample in the `max_gap` before it. Folding the gap flag into the
value keeps it one series per GPU (a second labelled series per GPU and an `or` of the
two cost Prometheus 60 % more on 10,000 GPUs).
Both label schemes are matched in the same query: `pod`/`namespace` series (no `exported_pod`
label) and `exported_pod`/`exported_namespace` series (honor_labels=false scrapes). With
`honor_labels=false` the plain `namespace` label is the exporter's own, so each scheme
filters on its own label and the two selections never overlap.

Filters are regular expressions (Prometheus' RE2, fully anchored, like gpu-pruner's
`=~` matchers). They go into the query only as a quoted PromQL string literal, escaped here.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
# Utilization is 0–1, so a value >= GAP_OFFSET can only mean "flagged as having a gap".
GAP_OFFSET = 10.0
SCHEMES = ("auto", "pod", "exported")

# Constructs Python's `re` accepts but Go's RE2 (Prometheus) rejects: lookaround,
# backreferences, possessive/atomic groups, conditionals.
_RE2_UNSUPPORTED = re.compile(r"\(\?(?:[=!]|<[=!]|>|\(|P=)|\\[1-9]|[*+?}]\+")


class FilterError(ValueError):
    """A namespace or GPU-model filter that is not a valid regular expression."""


def validate_regex(pattern: str, *, what: str) -> str:
    if not isinstance(pattern, str):
        raise FilterError(f"{what} filter must be text, got {type(pattern).__name__}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise FilterError(f"{what} filter {pattern!r} is not a valid regular expression: {exc}") from None
    bad = _RE2_UNSUPPORTED.search(pattern)
    if bad:
        raise FilterError(
            f"{what} filter {pattern!r} uses {bad.group(0)!r}, which Prometheus' RE2 regular "
            "expressions do not support (no lookaround, backreferences or possessive repeats)")
    return pattern


def promql_string(text: str) -> str:
    """A PromQL double-quoted string literal holding exactly `text`.

    PromQL unquotes with Go's strconv rules; JSON's escapes (\\" \\\\ \\n \\uXXXX) are a subset
    of those, so a JSON string is a valid PromQL string with the same value."""
    return json.dumps(text, ensure_ascii=False)


def _duration(seconds: int) -> str:
    if seconds <= 0 or int(seconds) != seconds:
        raise ValueError(f"durations must be whole positive seconds, got {seconds!r}")
    return f"{int(seconds)}s"


@dataclass(frozen=True)
class IdleQuery:
    window_seconds: int = 1800
    namespace: str | None = None
    model_name: str | None = None
    label_scheme: str = "auto"
    step_seconds: int = 60
    max_gap_seconds: int = 120

    def __post_init__(self):
        if self.label_scheme not in SCHEMES:
            raise FilterError(f"label scheme must be one of {', '.join(SCHEMES)}, got {self.label_scheme!r}")
        if self.namespace is not None:
            validate_regex(self.namespace, what="namespace")
        if self.model_name is not None:
            validate_regex(self.model_name, what="GPU model")
        if self.window_seconds % self.step_seconds:
            raise ValueError("the window must be a whole number of steps")
        if self.max_gap_seconds < self.step_seconds:
            raise ValueError("max_gap_seconds must be at least step_seconds")

    @property
    def expected_steps(self) -> int:
        return self.window_seconds // self.step_seconds

    def _selectors(self, metric: str) -> list[str]:
        """One selector per label scheme in use; each filters on its own namespace label."""
        model = [f"modelName=~{promql_string(self.model_name)}"] if self.model_name is not None else []
        out = []
        if self.label_scheme in ("auto", "pod"):
            m = ['pod!=""'] + (['exported_pod=""'] if self.label_scheme == "auto" else [])
            if self.namespace is not None:
                m.append(f"namespace=~{promql_string(self.namespace)}")
            out.append(metric + "{" + ",".join(m + model) + "}")
        if self.label_scheme in ("auto", "exported"):
            m = ['exported_pod!=""']
            if self.namespace is not None:
                m.append(f"exported_namespace=~{promql_string(self.namespace)}")
            out.append(metric + "{" + ",".join(m + model) + "}")
        return out

    def _per_gpu(self, fn) -> str:
        # `or` keeps GR_ENGINE for a GPU and adds GPU_UTIL only for GPUs without it (set
        # operators match on all labels but the metric name).
        gr = " or ".join(fn(s, scale="") for s in self._selectors(GR_ENGINE))
        util = " or ".join(fn(s, scale=" / 100") for s in self._selectors(GPU_UTIL))
        return f"({gr}) or ({util})"

    def promql(self) -> str:
        w = _duration(self.window_seconds)
        gap, step = _duration(self.max_gap_seconds), _duration(self.step_seconds)
        maxes = self._per_gpu(lambda s, scale: f"max_over_time({s}[{w}]){scale}")
        slots = self._per_gpu(
            lambda s, scale: f"count_over_time(count_over_time({s}[{gap}])[{w}:{step}])")
        # `< bool` is 1 for a GPU with fewer sampled slots than the window holds, else 0.
        return f"({maxes}) + (({slots}) < bool {self.expected_steps}) * {GAP_OFFSET:g}"


@dataclass(frozen=True)
class GpuSeries:
    """One GPU of one pod as the query saw it."""
    namespace: str
    pod: str
    gpu: str
    model: str
    hostname: str
    max_utilization: float | None   # None: no usable value (NaN)
    complete: bool                  # samples throughout the window, no gap


def workload_of(labels: dict, label_scheme: str = "auto") -> tuple[str, str]:
    """(namespace, pod) a series belongs to under `label_scheme`.

    "pod" reads only `pod`/`namespace`, even on a series that also has `exported_pod`: on
    an honor_labels=false scrape those name the exporter's own pod, and that is what the
    operator asked for. "exported" reads only the exported_* pair; "auto" prefers it."""
    if label_scheme not in SCHEMES:
        raise FilterError(f"label scheme must be one of {', '.join(SCHEMES)}, got {label_scheme!r}")
    if label_scheme != "pod" and labels.get("exported_pod"):
        return labels.get("exported_namespace", ""), labels["exported_pod"]
    if label_scheme == "exported":
        return "", ""
    return labels.get("namespace", ""), labels.get("pod", "")


def parse_result(samples, *, label_scheme: str = "auto") -> list[GpuSeries]:
    """Turn the query's vector (items with `.labels` and `.value`) into one `GpuSeries` per GPU."""
    out = []
    for item in samples:
        labels = item.labels
        ns, pod = workload_of(labels, label_scheme)
        if not pod:
            continue
        value = float(item.value)
        complete = value < GAP_OFFSET
        peak = None if math.isnan(value) else (value if complete else value - GAP_OFFSET)
        out.append(GpuSeries(ns, pod, labels.get("UUID") or labels.get("gpu") or labels.get("device", ""),
                             labels.get("modelName", ""), labels.get("Hostname", ""), peak, complete))
    return out


def _re2_literal(text: str) -> str:
    """A regex matching exactly `text` (escapes RE2's metacharacters only)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def utilization_history_promql(pods: list[tuple[str, str]], *, label_scheme: str = "auto") -> str:
    """Per-pod utilization (0–1, the busiest of its GPUs) for a range query: the run page's charts.

    Pod and namespace names are matched as escaped literals inside PromQL string literals."""
    if label_scheme not in SCHEMES:
        raise FilterError(f"label scheme must be one of {', '.join(SCHEMES)}, got {label_scheme!r}")
    namespaces = promql_string("|".join(sorted({_re2_literal(ns) for ns, _ in pods})))
    names = promql_string("|".join(sorted({_re2_literal(p) for _, p in pods})))
    parts = []
    for metric, scale in ((GR_ENGINE, ""), (GPU_UTIL, " / 100")):
        alts = []
        if label_scheme in ("auto", "pod"):
            extra = ',exported_pod=""' if label_scheme == "auto" else ""
            alts.append(f"max by (namespace, pod) ({metric}{{namespace=~{namespaces},pod=~{names}{extra}}}){scale}")
        if label_scheme in ("auto", "exported"):
            alts.append(f"max by (exported_namespace, exported_pod) "
                        f"({metric}{{exported_namespace=~{namespaces},exported_pod=~{names}}}){scale}")
        parts.append("(" + " or ".join(alts) + ")")
    return " or ".join(parts)
