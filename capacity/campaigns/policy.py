"""When a pool's proposed campaign starts on its own, decided without the ORM or the clock:
the operator's policy for the pool (off unless enabled), its window and its node budget, as
Karpenter's NodePool disruption budgets have them (`spec.disruption.budgets[]`):

- `schedule` is a cron expression in UTC (five fields, or @hourly, @daily, …) and `duration`
  how long the window stays open after each time it fires ("2h", "30m", "1h30m": hours and
  minutes only, as cron has no seconds). Both are set or neither is: a policy with neither
  is open whenever it is enabled. Karpenter's `Budget.IsActive`: the window is open at
  `now` when the schedule fires in (now − duration, now].
- `nodes` is a count ("3") or a percentage of the pool's nodes ("10%"), rounded up as
  Karpenter's `Budget.GetAllowedDisruptions` rounds it (intstr scaled with roundUp): 10% of
  5 nodes is 1, not 0. Here it is the most nodes one automatic campaign frees.

Acting is then one campaign at a time per cluster, one per firing of the schedule (an
always-open policy: one per `gap`), never twice on the same proposal, never while the
cluster's defrag jobs are at their limit.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from croniter import croniter
from croniter.croniter import CroniterError

# Karpenter's NodePool CRD patterns (pkg/apis/v1/nodepool.go, Budget): duration in hours and
# minutes; nodes a whole number or a percentage from 0% to 100%.
DURATION_PATTERN = re.compile(r"^(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?$")
NODES_PATTERN = re.compile(r"^(?:(?P<pct>100|[0-9]{1,2})%|(?P<count>[0-9]+))$")
CRON_DESCRIPTORS = ("@annually", "@yearly", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# How far ahead the end of an open window is looked for when firings overlap (each firing
# extends it): a schedule that keeps it open longer than this is said to be open "for now".
_WINDOW_SCAN = 1440


class PolicyInputError(ValueError):
    """A policy value that cannot be used; `field` names it, the message says why."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def schedule_check(text: str) -> str:
    """The cron expression, stripped; raises PolicyInputError("schedule") for one Karpenter
    would refuse (five fields or a descriptor; UTC, so no time zone)."""
    text = " ".join((text or "").split())
    if not text:
        raise PolicyInputError("schedule", "a schedule is a cron expression, e.g. 0 22 * * mon-fri")
    if text.startswith("@"):
        if text not in CRON_DESCRIPTORS:
            raise PolicyInputError("schedule", f"{text!r} is not a cron descriptor ({', '.join(CRON_DESCRIPTORS)})")
        return text
    if len(text.split()) != 5:
        raise PolicyInputError("schedule", f"{text!r} is not a cron expression of five fields (minute hour "
                                           "day-of-month month day-of-week, in UTC), e.g. 0 22 * * mon-fri")
    try:
        croniter(text)
    except (CroniterError, ValueError) as exc:
        raise PolicyInputError("schedule", f"{text!r} is not a valid cron expression: {exc}") from None
    return text


def duration_parse(text: str) -> timedelta:
    """"2h", "30m", "1h30m" as a timedelta; raises PolicyInputError("duration") otherwise."""
    match = DURATION_PATTERN.match((text or "").strip())
    if not match or not (match["h"] or match["m"]):
        raise PolicyInputError("duration", f"{text!r} is not a duration in hours and minutes, as 2h, 30m or 1h30m")
    value = timedelta(hours=int(match["h"] or 0), minutes=int(match["m"] or 0))
    if value <= timedelta(0):
        raise PolicyInputError("duration", f"a window of {text!r} is never open: give it a length, as 2h")
    return value


def nodes_check(text: str) -> str:
    text = (text or "").strip()
    if not NODES_PATTERN.match(text):
        raise PolicyInputError("nodes", f"{text!r} is not a node budget: a whole number of nodes (3) or a "
                                        "percentage of the pool's nodes from 0% to 100% (10%)")
    return text


def budget_nodes(nodes: str, pool_nodes: int) -> int:
    """The most nodes one campaign may free: a count as given, a percentage of the pool's
    nodes rounded up (Karpenter: 20% of 19 nodes allows 4)."""
    match = NODES_PATTERN.match(nodes_check(nodes))
    if match["count"] is not None:
        return int(match["count"])
    return math.ceil(int(match["pct"]) * pool_nodes / 100)


def window_words(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M} UTC"


@dataclass(frozen=True)
class Window:
    """Where `now` stands in the policy's window: open or not, since which firing, until
    when, and when it next opens (None: the policy has no schedule, always open)."""

    open: bool
    fired_at: datetime | None = None     # the latest firing at or before now, while open
    closes_at: datetime | None = None    # while open
    opens_at: datetime | None = None     # while closed: the next firing

    @property
    def text(self) -> str:
        if self.open and self.fired_at is None:
            return "open whenever enabled"
        if self.open:
            return f"window open now, until {window_words(self.closes_at)}" if self.closes_at else "window open now"
        return f"next window opens at {window_words(self.opens_at)}"


def window_at(*, schedule: str, duration: str, now: datetime) -> Window:
    """The window at `now` (UTC). No schedule: always open."""
    if not schedule:
        return Window(open=True)
    schedule, length = schedule_check(schedule), duration_parse(duration)
    now = now.astimezone(timezone.utc) if now.tzinfo else now.replace(tzinfo=timezone.utc)
    # Karpenter's Budget.IsActive: open when the next firing after now − duration is not after now.
    first = croniter(schedule, now - length).get_next(datetime)
    if first > now:
        return Window(open=False, opens_at=croniter(schedule, now).get_next(datetime))
    fired = croniter(schedule, now.replace(second=0, microsecond=0) + timedelta(seconds=1)).get_prev(datetime)
    closes, firings = fired + length, croniter(schedule, fired)
    for _ in range(_WINDOW_SCAN):
        following = firings.get_next(datetime)
        if following >= closes:
            return Window(open=True, fired_at=fired, closes_at=closes)
        closes = following + length
    return Window(open=True, fired_at=fired)


@dataclass(frozen=True)
class ActingTerms:
    """A pool's policy as the decision reads it (the model's `terms`)."""

    enabled: bool
    schedule: str = ""
    duration: str = ""
    nodes: str = "10%"
    max_in_flight: int = 1
    drain_when_safe: bool = False

    def window(self, now: datetime) -> Window:
        return window_at(schedule=self.schedule, duration=self.duration, now=now)

    def words(self, *, pool_nodes: int, now: datetime) -> str:
        """"acts on its own: 0 22 * * * for 2h (UTC), at most 10% of 5 nodes = 1 node — next window opens at …"."""
        if not self.enabled:
            return "acts on its own: off"
        when = f"{self.schedule} for {self.duration} (UTC)" if self.schedule else "at any time"
        budget = budget_nodes(self.nodes, pool_nodes)
        most = (f"{self.nodes} of {pool_nodes} nodes = {_nodes(budget)}" if self.nodes.endswith("%")
                else _nodes(budget))
        return f"acts on its own: {when}, at most {most} per campaign — {self.window(now).text}"


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


@dataclass(frozen=True)
class ActDecision:
    start: bool
    goal: int | None     # the nodes the campaign frees: min(proposal's, budget)
    budget: int | None   # the policy's budget in nodes for this pool
    why: str             # why not, or what it starts


def act_decide(*, terms: ActingTerms | None, proposal_id: int, proposal_freed: int, pool_nodes: int, now: datetime,
               live_campaigns: Sequence[int] = (), defrag_jobs_running: int = 0, defrag_job_limit: int = 1,
               last_start_at: datetime | None = None, last_tried_proposal: int | None = None,
               gap: timedelta = timedelta(hours=1)) -> ActDecision:
    """Whether the pool's proposed campaign starts now, with what goal, and why not."""
    if terms is None:
        return ActDecision(False, None, None, "acts on its own: off (no policy for the pool)")
    if not terms.enabled:
        return ActDecision(False, None, None, "acts on its own: off (its policy is disabled)")
    window = terms.window(now)
    budget = budget_nodes(terms.nodes, pool_nodes)
    if not window.open:
        return ActDecision(False, None, budget, f"outside its window ({terms.schedule} for {terms.duration}, UTC): "
                                                f"the {window.text}")
    if live_campaigns:
        return ActDecision(False, None, budget, f"campaign #{min(live_campaigns)} is live on the cluster: one "
                                                "campaign at a time")
    if defrag_jobs_running >= defrag_job_limit:
        return ActDecision(False, None, budget, f"the cluster runs {defrag_jobs_running} defrag job(s), its limit "
                                                f"({defrag_job_limit})")
    if proposal_freed <= 0:
        return ActDecision(False, None, budget, f"proposal #{proposal_id} frees no node")
    if budget <= 0:
        return ActDecision(False, None, budget, f"its budget allows no node ({terms.nodes} of {pool_nodes})")
    if last_start_at is not None:
        since = window.fired_at if window.fired_at is not None else now - gap
        if last_start_at >= since:
            return ActDecision(False, None, budget, (
                f"a campaign started on its own at {window_words(last_start_at)}, since the window opened at "
                f"{window_words(window.fired_at)}: one per window" if window.fired_at is not None else
                f"a campaign started on its own at {window_words(last_start_at)}: at most one per "
                f"{int(gap.total_seconds() // 60)} min"))
    if last_tried_proposal == proposal_id:
        return ActDecision(False, None, budget, f"proposal #{proposal_id} was acted on already")
    goal = min(proposal_freed, budget)
    return ActDecision(True, goal, budget, f"starts proposal #{proposal_id}: {_nodes(goal)} of the "
                                           f"{proposal_freed} it frees (budget {terms.nodes} of {pool_nodes} nodes)")
