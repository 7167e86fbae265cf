"""What the product saved, from what it recorded: GPU-hours freed per mechanism, per UTC day
and per org, whole nodes freed, and the GPUs held warm by orgs exempt from scale to zero.

Pure: the facts (recorded decisions, plus the GPU counts read from the cluster) and `now`
in, a `SavingsReport` out. Every number says what it is computed from (`MECHANISM_BASIS`);
what the product does not record is left out and named in the notes, never guessed.
"""
from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta, timezone

DORMANCY, PRUNING, DRAIN, BINPACK = "dormancy", "pruning", "defrag/drain", "binpack"
MECHANISMS = (DORMANCY, PRUNING, DRAIN, BINPACK)
NO_ORG = "(whole nodes)"   # a drained or binpack-freed node's GPUs belong to no one org
# What a page or a CSV shows, in GPU-hours: 0.01 GPU-hour is 36 GPU-seconds. Each row is
# rounded to it once, and every total shown is the exact sum of rounded rows.
SHOWN = Decimal("0.01")
CENTS = Decimal("0.01")    # money: each row's hours (as shown) × its model's price, rounded to cents once
UNKNOWN_MODEL = ""         # a row whose GPU model cannot be known: GPU-hours only, no money
DAYS_MAX = 366             # the longest window a page or an export may ask for

MECHANISM_BASIS = {
    DORMANCY: "each workload's min-scale floor the scale-to-zero switch lowered to 0 (the audit's old value) "
              "× GPUs per replica its spec asks for now × hours until the product raised it again, or its org "
              "woke or had scale to zero turned off, whichever came first (or now)",
    PRUNING: "each pod of an owner the pruner scaled to zero: GPUs seen in its utilization data × hours from "
             "the action until its restore (or now), less the hours its org's dormancy already holds the same "
             "workload at zero (those are counted once, under dormancy)",
    DRAIN: "each drained node: its allocatable GPUs × hours from the drain until it was returned to service "
           "(or now)",
    BINPACK: "each GPU node a binpack run (one that wrote) marked to be emptied first (its pods carry the lowest "
             "deletion cost of their workload) and that a check every 2 minutes then saw with no GPU pod, or gone "
             "from the cluster, within an hour of the mark, while every workload that held it still ran pods "
             "elsewhere: its allocatable GPUs × hours from that first sighting until the last sighting free before "
             "it held GPU pods again or one of those workloads went to zero pods (or now). A node emptied because "
             "a workload went to zero (dormancy, the pruner, a deletion) is not binpack's; hours a defrag job "
             "held the node drained are counted once, under defrag/drain",
}


class SavingsInputError(ValueError):
    """A window that cannot be computed (days out of range, an end before the start)."""


@dataclass(frozen=True)
class FloorChange:
    """One audited min-scale change of a workload the org switch owns.

    `workload` is "<target> <namespace>/<name>" (ksvc, revision, podautoscaler); `old` and
    `new` the min-scale texts before and after ("unset" when absent)."""

    org: str
    workload: str
    at: datetime
    old: str
    new: str


@dataclass(frozen=True)
class PruneAction:
    """One pod of an owner the pruner scaled to zero."""

    org: str
    subject: str          # "Deployment ns/name (pod ns/pod)"
    gpus: int             # GPU UUIDs seen in the pod's utilization data
    acted_at: datetime
    restored_at: datetime | None
    namespace: str = ""
    pod: str = ""
    owner_kind: str = ""
    owner_name: str = ""


@dataclass(frozen=True)
class NodeDrain:
    """A node a defrag job drained, and when (if ever) it was returned to service."""

    node: str
    job_id: int
    drained_at: datetime
    returned_at: datetime | None
    gpus_moved: int       # GPUs of the pods the job found on the node (a lower bound of its GPUs)


@dataclass(frozen=True)
class BinpackNodeFree:
    """A GPU node binpack marked to be emptied first, seen free from `freed_at` until
    `ended_at` (None: free now)."""

    node: str
    run_id: int
    gpus: int             # its allocatable GPUs when marked
    freed_at: datetime
    ended_at: datetime | None
    gpu_model: str = UNKNOWN_MODEL   # its label nvidia.com/gpu.product when marked
    removed_at: datetime | None = None   # first seen gone from the cluster


@dataclass(frozen=True)
class ExemptOrg:
    org: str
    dormant: bool
    gpus_held: int | None   # GPUs its pods hold now; None when the cluster could not be read
    why: str = ""           # scale to zero turned off, or the operator's exemption or snooze


@dataclass(frozen=True)
class Interval:
    """GPUs freed from `start` to `end` by one mechanism, for one org (or NO_ORG)."""

    mechanism: str
    org: str
    subject: str
    gpus: int
    start: datetime
    end: datetime
    ongoing: bool
    note: str = ""
    gpu_model: str = UNKNOWN_MODEL   # the node label nvidia.com/gpu.product of the GPUs freed

    @property
    def gpu_hours(self) -> float:
        return self.gpus * max((self.end - self.start).total_seconds(), 0.0) / 3600.0


@dataclass(frozen=True)
class Facts:
    floor_changes: tuple[FloorChange, ...] = ()
    scale_to_zero_offs: dict[str, tuple[datetime, ...]] = field(default_factory=dict)   # org -> wakes, disallows
    gpus_per_replica: dict[str, int] | None = None    # workload -> GPUs; None: the cluster was not read
    prune_actions: tuple[PruneAction, ...] = ()
    drains: tuple[NodeDrain, ...] = ()
    node_gpus: dict[str, int] | None = None           # node -> allocatable GPUs now; None: not read
    nodes_schedulable: frozenset[str] = frozenset()   # nodes taking new pods now
    exempt: tuple[ExemptOrg, ...] = ()
    cluster_error: str = ""
    node_models: dict[str, str] | None = None          # node -> its GPU model now; None: not read
    namespace_models: dict[str, str] = field(default_factory=dict)   # namespace -> the one GPU model its pods use
    prices: dict[str, Decimal] = field(default_factory=dict)          # GPU model -> price per GPU-hour
    binpack_frees: tuple[BinpackNodeFree, ...] = ()


@dataclass(frozen=True)
class Row:
    day: date
    org: str
    mechanism: str
    gpu_hours: float
    gpu_model: str = UNKNOWN_MODEL


@dataclass
class SavingsReport:
    start: datetime
    end: datetime
    days: list[date]
    intervals: list[Interval]
    rows: list[Row]                                  # (day, org, mechanism) with GPU-hours > 0
    by_day: dict[date, dict[str, float]]
    by_org: dict[str, dict[str, float]]
    totals: dict[str, float]
    nodes_freed: list[Interval]                      # drains in the window
    nodes_freed_now: int                             # of those, still out of service now
    exempt: list[ExemptOrg]
    notes: list[str] = field(default_factory=list)
    prices: dict[str, Decimal] = field(default_factory=dict)
    binpack_nodes: list[Interval] = field(default_factory=list)   # binpack-freed node intervals in the window
    binpack_nodes_now: int = 0                       # nodes of those still counted free now

    @property
    def binpack_node_count(self) -> int:
        """Distinct nodes among `binpack_nodes` (one node freed twice, or split by a drain, is one)."""
        return len({_node_of(i) for i in self.binpack_nodes})

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.totals.values())

    def shown(self) -> Shown:
        """The figures a page or a CSV shows: rows rounded once, totals summed from them."""
        return figures_shown(self)

    def chart_config(self) -> dict:
        """A Chart.js stacked bar config: GPU-hours per UTC day, one dataset per mechanism,
        from the rounded rows, so the bars add up to the totals beside them."""
        colours = {DORMANCY: "#3b7dd8", PRUNING: "#e07b39", DRAIN: "#3fa34d", BINPACK: "#9a9a9a"}
        figures = self.shown()
        return {
            "type": "bar",
            "data": {"labels": [d.isoformat() for d in self.days],
                     "datasets": [{"label": m,
                                   "data": [float(figures.by_day[d][m]) for d in self.days],
                                   "backgroundColor": colours[m]} for m in MECHANISMS]},
            "options": {"responsive": True, "maintainAspectRatio": False, "animation": False,
                        "plugins": {"title": {"display": True, "text": "GPU-hours freed per day, by mechanism"}},
                        "scales": {"x": {"stacked": True, "title": {"display": True, "text": "day (UTC)"}},
                                   "y": {"stacked": True, "beginAtZero": True,
                                         "title": {"display": True, "text": "GPU-hours freed"}}}},
        }


@dataclass(frozen=True)
class Shown:
    """A report's figures as shown, in GPU-hours rounded to SHOWN. Only `rows` are rounded;
    every other figure is their exact sum, so a total equals the sum of what is shown beside
    it (a headline of 0.0 against a bar of 0.02, or 1.9 against rows of 0.7 + 0.7 + 0.6,
    cannot happen). Rows that round to 0 are left out of all of them."""

    rows: list[tuple[Row, Decimal]]
    by_day: dict[date, dict[str, Decimal]]
    by_org: dict[str, dict[str, Decimal]]       # biggest total first
    totals: dict[str, Decimal]
    # Money, in the prices' currency: each row's shown hours × its GPU model's price, rounded
    # to cents once (None: the model is unknown or has no price, never 0); the rest are sums.
    row_money: list[Decimal | None] = field(default_factory=list)
    money_by_day: dict[date, dict[str, Decimal]] = field(default_factory=dict)
    money_by_org: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    money_totals: dict[str, Decimal] = field(default_factory=dict)
    unpriced: dict[str, Decimal] = field(default_factory=dict)     # GPU model without a price -> hours shown
    unknown_rows: int = 0                                          # rows whose GPU model is unknown
    unknown_hours: Decimal = Decimal("0.00")
    # GPU-hours shown that count no money (model unknown or without a price), per cell
    unpriced_by_day: dict[date, dict[str, Decimal]] = field(default_factory=dict)
    unpriced_by_org: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    unpriced_totals: dict[str, Decimal] = field(default_factory=dict)

    @property
    def total(self) -> Decimal:
        return sum(self.totals.values(), Decimal(0))

    @property
    def money_total(self) -> Decimal:
        return sum(self.money_totals.values(), Decimal("0.00"))


def figures_shown(report: SavingsReport) -> Shown:
    rows = [(row, Decimal(repr(row.gpu_hours)).quantize(SHOWN, rounding=ROUND_HALF_UP)) for row in report.rows]
    rows = [(row, hours) for row, hours in rows if hours > 0]
    zero = Decimal("0.00")
    by_day = {d: {m: zero for m in MECHANISMS} for d in report.days}
    by_org: dict[str, dict[str, Decimal]] = {}
    totals = {m: zero for m in MECHANISMS}
    money_by_day = {d: {m: zero for m in MECHANISMS} for d in report.days}
    money_by_org: dict[str, dict[str, Decimal]] = {}
    money_totals = {m: zero for m in MECHANISMS}
    row_money: list[Decimal | None] = []
    unpriced: dict[str, Decimal] = {}
    unknown_rows, unknown_hours = 0, zero
    unpriced_by_day = {d: {m: zero for m in MECHANISMS} for d in report.days}
    unpriced_by_org: dict[str, dict[str, Decimal]] = {}
    unpriced_totals = {m: zero for m in MECHANISMS}
    for row, hours in rows:
        by_day[row.day][row.mechanism] += hours
        by_org.setdefault(row.org, {m: zero for m in MECHANISMS})[row.mechanism] += hours
        totals[row.mechanism] += hours
        money_by_org.setdefault(row.org, {m: zero for m in MECHANISMS})
        unpriced_by_org.setdefault(row.org, {m: zero for m in MECHANISMS})
        price = report.prices.get(row.gpu_model) if row.gpu_model != UNKNOWN_MODEL else None
        if price is None:
            row_money.append(None)
            unpriced_by_day[row.day][row.mechanism] += hours
            unpriced_by_org[row.org][row.mechanism] += hours
            unpriced_totals[row.mechanism] += hours
            if row.gpu_model == UNKNOWN_MODEL:
                unknown_rows, unknown_hours = unknown_rows + 1, unknown_hours + hours
            else:
                unpriced[row.gpu_model] = unpriced.get(row.gpu_model, zero) + hours
            continue
        money = (hours * price).quantize(CENTS, rounding=ROUND_HALF_UP)
        row_money.append(money)
        money_by_day[row.day][row.mechanism] += money
        money_by_org[row.org][row.mechanism] += money
        money_totals[row.mechanism] += money
    return Shown(rows=rows, by_day=by_day, totals=totals,
                 by_org=dict(sorted(by_org.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))),
                 row_money=row_money, money_by_day=money_by_day, money_by_org=money_by_org,
                 money_totals=money_totals, unpriced=dict(sorted(unpriced.items())), unknown_rows=unknown_rows,
                 unknown_hours=unknown_hours, unpriced_by_day=unpriced_by_day, unpriced_by_org=unpriced_by_org,
                 unpriced_totals=unpriced_totals)


def window(*, now: datetime, days: object) -> tuple[datetime, list[date]]:
    """The window of `days` whole UTC days ending with today's (partial) one."""
    if isinstance(days, bool) or not isinstance(days, int):
        try:
            text = str(days).strip()
            if not re.fullmatch(r"[0-9]{1,4}", text):
                raise ValueError
            days = int(text)
        except ValueError:
            raise SavingsInputError(f"days must be a whole number from 1 to {DAYS_MAX}, got {days!r}") from None
    if not 1 <= days <= DAYS_MAX:
        raise SavingsInputError(f"days must be from 1 to {DAYS_MAX}, got {days}")
    today = now.astimezone(timezone.utc).date()
    first = today - timedelta(days=days - 1)
    return datetime.combine(first, time(), tzinfo=timezone.utc), [first + timedelta(days=i) for i in range(days)]


def _replicas(text: str) -> int:
    """A min-scale value as replicas; "unset" or anything unparsable counts 0 (never overclaim)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return 0
    return int(value) if math.isfinite(value) and value > 0 else 0


def dormancy_intervals(changes: tuple[FloorChange, ...], gpus_per_replica: dict[str, int] | None, *,
                       now: datetime, scale_to_zero_offs: dict[str, tuple[datetime, ...]] | None = None
                       ) -> tuple[list[Interval], list[str]]:
    """Per workload: from the audited change that lowered its floor to 0 until the one that
    raised it again, or until its org's scale to zero was next switched off (a wake, or an
    operator's disallow), whichever comes first. A wake need not patch the workload (its
    floor may still be the pruner's 0, or its revision was replaced), yet from then on the
    org no longer holds it at zero. A second lowering while one is open (a drift repair)
    closes the first there: the workload had been raised in between, at a time not recorded."""
    intervals, notes = [], []
    open_: dict[str, FloorChange] = {}
    unknown: set[str] = set()
    offs = {org: sorted(times) for org, times in (scale_to_zero_offs or {}).items()}

    def close(start: FloorChange, end: datetime, ongoing: bool) -> None:
        times = offs.get(start.org, ())
        later = bisect_right(times, start.at)
        if later < len(times) and times[later] < end:
            end, ongoing = times[later], False
        floor = _replicas(start.old)
        if floor == 0:
            return   # the owner let it sleep anyway: nothing saved by the switch
        if gpus_per_replica is None or start.workload not in gpus_per_replica:
            unknown.add(start.workload)
            return
        gpus = floor * gpus_per_replica[start.workload]
        if gpus:
            intervals.append(Interval(DORMANCY, start.org, start.workload, gpus, start.at, end, ongoing,
                                      note=f"floor {floor} × {gpus_per_replica[start.workload]} GPU(s)"))

    for change in sorted(changes, key=lambda c: (c.at, c.workload)):
        lowered = _replicas(change.new) == 0 and change.new != change.old
        if lowered:
            if change.workload in open_:
                close(open_[change.workload], change.at, False)
            open_[change.workload] = change
        elif change.workload in open_ and _replicas(change.new) > 0:
            close(open_.pop(change.workload), change.at, False)
    for start in open_.values():
        close(start, now, True)
    if unknown:
        why = "the cluster could not be read" if gpus_per_replica is None else "they are gone from the cluster"
        notes.append(f"dormancy: {len(unknown)} workload(s) not counted, their GPUs per replica unknown ({why}): "
                     + ", ".join(sorted(unknown)[:5]) + (" …" if len(unknown) > 5 else ""))
    return intervals, notes


# A Knative pod is named "<revision>-deployment-<hash>-<suffix>", and a Service's revisions
# "<service>-<5 digits>" unless their template names them (knative/serving's naming).
_KNATIVE_POD = re.compile(r"(?P<revision>.+)-deployment-[a-z0-9]+-[a-z0-9]+")


def _holds_pod(workload: str, action: PruneAction) -> bool:
    """Whether the dormancy `workload` ("ksvc ns/name", "revision ns/name", "podautoscaler
    ns/name") is the one whose pod the pruner's `action` scaled down."""
    kind, _, where = workload.partition(" ")
    namespace, _, name = where.partition("/")
    if not action.namespace or namespace != action.namespace:
        return False
    pod = _KNATIVE_POD.fullmatch(action.pod)
    revision = pod.group("revision") if pod else None
    if kind == "ksvc":
        return (action.owner_kind == "Service" and action.owner_name == name) \
            or bool(revision and re.fullmatch(rf"{re.escape(name)}-[0-9]{{5}}", revision))
    return kind in ("revision", "podautoscaler") and revision == name


def prune_intervals(actions: tuple[PruneAction, ...], *, now: datetime,
                    dormancy: list[Interval] | tuple[Interval, ...] = ()) -> tuple[list[Interval], list[str]]:
    """Each pruned pod's GPUs from the action until its restore (or now). Hours when its
    org's dormancy already held the same workload at zero are left out: one GPU freed by
    both at once is counted once, under dormancy, which counts the workload's whole floor."""
    intervals, overlapped = [], 0.0
    # Each pruned pod is compared with its own namespace's dormancy only: the page reads weeks
    # of records, thousands on each side.
    by_namespace: dict[str, list[Interval]] = defaultdict(list)
    for d in dormancy:
        by_namespace[d.subject.partition(" ")[2].partition("/")[0]].append(d)
    for a in actions:
        if a.gpus <= 0:
            continue
        end, ongoing = a.restored_at or now, a.restored_at is None
        held = sorted((d.start, d.end) for d in by_namespace.get(a.namespace, ())
                      if d.end > a.acted_at and d.start < end and _holds_pod(d.subject, a))
        lo = a.acted_at
        for start, stop in held + [(end, end)]:
            if start > lo:
                piece_end = min(start, end)
                intervals.append(Interval(PRUNING, a.org, a.subject, a.gpus, lo, piece_end,
                                          ongoing and piece_end == end))
            if stop > lo:
                overlapped += a.gpus * (min(stop, end) - max(start, lo)).total_seconds() / 3600.0
            lo = max(lo, stop)
            if lo >= end:
                break
    notes = [f"pruning: {overlapped:.1f} GPU-hour(s) of pods the pruner scaled down while their org's dormancy "
             f"held the same workload at zero are counted once, under dormancy"] if overlapped > 0 else []
    return intervals, notes


def drain_intervals(drains: tuple[NodeDrain, ...], node_gpus: dict[str, int] | None, *,
                    now: datetime, schedulable: frozenset[str] = frozenset()) -> tuple[list[Interval], list[str]]:
    intervals, lower_bound, outside = [], [], []
    for d in drains:
        if d.returned_at is None and d.node in schedulable:
            outside.append(d.node)   # uncordoned outside the product: when is not recorded
            continue
        gpus = (node_gpus or {}).get(d.node)
        note = ""
        if gpus is None:
            gpus, note = d.gpus_moved, "node not in the cluster now: GPUs of the pods moved off it (a lower bound)"
            lower_bound.append(d.node)
        intervals.append(Interval(DRAIN, NO_ORG, f"node {d.node} (defrag job #{d.job_id})", gpus, d.drained_at,
                                  d.returned_at or now, d.returned_at is None, note=note))
    notes = [f"defrag/drain: {len(lower_bound)} node(s) no longer in the cluster ({', '.join(sorted(lower_bound)[:5])}"
             f"{' …' if len(lower_bound) > 5 else ''}) count the GPUs of the pods moved off them, a lower bound"
             ] if lower_bound else []
    if outside:
        notes.append(f"defrag/drain: {len(outside)} drained node(s) take pods again but no return to service was "
                     f"recorded (uncordoned outside the product, time unknown): not counted "
                     f"({', '.join(sorted(outside)[:5])}{' …' if len(outside) > 5 else ''})")
    return intervals, notes


def binpack_intervals(frees: tuple[BinpackNodeFree, ...], *, now: datetime,
                      drains: tuple[NodeDrain, ...] = ()) -> tuple[list[Interval], list[str]]:
    """Each binpack-freed node's GPUs from its first sighting free until its count stopped
    (or now). Hours a defrag job held the same node drained (from its drain until its return
    to service, or now) are left out: that node's GPUs are counted once, under defrag/drain."""
    intervals, overlapped = [], 0.0
    drained: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for d in drains:
        drained[d.node].append((d.drained_at, d.returned_at or now))
    for f in frees:
        if f.gpus <= 0:
            continue
        end, ongoing = min(f.ended_at or now, now), f.ended_at is None
        subject = f"node {f.node} (binpack run #{f.run_id})"
        note = "removed from the cluster" if f.removed_at is not None else ""
        lo = f.freed_at
        for start, stop in sorted(drained.get(f.node, ())) + [(end, end)]:
            if start > lo:
                piece_end = min(start, end)
                intervals.append(Interval(BINPACK, NO_ORG, subject, f.gpus, lo, piece_end,
                                          ongoing and piece_end == end, note=note, gpu_model=f.gpu_model))
            if stop > lo and start < end:
                overlapped += f.gpus * (min(stop, end) - max(start, lo)).total_seconds() / 3600.0
            lo = max(lo, stop)
            if lo >= end:
                break
    notes = [f"binpack: {overlapped:.1f} GPU-hour(s) of nodes binpack freed while a defrag job held them drained are "
             f"counted once, under defrag/drain"] if overlapped > 0 else []
    return intervals, notes


def _split_by_day(interval: Interval, start: datetime, end: datetime):
    """(UTC day, GPU-hours) of the part of `interval` inside [start, end)."""
    lo, hi = max(interval.start, start), min(interval.end, end)
    while lo < hi:
        day = lo.astimezone(timezone.utc).date()
        day_end = datetime.combine(day + timedelta(days=1), time(), tzinfo=timezone.utc)
        upto = min(hi, day_end)
        yield day, interval.gpus * (upto - lo).total_seconds() / 3600.0
        lo = upto


def _node_of(interval: Interval) -> str:
    """The node a drain's or binpack's interval is of ("node <name> (…)")."""
    return interval.subject.removeprefix("node ").partition(" ")[0]


def gpu_model_of(interval: Interval, facts: Facts) -> str:
    """The GPU model of what `interval` freed, or UNKNOWN_MODEL. A drained node: its own label
    nvidia.com/gpu.product. A pruned pod or a dormant workload (neither records its node): the
    one model its namespace's GPU pods run on now. Else, a cluster of one GPU model: that model."""
    if interval.mechanism == BINPACK:
        return interval.gpu_model     # the node's label when marked: it may be gone from the cluster now
    if interval.mechanism == DRAIN:
        node = _node_of(interval)
        if facts.node_models and facts.node_models.get(node):
            return facts.node_models[node]
    else:
        namespace = interval.subject.partition(" ")[2].partition("/")[0]
        if facts.namespace_models.get(namespace):
            return facts.namespace_models[namespace]
    models = {m for m in (facts.node_models or {}).values() if m}
    return next(iter(models)) if len(models) == 1 else UNKNOWN_MODEL


def savings_plan(facts: Facts, *, now: datetime, days: object = 14) -> SavingsReport:
    """The savings of the last `days` UTC days (today included, up to `now`)."""
    start, day_list = window(now=now, days=days)
    dormancy, notes = dormancy_intervals(facts.floor_changes, facts.gpus_per_replica, now=now,
                                         scale_to_zero_offs=facts.scale_to_zero_offs)
    drains, drain_notes = drain_intervals(facts.drains, facts.node_gpus, now=now,
                                          schedulable=facts.nodes_schedulable)
    prunes, prune_notes = prune_intervals(facts.prune_actions, now=now, dormancy=dormancy)
    binpacked, binpack_notes = binpack_intervals(facts.binpack_frees, now=now, drains=facts.drains)
    intervals = [replace(i, gpu_model=gpu_model_of(i, facts)) for i in dormancy + prunes + drains + binpacked]
    drains = [i for i in intervals if i.mechanism == DRAIN]
    notes = ([f"the cluster could not be read: {facts.cluster_error}"] if facts.cluster_error else []) \
        + notes + prune_notes + drain_notes + binpack_notes

    cells: dict[tuple[date, str, str, str], float] = defaultdict(float)
    for interval in intervals:
        for day, hours in _split_by_day(interval, start, now):
            cells[(day, interval.org, interval.mechanism, interval.gpu_model)] += hours
    rows = [Row(day, org, mech, hours, model) for (day, org, mech, model), hours in sorted(cells.items())
            if hours > 0]
    by_day = {d: {m: 0.0 for m in MECHANISMS} for d in day_list}
    by_org: dict[str, dict[str, float]] = {}
    totals = {m: 0.0 for m in MECHANISMS}
    for row in rows:
        by_day[row.day][row.mechanism] += row.gpu_hours
        by_org.setdefault(row.org, {m: 0.0 for m in MECHANISMS})[row.mechanism] += row.gpu_hours
        totals[row.mechanism] += row.gpu_hours
    in_window = [i for i in drains if i.end > start and i.start < now]
    binpack_nodes = [i for i in intervals if i.mechanism == BINPACK and i.end > start and i.start < now]
    return SavingsReport(
        start=start, end=now, days=day_list, intervals=[i for i in intervals if i.end > start and i.start < now],
        rows=rows, by_day=by_day,
        by_org=dict(sorted(by_org.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))),
        totals=totals, nodes_freed=in_window, nodes_freed_now=sum(1 for i in in_window if i.ongoing),
        binpack_nodes=binpack_nodes, binpack_nodes_now=len({_node_of(i) for i in binpack_nodes if i.ongoing}),
        exempt=sorted(facts.exempt, key=lambda e: (-(e.gpus_held or 0), e.org)), notes=notes,
        prices=dict(facts.prices))
