"""What the demo controls do, against the simulated cluster of `make demo` only.

The demo runs two clocks that must agree, as a real deployment's do: the product's
(`config.clock`, wall time plus the seconds in `CLOCK_OFFSET_FILE`) and the simulated
cluster's. Moving time moves both, the cluster first, so a failure leaves them equal.

Load is the outside world, not the product: a model is made busy or idle the way its
users would, by the concurrency the simulated Knative autoscaler sees, and by what the
simulated DCGM exporter reports for its running pods.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings

from clusters import kube, labels
from clusters.errors import ConfigError, KubeError, NotFound
from clusters.models import Cluster
from clusters.services import cluster_resolve
from config import clock
from orgs.models import Org
from simcluster.control import SimControl, SimControlError
from simcluster.metrics import UTILIZATION_ANNOTATION

# The longest one advance may jump (seconds): a year is more than any demo walk needs,
# and a typo such as "2500h" should not throw the demo's clocks months ahead.
MAX_ADVANCE_SECONDS = 366 * 86400
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
# GPU utilization (percent) the exporter reports for a busy and an idle model: busy well
# above any sane idle threshold, idle at the 0% of a loaded model nobody asks anything.
BUSY_UTILIZATION = 90
IDLE_UTILIZATION = 0
# Knative's default concurrency target per pod when a revision sets none.
DEFAULT_TARGET_CONCURRENCY = 100.0
_HTTP_TIMEOUT = 120.0  # seconds; advancing a day of simulated time runs every timer in it


class DemoRefused(Exception):
    """Not against the demo: the control would act on something that is not simulated."""


class DemoInputError(ValueError):
    """A control's argument is wrong; nothing was changed."""


def duration_parse(text: str) -> float:
    """`90s`, `30m`, `25h`, `2d` or `1h30m` -> seconds. A number without a unit is refused:
    `25` read as seconds when 25 hours were meant moves the demo's clocks almost nowhere."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        raise DemoInputError(f"duration {text!r} has no unit: write {raw}s, {raw}m, {raw}h or {raw}d "
                             f"(seconds, minutes, hours, days)")
    if _DURATION.fullmatch(raw):
        seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(raw))
    else:
        raise DemoInputError(f"duration {text!r} is not a duration: write 90s, 30m, 25h, 2d or 1h30m")
    if not math.isfinite(seconds) or seconds <= 0:
        raise DemoInputError(f"duration {text!r} must be more than 0 seconds (the clocks only move forward)")
    if seconds > MAX_ADVANCE_SECONDS:
        raise DemoInputError(f"duration {text!r} is more than {MAX_ADVANCE_SECONDS // 86400} days")
    return seconds


def duration_text(seconds: float) -> str:
    """9000.0 -> '2h30m'; 0 -> '0s'."""
    total = int(round(seconds))
    if total == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return "".join(parts)


@dataclass(frozen=True)
class SimCluster:
    """The demo's simulated cluster, as the product sees it and as its control endpoint."""
    cluster: Cluster
    gateway: kube.KubeGateway
    url: str

    @property
    def control(self) -> SimControl:
        return SimControl(self.url, timeout=_HTTP_TIMEOUT)

    def _ask(self, what: str, call):
        """One call to the simulator's control endpoint; DemoRefused naming it when it fails."""
        try:
            return call()
        except SimControlError as exc:
            raise DemoRefused(f"the simulated cluster at {self.url} answered {exc.code} to {what}: {exc}") from None
        except (OSError, ValueError, KeyError) as exc:  # no answer, or an answer that is not the simulator's
            raise DemoRefused(f"the simulated cluster at {self.url} did not answer {what}: {exc!r}") from None

    def clock(self) -> datetime:
        now = self._ask("GET /simcluster/v1/clock", self.control.clock)
        return datetime.fromisoformat(now.replace("Z", "+00:00"))

    def advance(self, seconds: float) -> None:
        self._ask("POST /simcluster/v1/advance", lambda: self.control.advance(seconds))

    def set_load(self, namespace: str, revision: str, concurrency: float) -> None:
        self._ask(f"PUT /simcluster/v1/load/{namespace}/{revision}",
                  lambda: self.control.set_load(namespace, revision, concurrency))


def demo_cluster_require(*, command: str) -> SimCluster:
    """The demo's simulated cluster, or DemoRefused saying why this is not the demo."""
    if not settings.DEMO_MODE:
        raise DemoRefused(
            f"{command} runs only beside the demo started by `make demo` (DEMO_MODE is not set): it moves "
            "clocks and simulated load, which a real deployment must never do")
    try:
        cluster = cluster_resolve()
        gateway = kube.gateway_for(cluster)
    except (Cluster.DoesNotExist, ConfigError) as exc:
        raise DemoRefused(f"{command}: the demo's cluster is not reachable: {exc}") from None
    url = gateway.host.rstrip("/")
    sim = SimCluster(cluster=cluster, gateway=gateway, url=url)
    try:
        sim.clock()
    except DemoRefused as exc:
        raise DemoRefused(f"{command} refuses: cluster {cluster.name!r} at {url} is not the demo's simulated "
                          f"cluster ({exc})") from None
    return sim


# --- the clocks -------------------------------------------------------------------------
@dataclass(frozen=True)
class Clocks:
    product_now: datetime
    offset_seconds: float
    cluster_now: datetime


def demo_clocks_read(*, sim: SimCluster) -> Clocks:
    return Clocks(product_now=clock.now(), offset_seconds=clock.offset_seconds(),
                  cluster_now=sim.clock())


def _offset_write(path: Path, seconds: float) -> None:
    # Written whole and renamed, so web, worker and beat never read half a number.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".clock-offset-")
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(f"{seconds:.3f}\n")
    os.replace(tmp, path)


def demo_clock_advance(*, sim: SimCluster, seconds: float) -> Clocks:
    """Move the simulated cluster's clock, then the product's, forward by `seconds`."""
    if not settings.CLOCK_OFFSET_FILE:
        raise DemoRefused("CLOCK_OFFSET_FILE is not set: the product's clock cannot be moved "
                          "(`make demo` sets it in its environment file)")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_ADVANCE_SECONDS):
        raise DemoInputError(f"seconds must be between 0 and {MAX_ADVANCE_SECONDS}, got {seconds!r}")
    before = clock.offset_seconds()
    # IMPORTANT: the cluster first: if it refuses, the product's clock has not moved either.
    sim.advance(seconds)
    _offset_write(Path(settings.CLOCK_OFFSET_FILE), before + seconds)
    return demo_clocks_read(sim=sim)


# --- load -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadResult:
    namespace: str
    model: str
    revision: str
    busy: bool
    concurrency: float
    target: float
    utilization: int
    pods: list[str] = field(default_factory=list)


def _namespace_of(org_or_namespace: str) -> str:
    org = Org.objects.filter(slug=org_or_namespace).first()
    return org.namespace if org is not None else org_or_namespace


def demo_model_load_set(*, sim: SimCluster, model: str, busy: bool) -> LoadResult:
    """Make `org/model` busy or idle: its latest ready revision's concurrency, and the
    GPU utilization its running pods report."""
    owner, sep, name = model.partition("/")
    if not sep or not owner or not name:
        raise DemoInputError(f"model {model!r} must be written ORG/MODEL, e.g. acme/llama-3-8b")
    namespace = _namespace_of(owner)
    gateway = sim.gateway
    try:
        isvc = gateway.get(kube.INFERENCESERVICES, name, namespace=namespace)
    except NotFound:
        try:
            known = sorted(i["metadata"]["name"] for i in gateway.list(kube.INFERENCESERVICES, namespace=namespace))
        except KubeError:
            known = []
        raise DemoInputError(f"model {model!r}: no InferenceService {name!r} in namespace {namespace!r} "
                             f"(there: {', '.join(known) or 'none'})") from None
    predictor = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
    revision_name = predictor.get("latestReadyRevision") or predictor.get("latestCreatedRevision")
    if not revision_name:
        raise DemoInputError(f"model {model!r} has no Knative revision yet (raw deployment, or still starting)")
    revision = gateway.get(kube.REVISIONS, revision_name, namespace=namespace)
    annotations = (revision.get("metadata") or {}).get("annotations") or {}
    try:
        target = float(annotations.get(labels.TARGET_CONCURRENCY) or DEFAULT_TARGET_CONCURRENCY)
    except ValueError:
        target = DEFAULT_TARGET_CONCURRENCY
    utilization = BUSY_UTILIZATION if busy else IDLE_UTILIZATION
    # Busy: enough requests in flight to keep one pod at BUSY_UTILIZATION percent.
    concurrency = round(target * utilization / 100.0, 3)
    sim.set_load(namespace, revision_name, concurrency)
    patched = []
    for pod in gateway.list(kube.PODS, namespace=namespace,
                            label_selector=f"{labels.REVISION_LABEL}={revision_name}"):
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        pod_name = pod["metadata"]["name"]
        gateway.patch(kube.PODS, pod_name, {"metadata": {"annotations": {UTILIZATION_ANNOTATION: str(utilization)}}},
                      namespace=namespace)
        patched.append(pod_name)
    return LoadResult(namespace=namespace, model=name, revision=revision_name, busy=busy, concurrency=concurrency,
                      target=target, utilization=utilization, pods=patched)


def offset_in_words(seconds: float) -> str:
    return "wall-clock time" if not seconds else f"wall clock +{duration_text(seconds)}"

