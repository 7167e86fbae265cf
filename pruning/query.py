"""The PromQL of a prune run, built so that no filter text can change its shape.

Three instant queries, each answered in proportion to what looks idle or to the number
of namespaces, never with one series per GPU of the fleet:

1. The candidates (`IdleQuery.candidates_promql`): the pods with at least one GPU whose
   highest utilization (0–1) over the window stayed under the threshold —
   `DCGM_FI_PROF_GR_ENGINE_ACTIVE` where the exporter has it, else `DCGM_FI_DEV_GPU_UTIL / 100`
   (KUBERNETES.md, DCGM) — one series per pod. Prometheus filters, so at 10,000 GPUs with
   20 idle the answer is about 2 KB, not the 2.2 MB of one series per GPU. Each metric is
   filtered before the two are combined (a few pods more may come back, never fewer).
2. The census (`IdleQuery.census_promql`), sent at the same time as the candidates: the
   GPU pods reporting at the evaluation time (Prometheus' lookback, 5 minutes by default),
   counted per namespace — what a LIST would find, which is what the reads' cost model
   needs; their sum is the run's pods seen. An instant selection reads each series' last
   samples only: at 10,000 GPUs it answered in a third of the time of counting the pods
   with a sample anywhere in the window, a second walk of every sample of the window.
   Two queries side by side rather than one: PromQL evaluates a subexpression once per
   use, so one query cannot both name the candidates and count every pod from a single
   walk of the window. Measured at 10,000 GPUs (Prometheus 2.42, 2 cores): candidates
   100–108 ms, census 35–46 ms, both sent at once 117–139 ms; one query for both, the
   candidates `or` the per-pod peaks counted per namespace, 267–284 ms.
3. The follow-up (`IdleQuery.followup_promql`), only when there are candidates, its
   selectors naming the candidate pods so that it walks only their series: every GPU of
   those pods with its peak utilization (one busy GPU keeps the whole pod), the GPUs with
   a gap — some `step`-long slot of the window without a sample in the `max_gap` before
   it —, and their peak power draw (`DCGM_FI_DEV_POWER_USAGE`, watts) when the run has a
   power threshold, with the GPUs whose power data has such a gap (a peak read from part
   of the window proves a draw, never its absence). Each kind of series carries its name
   in the PART_LABEL label. Last, the candidates' GPUs that still report at the evaluation
   time (an instant selection: their last samples only): a candidate no longer reporting
   (its pod gone within the window, a Knative pod scaled away) is not among the census's
   pods, so the run's pods seen and busy count it apart.

Both label schemes are matched in the same query: `pod`/`namespace` series (no `exported_pod`
label) and `exported_pod`/`exported_namespace` series (honor_labels=false scrapes). With
`honor_labels=false` the plain `namespace` label is the exporter's own, so each scheme
filters on its own label and the two selections never overlap.

Filters are regular expressions (Prometheus' RE2, fully anchored, like gpu-pruner's
`=~` matchers). They go into the query only as a quoted PromQL string literal, escaped here;
the candidates' names go in as escaped literals.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from clusters.errors import PrometheusError

GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
POWER = "DCGM_FI_DEV_POWER_USAGE"   # watts
SCHEMES = ("auto", "pod", "exported")
# The label naming each kind of series in the follow-up's answer (no exporter label is called so).
PART_LABEL = "prune_part"
P_PEAK, P_GAP, P_WATTS, P_WATTS_GAP, P_REPORTING = "peak", "gap", "watts", "watts-gap", "reporting"
# Up to this many candidate pods the follow-up names them in its selectors (sent in the
# POST body, about 25 bytes each). Beyond, it walks every GPU series as one query per GPU
# would: measured at 10,000 GPUs, naming 2,000 pods answered in 0.13 s, walking all in 0.17 s.
FOLLOWUP_NAMES_MAX = 5000

# Constructs Python's `re` accepts but Go's RE2 (Prometheus) rejects: lookaround,
# backreferences, possessive/atomic groups, conditionals, `\Z` (RE2 has only `\z`).
_RE2_UNSUPPORTED = re.compile(r"\(\?(?:[=!]|<[=!]|>|\(|P=)|\\[1-9]|[*+?}]\+|(?<!\\)\\Z")
# RE2 refuses a repeat count over 1000 (Python's `re` takes any).
RE2_MAX_REPEAT = 1000
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
# Unicode classes RE2 has and Python's `re` does not (`\pL`, `\p{Greek}`, `\PN`): checked
# by Prometheus only; an escaped backslash is kept as it is.
_RE2_CLASS = re.compile(r"\\\\|\\[pP](?:\{\^?\w+\}|[A-Za-z])")


class FilterError(ValueError):
    """A namespace or GPU-model filter that is not a valid regular expression."""


def validate_regex(pattern: str, *, what: str) -> str:
    if not isinstance(pattern, str):
        raise FilterError(f"{what} filter must be text, got {type(pattern).__name__}")
    checked = _RE2_CLASS.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else "x", pattern)
    try:
        re.compile(checked)
    except re.error as exc:
        raise FilterError(f"{what} filter {pattern!r} is not a valid regular expression: {exc}") from None
    bad = _RE2_UNSUPPORTED.search(checked)
    if bad:
        raise FilterError(
            f"{what} filter {pattern!r} uses {bad.group(0)!r}, which Prometheus' RE2 regular "
            "expressions do not support (no lookaround, backreferences, possessive repeats or \\Z)")
    for repeat in _REPEAT.finditer(checked):
        if any(n and int(n) > RE2_MAX_REPEAT for n in repeat.groups()):
            raise FilterError(f"{what} filter {pattern!r} repeats {repeat.group(0)!r} times; Prometheus' RE2 "
                              f"regular expressions allow at most {RE2_MAX_REPEAT}")
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


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"a threshold must be a finite number, got {value!r}")
    return repr(float(value))


def _literals(names) -> str:
    """A PromQL string literal of a regex matching exactly these names."""
    return promql_string("|".join(sorted({_re2_literal(n) for n in names})))


@dataclass(frozen=True)
class IdleQuery:
    window_seconds: int = 1800
    namespace: str | None = None
    model_name: str | None = None
    label_scheme: str = "auto"
    step_seconds: int = 60
    max_gap_seconds: int = 120
    idle_threshold: float = 0.01
    power_threshold_watts: float | None = None   # None: power is not looked at

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
        _number(self.idle_threshold)
        if self.power_threshold_watts is not None:
            _number(self.power_threshold_watts)

    @property
    def expected_steps(self) -> int:
        return self.window_seconds // self.step_seconds

    @property
    def _by(self) -> str:
        """The labels naming a workload pod in this scheme (PromQL grouping)."""
        return {"pod": "namespace, pod", "exported": "exported_namespace, exported_pod",
                "auto": "namespace, pod, exported_namespace, exported_pod"}[self.label_scheme]

    def _selectors(self, metric: str, *, namespaces=None, pods=None) -> list[str]:
        return [s for _, s in self._scheme_selectors(metric, namespaces=namespaces, pods=pods)]

    def _scheme_selectors(self, metric: str | tuple[str, ...], *, namespaces=None,
                          pods=None) -> list[tuple[str, str]]:
        """(scheme, selector), one per label scheme in use; each filters on its own namespace
        label. `metric`: a metric name, or several (one selector matching any of them).
        `namespaces` / `pods`: also match only these names (the follow-up's candidates),
        given as the PromQL literals `_literals` made of them (built once per query: at 2,000
        candidates escaping their names for each of the query's selectors took 0.1 s)."""
        model = [f"modelName=~{promql_string(self.model_name)}"] if self.model_name is not None else []
        name = []
        if isinstance(metric, tuple):
            metric, name = "", [f"__name__=~{promql_string('|'.join(metric))}"]
        out = []
        for scheme, pod_label, ns_label in (("pod", "pod", "namespace"),
                                             ("exported", "exported_pod", "exported_namespace")):
            if self.label_scheme not in ("auto", scheme):
                continue
            # The named pods first, and then no `!=""` on their label (a pod's name is never
            # empty): Prometheus then reads the postings of just those names, where a
            # `!=""` matcher walks every value of the label (the follow-up at 20 idle of
            # 10,000 pods: 16 ms with it, 5 ms without).
            m = [f"{pod_label}=~{pods}"] if pods is not None else [f'{pod_label}!=""']
            if namespaces is not None:
                m.append(f"{ns_label}=~{namespaces}")
            if self.namespace is not None:
                m.append(f"{ns_label}=~{promql_string(self.namespace)}")
            if scheme == "pod" and self.label_scheme == "auto":
                m.append('exported_pod=""')
            out.append((scheme, metric + "{" + ",".join(name + m + model) + "}"))
        return out

    def _per_gpu(self, fn, **match) -> str:
        # `or` keeps GR_ENGINE for a GPU and adds GPU_UTIL only for GPUs without it (set
        # operators match on all labels but the metric name).
        gr = " or ".join(fn(s, scale="") for s in self._selectors(GR_ENGINE, **match))
        util = " or ".join(fn(s, scale=" / 100") for s in self._selectors(GPU_UTIL, **match))
        return f"({gr}) or ({util})"

    def candidates_promql(self) -> str:
        """One series per pod with a GPU under the threshold (its value: how many).

        Each metric's peaks are filtered under the threshold before anything else, so that
        the `or`s and GPU_UTIL's scaling handle the few idle GPUs, not every GPU (at 10,000
        GPUs: 0.06 s instead of 0.10 s). GPU_UTIL's peak is first compared in its own unit
        with a bound a hair above 100 × the threshold (rounding can never drop a GPU there),
        then scaled and compared exactly as the follow-up does. This answer may hold a few
        more pods than are idle — a GPU whose GR_ENGINE is busy while its GPU_UTIL is not,
        since GR_ENGINE's precedence is not applied here —, never fewer: the follow-up reads
        their peaks with the precedence and they count as busy."""
        w, by, threshold = _duration(self.window_seconds), self._by, _number(self.idle_threshold)
        percent = _number(self.idle_threshold * 100 * (1 + 1e-9))
        # A GPU whose peak is NaN is never under the threshold: its pod is not a candidate.
        parts = [f"max_over_time({s}[{w}]) < {threshold}" for s in self._selectors(GR_ENGINE)]
        parts += [f"(max_over_time({s}[{w}]) < {percent}) / 100 < {threshold}" for s in self._selectors(GPU_UTIL)]
        return f"count by ({by}) ({' or '.join(parts)})"

    def census_promql(self) -> str:
        """The GPU pods reporting at the evaluation time, counted per namespace (per scheme,
        each on its own namespace label). One selector per scheme matches both utilization
        metrics (a GPU with both is one pod either way): at 10,000 GPUs 0.044 s where
        `or`-ing a selector per metric took 0.062 s."""
        parts = []
        for scheme, ns_label, pod_label in (("pod", "namespace", "pod"),
                                             ("exported", "exported_namespace", "exported_pod")):
            for sch, present in self._scheme_selectors((GR_ENGINE, GPU_UTIL)):
                if sch == scheme:
                    parts.append(f"count by ({ns_label}) (group by ({ns_label}, {pod_label}) ({present}))")
        return " or ".join(parts)

    def presence_promql(self) -> str:
        """How many GPU utilization series (any pod, or none) have a sample at the evaluation
        time: sent only when the census found no GPU pod, to tell a cluster whose GPUs carry
        no pod from data that is missing (a scrape outage, a time ahead of the data). No
        filter applies: filters that match no GPU are no missing data."""
        return f"count({{__name__=~{promql_string(GR_ENGINE + '|' + GPU_UTIL)}}})"

    def followup_promql(self, pods) -> str:
        """Every GPU of the candidate `pods` [(namespace, pod)]: peaks, gaps, power."""
        pods = list(pods)
        w, gap, step = _duration(self.window_seconds), _duration(self.max_gap_seconds), _duration(self.step_seconds)
        match = (dict(namespaces=_literals({ns for ns, _ in pods}), pods=_literals({p for _, p in pods}))
                 if len(pods) <= FOLLOWUP_NAMES_MAX else {})
        peaks = self._per_gpu(lambda s, scale: f"max_over_time({s}[{w}]){scale}", **match)

        def slots(s, scale=""):
            # The subquery's steps are aligned to multiples of `step`: a series sampled only
            # after the last of them (the last seconds of the window) has no slot at all and
            # would come back from no count. Its samples of the last step count as 0 slots.
            return (f"(count_over_time(count_over_time({s}[{gap}])[{w}:{step}]) "
                    f"or max_over_time({s}[{step}]) * 0)")

        # Fewer sampled slots than the window holds: a gap (only those GPUs come back).
        parts = [_tag(f"({peaks})", P_PEAK),
                 _tag(f"(({self._per_gpu(slots, **match)}) < {self.expected_steps})", P_GAP),
                 _tag(f"({self._per_gpu(lambda s, scale: s, **match)})", P_REPORTING)]
        if self.power_threshold_watts is not None:
            watts = " or ".join(f"max_over_time({s}[{w}])" for s in self._selectors(POWER, **match))
            parts.append(_tag(f"({watts})", P_WATTS))
            # As for utilization: a power series sampled over part of the window only. Its
            # peak proves a draw, never the absence of one (planning: missing power data).
            watt_slots = " or ".join(slots(s) for s in self._selectors(POWER, **match))
            parts.append(_tag(f"(({watt_slots}) < {self.expected_steps})", P_WATTS_GAP))
        return " or ".join(parts)


def _tag(expr: str, part: str) -> str:
    return f'label_replace({expr}, "{PART_LABEL}", "{part}", "", "")'


@dataclass(frozen=True)
class GpuSeries:
    """One GPU of one pod as the queries saw it."""
    namespace: str
    pod: str
    gpu: str
    model: str
    hostname: str
    max_utilization: float | None   # None: no usable value (NaN)
    complete: bool                  # samples throughout the window, no gap
    max_power_watts: float | None = None   # None: no power sample (or power not asked for)
    power_complete: bool = True            # power samples throughout the window (when asked for)
    reporting: bool = True                 # a sample at the evaluation time (the census counts its pod)


@dataclass(frozen=True)
class IdleAnswer:
    """What Prometheus said: every GPU of the candidate pods, and the GPU pods reporting at
    the evaluation time (in all and per namespace)."""
    series: tuple[GpuSeries, ...]
    pods_seen: int
    pods_per_namespace: dict = field(default_factory=dict)   # candidate namespace -> GPU pods seen there


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


def _gpu_id(labels: dict) -> str:
    return labels.get("UUID") or labels.get("gpu") or labels.get("device", "")


def parse_candidates(samples, *, label_scheme: str = "auto") -> set[tuple[str, str]]:
    """The candidates query's answer (items with `.labels` and `.value`): the candidate
    pods {(namespace, pod)}."""
    pods = set()
    for item in samples:
        ns, pod = workload_of(item.labels, label_scheme)
        if pod:
            pods.add((ns, pod))
    return pods


def parse_census(samples) -> tuple[int, dict]:
    """The census's answer: the GPU pods reporting and {namespace: GPU pods reporting there}."""
    per_ns: dict[str, int] = {}
    for item in samples:
        labels = item.labels
        ns = labels.get("exported_namespace") or labels.get("namespace", "")
        value = float(item.value)
        # A count is a whole number >= 0; anything else is no census (NaN would crash int()).
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise PrometheusError(f"unexpected answer from Prometheus: the census counted {value:g} GPU pods "
                                  f"in namespace {ns!r}, not a whole number")
        per_ns[ns] = per_ns.get(ns, 0) + int(value)
    return sum(per_ns.values()), per_ns


def parse_followup(samples, *, pods, label_scheme: str = "auto") -> tuple[GpuSeries, ...]:
    """The follow-up's answer: one `GpuSeries` per GPU of the candidate `pods`."""
    wanted = set(pods)
    peaks, gappy, watts, watts_gappy, reporting = {}, set(), {}, set(), set()
    for item in samples:
        labels, value = item.labels, float(item.value)
        part = labels.get(PART_LABEL)
        ns, pod = workload_of(labels, label_scheme)
        if (ns, pod) not in wanted:   # a name shared by two candidate namespaces
            continue
        key = (ns, pod, _gpu_id(labels))
        if part == P_PEAK:
            peaks[key] = (labels, None if math.isnan(value) else value)
        elif part == P_GAP:
            gappy.add(key)
        elif part == P_WATTS and not math.isnan(value):
            watts[key] = value
        elif part == P_WATTS_GAP:
            watts_gappy.add(key)
        elif part == P_REPORTING:
            reporting.add(key)
    return tuple(GpuSeries(ns, pod, gpu, labels.get("modelName", ""), labels.get("Hostname", ""), peak,
                           (ns, pod, gpu) not in gappy, watts.get((ns, pod, gpu)), (ns, pod, gpu) not in watts_gappy,
                           (ns, pod, gpu) in reporting)
                 for (ns, pod, gpu), (labels, peak) in sorted(peaks.items()))


_RE2_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def _re2_literal(text: str) -> str:
    """A regex matching exactly `text` (escapes RE2's metacharacters only)."""
    return _RE2_META.sub(r"\\\1", text)


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
