"""When a pool's proposed campaign starts on its own (capacity/campaigns/policy.py): the
window as Karpenter's disruption budgets open it, the node budget rounded as Karpenter
rounds it, and the decision with the sentence it gives when it does not start."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from capacity.campaigns.policy import (
    ActingTerms,
    PolicyInputError,
    act_decide,
    budget_nodes,
    duration_parse,
    nodes_check,
    schedule_check,
    window_at,
)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


# 2025-01-10 is a Friday, 2025-01-11 a Saturday, 2025-01-13 a Monday.
@pytest.mark.parametrize(("schedule", "duration", "now", "is_open", "said"), [
    # Opens each weeknight at 22:00 for 4 h: across midnight into the next day.
    ("0 22 * * mon-fri", "4h", utc(2025, 1, 10, 21, 59), False, "next window opens at 2025-01-10 22:00 UTC"),
    ("0 22 * * mon-fri", "4h", utc(2025, 1, 10, 22, 0), True, "window open now, until 2025-01-11 02:00 UTC"),
    ("0 22 * * mon-fri", "4h", utc(2025, 1, 11, 1, 59), True, "window open now, until 2025-01-11 02:00 UTC"),
    # Friday's window closes at 02:00 Saturday; nothing fires at the weekend.
    ("0 22 * * mon-fri", "4h", utc(2025, 1, 11, 2, 0), False, "next window opens at 2025-01-13 22:00 UTC"),
    ("0 22 * * mon-fri", "4h", utc(2025, 1, 12, 1, 0), False, "next window opens at 2025-01-13 22:00 UTC"),
    ("30 23 * * *", "1h30m", utc(2025, 1, 11, 0, 59), True, "window open now, until 2025-01-11 01:00 UTC"),
    ("@daily", "30m", utc(2025, 1, 11, 0, 30), False, "next window opens at 2025-01-12 00:00 UTC"),
    # Firings closer together than the duration keep one window open until the last one's end;
    # hourly firings for 2 h keep it open for good.
    ("0 22,23 * * *", "2h", utc(2025, 1, 10, 22, 30), True, "window open now, until 2025-01-11 01:00 UTC"),
    ("0 * * * *", "2h", utc(2025, 1, 11, 10, 30), True, "window open now"),
    ("", "", utc(2025, 1, 11, 10, 30), True, "open whenever enabled"),
])
def test_the_window_opens_when_the_schedule_fires_and_stays_open_for_the_duration(schedule, duration, now, is_open,
                                                                                   said):
    window = window_at(schedule=schedule, duration=duration, now=now)
    assert window.open is is_open
    assert window.text == said


@pytest.mark.parametrize(("nodes", "pool", "budget"), [
    ("20%", 19, 4),     # Karpenter's own example: 19 × 20% = 3.8, rounded up to 4
    ("10%", 5, 1),      # 0.5 rounds up: a percentage above 0 always allows a node
    ("10%", 10, 1),
    ("10%", 11, 2),
    ("50%", 4, 2),
    ("0%", 8, 0),
    ("100%", 6, 6),
    ("3", 2, 3),        # a count is a count, whatever the pool
    ("0", 6, 0),
])
def test_a_percentage_budget_is_rounded_up_as_karpenter_rounds_it(nodes, pool, budget):
    assert budget_nodes(nodes, pool) == budget


@pytest.mark.parametrize(("check", "text", "field", "says"), [
    (schedule_check, "0 22 * * mon-fry", "schedule", "not a valid cron expression"),
    (schedule_check, "61 * * * *", "schedule", "not a valid cron expression"),
    (schedule_check, "0 22 * *", "schedule", "five fields"),
    (schedule_check, "0 0 22 * * *", "schedule", "five fields"),
    (schedule_check, "@fortnightly", "schedule", "not a cron descriptor"),
    (duration_parse, "2 hours", "duration", "hours and minutes"),
    (duration_parse, "90s", "duration", "hours and minutes"),
    (duration_parse, "0m", "duration", "never open"),
    (nodes_check, "150%", "nodes", "from 0% to 100%"),
    (nodes_check, "-1", "nodes", "whole number"),
    (nodes_check, "1.5", "nodes", "whole number"),
])
def test_bad_input_is_refused_naming_the_field(check, text, field, says):
    with pytest.raises(PolicyInputError, match=says) as raised:
        check(text)
    assert raised.value.field == field and repr(text) in str(raised.value)


def test_good_input_reads_as_karpenter_reads_it():
    assert schedule_check(" 0  22 * * MON-FRI ") == "0 22 * * MON-FRI"
    assert schedule_check("@hourly") == "@hourly"
    assert duration_parse("1h30m") == timedelta(minutes=90) and duration_parse("30m") == timedelta(minutes=30)
    assert nodes_check("100%") == "100%" and nodes_check("12") == "12"


NIGHTS = ActingTerms(enabled=True, schedule="0 22 * * *", duration="2h", nodes="40%")
IN_WINDOW = utc(2025, 1, 10, 23, 0)


def decide(terms=NIGHTS, **kwargs):
    args = {"proposal_id": 7, "proposal_freed": 3, "pool_nodes": 5, "now": IN_WINDOW, "live_campaigns": (),
            "defrag_jobs_running": 0, "defrag_job_limit": 2, "last_start_at": None, "last_tried_proposal": None,
            **kwargs}
    return act_decide(terms=terms, **args)


def test_inside_the_window_it_starts_with_the_budget_goal():
    decision = decide()
    # 40% of 5 nodes = 2, fewer than the 3 the proposal frees.
    assert (decision.start, decision.goal, decision.budget) == (True, 2, 2)
    assert decision.why == "starts proposal #7: 2 nodes of the 3 it frees (budget 40% of 5 nodes)"
    # A budget larger than the proposal: the whole proposal.
    assert decide(proposal_freed=1).goal == 1


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"terms": None}, "acts on its own: off (no policy for the pool)"),
    ({"terms": ActingTerms(enabled=False, schedule="0 22 * * *", duration="2h")},
     "acts on its own: off (its policy is disabled)"),
    ({"now": utc(2025, 1, 11, 0, 0)},
     "outside its window (0 22 * * * for 2h, UTC): the next window opens at 2025-01-11 22:00 UTC"),
    ({"live_campaigns": (12, 9)}, "campaign #9 is live on the cluster: one campaign at a time"),
    ({"defrag_jobs_running": 2}, "the cluster runs 2 defrag job(s), its limit (2)"),
    ({"proposal_freed": 0}, "proposal #7 frees no node"),
    ({"terms": ActingTerms(enabled=True, nodes="0%")}, "its budget allows no node (0% of 5)"),
    ({"last_start_at": utc(2025, 1, 10, 22, 10)},
     "a campaign started on its own at 2025-01-10 22:10 UTC, since the window opened at 2025-01-10 22:00 UTC: "
     "one per window"),
    ({"last_tried_proposal": 7}, "proposal #7 was acted on already"),
    ({"terms": ActingTerms(enabled=True), "last_start_at": IN_WINDOW - timedelta(minutes=20)},
     "a campaign started on its own at 2025-01-10 22:40 UTC: at most one per 60 min"),
])
def test_it_does_not_start_and_says_why(kwargs, why):
    decision = decide(**kwargs)
    assert not decision.start and decision.goal is None
    assert decision.why == why


def test_the_previous_windows_campaign_does_not_hold_back_tonights():
    assert decide(last_start_at=utc(2025, 1, 9, 23, 30)).start
    # An always-open policy: once the gap has passed.
    assert decide(terms=ActingTerms(enabled=True), last_start_at=IN_WINDOW - timedelta(minutes=61)).start


def test_the_dashboard_words_say_the_window_and_the_budget():
    assert NIGHTS.words(pool_nodes=5, now=IN_WINDOW) == (
        "acts on its own: 0 22 * * * for 2h (UTC), at most 40% of 5 nodes = 2 nodes per campaign — "
        "window open now, until 2025-01-11 00:00 UTC")
    assert NIGHTS.words(pool_nodes=5, now=utc(2025, 1, 11, 9, 0)).endswith(
        "— next window opens at 2025-01-11 22:00 UTC")
    assert ActingTerms(enabled=True, nodes="1").words(pool_nodes=5, now=IN_WINDOW) == (
        "acts on its own: at any time, at most 1 node per campaign — open whenever enabled")
    assert ActingTerms(enabled=False, schedule="0 22 * * *", duration="2h").words(pool_nodes=5, now=IN_WINDOW) == (
        "acts on its own: off")
