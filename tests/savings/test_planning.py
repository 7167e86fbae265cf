"""Savings planning: recorded facts and `now` in, GPU-hours per mechanism, day and org out.
No database, no cluster."""
from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from decimal import Decimal

from savings.planning import (BINPACK, DORMANCY, DRAIN, MECHANISM_BASIS, NO_ORG, PRUNING, BinpackNodeFree, ExemptOrg,
                              Facts, FloorChange, NodeDrain, PruneAction, SavingsInputError, savings_plan, window)

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc)   # noon on the window's last day


def at(day: int, hour: float) -> datetime:
    return datetime(2026, 3, day, tzinfo=timezone.utc) + timedelta(hours=hour)


KSVC = "ksvc acme/llama"
REV = "podautoscaler acme/llama-00001"


def lowered(workload=KSVC, *, when, old="1", org="acme"):
    return FloorChange(org, workload, when, old, "0")


def raised(workload=KSVC, *, when, new="1", org="acme"):
    return FloorChange(org, workload, when, "0", new)


DORMANCY_CASES = [
    # (name, changes, gpus per replica, expected GPU-hours per day {day: hours})
    ("dormant 6 h one day, 1 replica × 2 GPUs",
     [lowered(when=at(9, 2)), raised(when=at(9, 8))], {KSVC: 2}, {date(2026, 3, 9): 12.0}),
    ("floor 3 counts 3 replicas",
     [lowered(when=at(9, 0), old="3"), raised(when=at(9, 1), new="3")], {KSVC: 1}, {date(2026, 3, 9): 3.0}),
    ("still dormant: until now, split at UTC midnight",
     [lowered(when=at(9, 20))], {KSVC: 1}, {date(2026, 3, 9): 4.0, date(2026, 3, 10): 12.0}),
    ("owner's floor was 0 (unset): the switch saved nothing",
     [lowered(when=at(9, 0), old="unset"), raised(when=at(9, 5), new="unset")], {KSVC: 4}, {}),
    ("owner's floor was 0: nothing saved",
     [lowered(when=at(9, 0), old="0")], {KSVC: 4}, {}),
    ("a drift repair reopens: the first stretch ends at the repair",
     [lowered(when=at(9, 0)), lowered(when=at(9, 3)), raised(when=at(9, 4))], {KSVC: 1},
     {date(2026, 3, 9): 4.0}),
    ("before the window: only the part inside counts",
     [lowered(when=at(1, 0)), raised(when=at(2, 0))], {KSVC: 1}, {}),
    ("PodAutoscaler lever: the revision's GPUs",
     [lowered(REV, when=at(10, 10))], {REV: 8}, {date(2026, 3, 10): 16.0}),
    ("workload gone from the cluster: not counted",
     [lowered(when=at(10, 10))], {}, {}),
]


@pytest.mark.parametrize("name,changes,gpus,expected", DORMANCY_CASES, ids=[c[0] for c in DORMANCY_CASES])
def test_dormancy_gpu_hours_per_day(name, changes, gpus, expected):
    report = savings_plan(Facts(floor_changes=tuple(changes), gpus_per_replica=gpus), now=NOW, days=7)
    got = {d: round(v[DORMANCY], 6) for d, v in report.by_day.items() if v[DORMANCY]}
    assert got == expected
    assert report.totals[DORMANCY] == pytest.approx(sum(expected.values()))
    if expected:
        assert set(report.by_org) == {"acme"}


def test_a_workload_whose_gpus_are_unknown_is_named_in_the_notes_not_guessed():
    report = savings_plan(Facts(floor_changes=(lowered(when=at(10, 0)),), gpus_per_replica=None,
                                cluster_error="no answer from the API"), now=NOW, days=3)
    assert report.totals[DORMANCY] == 0
    assert any("ksvc acme/llama" in n and "could not be read" in n for n in report.notes)
    assert any("no answer from the API" in n for n in report.notes)


PRUNE_CASES = [
    ("restored after 3 h, 2 GPUs", [PruneAction("acme", "Deployment acme/a (pod a-1)", 2, at(8, 1), at(8, 4))],
     {date(2026, 3, 8): 6.0}),
    ("never restored: until now", [PruneAction("acme", "Deployment acme/a (pod a-1)", 1, at(10, 6), None)],
     {date(2026, 3, 10): 6.0}),
    ("two pods of one owner both count", [PruneAction("acme", "x", 1, at(9, 0), at(9, 1)),
                                          PruneAction("acme", "y", 1, at(9, 0), at(9, 1))],
     {date(2026, 3, 9): 2.0}),
    ("no GPU seen: nothing", [PruneAction("acme", "x", 0, at(9, 0), None)], {}),
]


@pytest.mark.parametrize("name,actions,expected", PRUNE_CASES, ids=[c[0] for c in PRUNE_CASES])
def test_pruning_gpu_hours_per_day(name, actions, expected):
    report = savings_plan(Facts(prune_actions=tuple(actions)), now=NOW, days=7)
    assert {d: v[PRUNING] for d, v in report.by_day.items() if v[PRUNING]} == pytest.approx(expected)



def pruned(pod: str, *, owner=("Service", "llama"), namespace="acme", gpus=2, start, end):
    return PruneAction("acme", f"{owner[0]} {namespace}/{owner[1]} (pod {pod})", gpus, start, end,
                       namespace=namespace, pod=pod, owner_kind=owner[0], owner_name=owner[1])


OVERLAP_CASES = [
    # (name, the pruner's action, expected pruning GPU-hours) — acme's pynode ksvc acme/llama
    # (1 replica × 2 GPUs) is dormant from 9 March 02:00 to 08:00, 12 GPU-hours under dormancy.
    ("the pynode pruned inside its org's sleep: nothing more",
     pruned("llama-00002-deployment-5d9c7b-x2kqp", start=at(9, 3), end=at(9, 6)), 0.0),
    ("pruned during the sleep, restored 2 h after the wake: those 2 h only",
     pruned("llama-00002-deployment-5d9c7b-x2kqp", start=at(9, 4), end=at(9, 10)), 4.0),
    ("pruned 1 h before the sleep, never restored: the hour before and the hours after the wake",
     pruned("llama-00001-deployment-5d9c7b-x2kqp", start=at(9, 1), end=None), 2.0 + 2 * 28.0),
    ("a model's pod of the same org is another workload: all of it",
     pruned("mistral-predictor-00001-deployment-6f8d-q7rcl", owner=("InferenceService", "mistral"),
            start=at(9, 3), end=at(9, 6)), 6.0),
    ("the same names in another namespace: all of it",
     pruned("llama-00002-deployment-5d9c7b-x2kqp", namespace="other", start=at(9, 3), end=at(9, 6)), 6.0),
]


@pytest.mark.parametrize("name,action,expected", OVERLAP_CASES, ids=[c[0] for c in OVERLAP_CASES])
def test_a_gpu_freed_by_dormancy_and_the_pruner_at_once_is_counted_once(name, action, expected):
    facts = Facts(floor_changes=(lowered(when=at(9, 2)), raised(when=at(9, 8))), gpus_per_replica={KSVC: 2},
                  prune_actions=(action,))
    report = savings_plan(facts, now=NOW, days=7)
    assert report.totals[DORMANCY] == pytest.approx(12.0)
    assert report.totals[PRUNING] == pytest.approx(expected)
    overlapping = action.namespace == "acme" and action.owner_name == "llama"
    assert any("counted once, under dormancy" in n for n in report.notes) == overlapping


WAKE_CASES = [
    # (name, floor changes, scale-to-zero switch-offs per org, prune action or None,
    #  expected dormancy GPU-hours, expected pruning GPU-hours) — ksvc acme/llama, 1 replica × 2 GPUs
    ("asleep 5 h, woke without raising the workload: the 5 h only",
     [lowered(when=at(9, 2))], {"acme": (at(9, 7),)}, None, 10.0, 0.0),
    ("raised 1 min after its wake: the wake ends it",
     [lowered(when=at(9, 2)), raised(when=at(9, 7) + timedelta(minutes=1))], {"acme": (at(9, 7),)}, None,
     10.0, 0.0),
    ("a wake before the sleep ends nothing, the next one does",
     [lowered(when=at(9, 2))], {"acme": (at(9, 1), at(9, 7))}, None, 10.0, 0.0),
    ("another org's earlier wake ends nothing, its own does",
     [lowered(when=at(9, 2))], {"beta": (at(9, 4),), "acme": (at(9, 7),)}, None, 10.0, 0.0),
    ("slept again after the wake, still asleep: both stretches",
     [lowered(when=at(9, 2)), lowered(when=at(10, 6))], {"acme": (at(9, 7),)}, None, 10.0 + 12.0, 0.0),
    ("pruned 1 h before the sleep, the wake 2 h later patched nothing, restored 1 h after it: "
     "dormancy the sleep, pruning the hour before and the hour after",
     [lowered(when=at(9, 2))], {"acme": (at(9, 4),)},
     pruned("llama-00001-deployment-5d9c7b-x2kqp", start=at(9, 1), end=at(9, 5)), 4.0, 2.0 + 2.0),
]


@pytest.mark.parametrize("name,changes,offs,action,dormancy,pruning", WAKE_CASES, ids=[c[0] for c in WAKE_CASES])
def test_dormancy_ends_when_the_org_wakes_and_the_pruner_counts_what_it_still_holds(name, changes, offs, action,
                                                                                     dormancy, pruning):
    facts = Facts(floor_changes=tuple(changes), scale_to_zero_offs=offs, gpus_per_replica={KSVC: 2},
                  prune_actions=(action,) if action else ())
    report = savings_plan(facts, now=NOW, days=7)
    assert report.totals[DORMANCY] == pytest.approx(dormancy)
    assert report.totals[PRUNING] == pytest.approx(pruning)
    if action:   # each of the pod's 4 hours counted once, under the mechanism holding it then
        assert report.totals[DORMANCY] + report.totals[PRUNING] == pytest.approx(2 * 4.0)


DRAIN_CASES = [
    # (name, drain, node GPUs now, schedulable now, expected hours, nodes out of service now, note fragment)
    ("drained and still out: node GPUs until now", NodeDrain("h100-3", 7, at(10, 0), None, 3),
     {"h100-3": 8}, frozenset(), 96.0, 1, None),
    ("returned to service after 2 h", NodeDrain("h100-3", 7, at(9, 0), at(9, 2), 3),
     {"h100-3": 8}, frozenset({"h100-3"}), 16.0, 0, None),
    ("node deleted: the GPUs moved off it, a lower bound", NodeDrain("h100-9", 8, at(10, 10), None, 3),
     {}, frozenset(), 6.0, 1, "lower bound"),
    ("uncordoned outside the product: not counted", NodeDrain("h100-3", 7, at(9, 0), None, 3),
     {"h100-3": 8}, frozenset({"h100-3"}), 0.0, 0, "outside the product"),
]


@pytest.mark.parametrize("name,drain,node_gpus,schedulable,hours,out_now,note", DRAIN_CASES,
                         ids=[c[0] for c in DRAIN_CASES])
def test_drained_nodes(name, drain, node_gpus, schedulable, hours, out_now, note):
    report = savings_plan(Facts(drains=(drain,), node_gpus=node_gpus, nodes_schedulable=schedulable),
                          now=NOW, days=7)
    assert report.totals[DRAIN] == pytest.approx(hours)
    assert report.nodes_freed_now == out_now
    if hours:
        assert set(report.by_org) == {NO_ORG}
    if note:
        assert any(note in n for n in report.notes)


def test_rows_chart_and_binpack_is_zero_without_a_node_it_freed():
    facts = Facts(floor_changes=(lowered(when=at(9, 0)), raised(when=at(9, 1))), gpus_per_replica={KSVC: 1},
                  prune_actions=(PruneAction("beta", "x", 2, at(10, 0), None),),
                  exempt=(ExemptOrg("gamma", True, 4), ExemptOrg("delta", False, 8)))
    report = savings_plan(facts, now=NOW, days=2)
    assert [(r.day, r.org, r.mechanism, round(r.gpu_hours, 3)) for r in report.rows] == [
        (date(2026, 3, 9), "acme", DORMANCY, 1.0), (date(2026, 3, 10), "beta", PRUNING, 24.0)]
    assert report.totals[BINPACK] == 0 and report.binpack_nodes == []
    assert not any("not measured" in n for n in report.notes)
    assert list(report.by_org) == ["beta", "acme"]   # biggest first
    assert [e.org for e in report.exempt] == ["delta", "gamma"]
    chart = report.chart_config()
    assert chart["data"]["labels"] == ["2026-03-09", "2026-03-10"]
    assert [d["label"] for d in chart["data"]["datasets"]] == [DORMANCY, PRUNING, DRAIN, BINPACK]
    assert chart["options"]["scales"]["x"]["title"]["text"] == "day (UTC)"
    assert chart["options"]["scales"]["y"]["title"]["text"] == "GPU-hours freed"
    assert chart["options"]["scales"]["y"]["stacked"] is True


@pytest.mark.parametrize("days", [0, -1, 367, "x", "1.5", "nan", "inf", "", None, True, "9" * 40])
def test_bad_window_names_days_and_is_refused(days):
    with pytest.raises(SavingsInputError, match="days"):
        window(now=NOW, days=days)


def test_window_is_whole_utc_days_ending_today():
    start, days = window(now=NOW, days="3")
    assert start == datetime(2026, 3, 8, tzinfo=timezone.utc)
    assert days == [date(2026, 3, 8), date(2026, 3, 9), date(2026, 3, 10)]


def _pruned_for(org: str, *, day: int, minutes: float) -> PruneAction:
    start = at(day, 10)
    return PruneAction(org=org, subject=f"Deployment {org}/idle", gpus=1, acted_at=start,
                       restored_at=start + timedelta(minutes=minutes))


@pytest.mark.parametrize(("actions", "rows", "total"), [
    # Three 40-minute prunes (0.667 each): rows of 0.67, a total of 2.01, not a 2.0 beside them.
    ([_pruned_for(o, day=9, minutes=40) for o in ("a", "b", "c")], ["0.67", "0.67", "0.67"], "2.01"),
    # 72 GPU-seconds: 0.02 on the row, the chart and the total (not 0.0 beside a bar of 0.02).
    ([_pruned_for("a", day=9, minutes=1.2)], ["0.02"], "0.02"),
    # 18 GPU-seconds round to 0.01 once, on its row; the total is that row, not a rounding of its own.
    ([_pruned_for("a", day=9, minutes=0.3), _pruned_for("b", day=9, minutes=0.3)], ["0.01", "0.01"], "0.02"),
])
def test_every_figure_shown_is_the_sum_of_the_rows_shown_rounded_once(actions, rows, total):
    from decimal import Decimal

    figures = savings_plan(Facts(prune_actions=tuple(actions)), now=NOW, days=7).shown()
    assert sorted(str(hours) for _, hours in figures.rows) == rows
    assert str(figures.total) == total
    assert figures.totals[PRUNING] == figures.total == sum(sum(d.values()) for d in figures.by_day.values())
    assert figures.total == sum((sum(o.values()) for o in figures.by_org.values()), Decimal(0))


# ---- the GPU model of each row, and money ------------------------------------------------------

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def _prune(namespace: str, hours: float) -> PruneAction:
    return PruneAction(org=namespace, subject=f"Deployment {namespace}/m (pod {namespace}/m-1)", gpus=1,
                       acted_at=NOW - timedelta(hours=hours), restored_at=None, namespace=namespace, pod="m-1",
                       owner_kind="Deployment", owner_name="m")


@pytest.mark.parametrize(("node_models", "namespace_models", "expected"), [
    ({"n1": H100, "n2": A100}, {"ns": A100}, A100),     # the namespace's GPU pods all run on one model
    ({"n1": H100, "n2": A100}, {}, ""),                 # several models, nothing says which: unknown
    ({"n1": H100, "n2": H100}, {}, H100),               # a cluster of one model
    (None, {}, ""),                                     # the cluster could not be read
])
def test_a_pruned_pods_gpu_model(node_models, namespace_models, expected):
    report = savings_plan(Facts(prune_actions=(_prune("ns", 2),), node_models=node_models,
                                namespace_models=namespace_models), now=NOW, days=1)
    assert {r.gpu_model for r in report.rows} == {expected}


def test_a_drained_nodes_gpu_model_is_its_own_and_money_is_rounded_once_per_row():
    """Rows: 8 GPUs × 1/3 h of A100 (2.67 h × 1.10 = 2.937 → 2.94), of H100 without a price,
    and a pruned pod of unknown model: money only on the first, the totals its sums."""
    from decimal import Decimal

    facts = Facts(drains=(NodeDrain("a", 1, NOW - timedelta(minutes=20), None, 0),
                          NodeDrain("h", 2, NOW - timedelta(minutes=20), None, 0)),
                  node_gpus={"a": 8, "h": 8}, node_models={"a": A100, "h": H100},
                  prune_actions=(_prune("ns", 1),), prices={A100: Decimal("1.10")})
    shown = savings_plan(facts, now=NOW, days=1).shown()
    by_model = {row.gpu_model: (hours, money) for (row, hours), money in zip(shown.rows, shown.row_money)}
    assert by_model == {A100: (Decimal("2.67"), Decimal("2.94")), H100: (Decimal("2.67"), None),
                        "": (Decimal("1.00"), None)}
    assert shown.money_total == shown.money_totals[DRAIN] == Decimal("2.94")
    assert shown.money_by_org[NO_ORG][DRAIN] == Decimal("2.94") and shown.money_by_org["ns"][PRUNING] == 0
    assert shown.unpriced == {H100: Decimal("2.67")}
    assert (shown.unknown_rows, shown.unknown_hours) == (1, Decimal("1.00"))
    assert shown.unpriced_totals[DRAIN] == Decimal("2.67") and shown.unpriced_totals[PRUNING] == Decimal("1.00")
    assert shown.unpriced_by_org["ns"][PRUNING] == Decimal("1.00") and shown.unpriced_by_org[NO_ORG][DRAIN] == \
        Decimal("2.67")


def freed(node="h100-5", *, start, end=None, gpus=8, model="NVIDIA-H100-80GB-HBM3", run=3, removed=None):
    return BinpackNodeFree(node=node, run_id=run, gpus=gpus, freed_at=start, ended_at=end, gpu_model=model,
                           removed_at=removed)


BINPACK_CASES = [
    # name, frees, drains, {day: GPU-hours}, nodes still free now
    ("free until now, across midnight", (freed(start=at(9, 22)),), (), {9: 16.0, 10: 96.0}, 1),
    ("refilled after 3 h", (freed(start=at(10, 1), end=at(10, 4)),), (), {10: 24.0}, 0),
    ("removed from the cluster: its GPUs when marked", (freed(start=at(10, 6), gpus=4, removed=at(10, 6)),), (),
     {10: 24.0}, 1),
    ("freed before the window, ended inside it", (freed(start=at(1, 0), end=at(4, 2)),), (), {4: 16.0}, 0),
    ("ended before the window: not counted", (freed(start=at(1, 0), end=at(2, 0)),), (), {}, 0),
    ("drained by a defrag job for 2 of its 4 free hours: those 2 are defrag's",
     (freed(start=at(10, 0), end=at(10, 4)),), (NodeDrain("h100-5", 7, at(10, 1), at(10, 3), 8),),
     {10: 16.0}, 0),
    ("drained from before it was free until now: all defrag's",
     (freed(start=at(10, 2)),), (NodeDrain("h100-5", 7, at(10, 1), None, 8),), {}, 0),
    ("another node's drain changes nothing",
     (freed(start=at(10, 8)),), (NodeDrain("h100-6", 7, at(10, 1), None, 8),), {10: 32.0}, 1),
    ("two nodes freed by two runs", (freed(start=at(10, 10)), freed("h100-7", start=at(10, 11), run=4, gpus=4)),
     (), {10: 20.0}, 2),
]


@pytest.mark.parametrize("name,frees,drains,per_day,free_now", BINPACK_CASES, ids=[c[0] for c in BINPACK_CASES])
def test_binpack_gpu_hours_per_day_of_the_nodes_it_freed(name, frees, drains, per_day, free_now):
    report = savings_plan(Facts(binpack_frees=frees, drains=drains, node_gpus={"h100-5": 8, "h100-6": 8}),
                          now=NOW, days=7)
    got = {d: round(report.by_day[d][BINPACK], 6) for d in report.days if report.by_day[d][BINPACK]}
    assert got == {date(2026, 3, day): hours for day, hours in per_day.items()}
    assert report.totals[BINPACK] == pytest.approx(sum(per_day.values()))
    assert {r.org for r in report.rows if r.mechanism == BINPACK} <= {NO_ORG}
    assert report.binpack_nodes_now == free_now
    if drains and drains[0].node == "h100-5":
        # the drained hours are defrag's, and counted there once
        drained = report.totals[DRAIN]
        assert drained > 0
        freed_hours = sum(f.gpus * ((f.ended_at or NOW) - f.freed_at).total_seconds() / 3600 for f in frees)
        assert report.totals[BINPACK] + min(drained, freed_hours) == pytest.approx(freed_hours)
        assert any("counted once, under defrag/drain" in n for n in report.notes)


def test_binpack_money_is_its_nodes_model_price_and_totals_are_the_sum_of_rows_shown():
    facts = Facts(binpack_frees=(freed(start=at(10, 0), end=at(10, 1, ) + timedelta(minutes=20)),
                                 freed("l4-1", start=at(9, 23), end=at(10, 2), gpus=2, model="NVIDIA-L4"),
                                 freed("x-1", start=at(10, 5), end=at(10, 6), gpus=1, model="")),
                  prices={"NVIDIA-H100-80GB-HBM3": Decimal("2.5")})
    report = savings_plan(facts, now=NOW, days=2)
    shown = report.shown()
    rows = [(r.day.day, r.org, r.mechanism, r.gpu_model, hours) for r, hours in shown.rows]
    assert rows == [(9, NO_ORG, BINPACK, "NVIDIA-L4", Decimal("2.00")),
                    (10, NO_ORG, BINPACK, "", Decimal("1.00")),
                    (10, NO_ORG, BINPACK, "NVIDIA-H100-80GB-HBM3", Decimal("10.67")),
                    (10, NO_ORG, BINPACK, "NVIDIA-L4", Decimal("4.00"))]
    assert shown.row_money == [None, None, Decimal("26.68"), None]     # 10.67 × 2.5, rounded once
    assert shown.totals[BINPACK] == Decimal("17.67") == sum(h for _, h in shown.rows)
    assert shown.money_totals[BINPACK] == Decimal("26.68")
    assert shown.unpriced == {"NVIDIA-L4": Decimal("6.00")} and shown.unknown_hours == Decimal("1.00")
    assert shown.by_org[NO_ORG][BINPACK] == shown.totals[BINPACK]
    assert sum(shown.by_day[d][BINPACK] for d in report.days) == shown.totals[BINPACK]
    assert report.binpack_node_count == 3
    chart = report.chart_config()
    (dataset,) = [d for d in chart["data"]["datasets"] if d["label"] == BINPACK]
    assert [Decimal(repr(v)) for v in dataset["data"]] == [Decimal("2.0"), Decimal("15.67")]


def test_binpack_basis_says_how_it_is_measured_and_what_is_not_its():
    basis = MECHANISM_BASIS[BINPACK]
    assert "not measured" not in basis
    for words in ("marked to be emptied first", "no GPU pod", "gone from the cluster", "went to zero",
                  "counted once, under defrag/drain"):
        assert words in basis
