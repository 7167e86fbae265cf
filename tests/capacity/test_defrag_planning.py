"""Pure defrag planning: the discovery report, blockers, the safety condition, the next step."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from defrag_builders import make_model_pod, make_node, make_pod
from capacity.defrag.planning import (
    DefragAdvice,
    DefragPlan,
    EndSettle,
    Freeing,
    Move,
    RevisionScale,
    Role,
    Scoring,
    blockers_remaining,
    defrag_advice,
    defrag_plan,
    orphan_end_settle,
    orphan_patch,
    pod_classify,
    progress_line,
    replicaset_ready_pods,
    revision_satisfied,
)
from clusters.snapshot import ClusterSnapshot, NodeView, PodView
from tests.settings_check import manage_check

REV = "bt-deployment-qvr7e9w-00001"


def plan_for(pods: list[dict], scales=None, node=None) -> DefragPlan:
    return defrag_plan(node=NodeView.from_object(node or make_node("n1")),
                       pods=[PodView.from_object(p) for p in pods],
                       scales=scales if scales is not None else {("org-a", REV): RevisionScale(3, 3)})


def test_seed_report_lists_the_model_pod_with_its_gpus_status_and_scales():
    plan = plan_for([make_model_pod(f"{REV}-deployment-547cc9b97f-pgtn2", revision=REV)],
                    node=make_node("n1", product="nvidia-h100-80gb"))
    assert plan.report_lines() == [
        "Found pods to defrag:",
        f"\torg-a/{REV}-deployment-547cc9b97f-pgtn2",
        "\t\t- 1x nvidia-h100-80gb GPUs",
        "\t\t- STATUS=[Running] REPLICAS=3 KPA_SCALE=3",
    ]
    [revision] = plan.revisions
    assert (revision.revision, revision.replicaset, revision.overprovision) == (
        REV, f"{REV}-deployment-547cc9b97f", 1)
    assert plan.model_pods[0].owner_chain == (
        f"ReplicaSet/{REV}-deployment-547cc9b97f", f"Deployment/{REV}-deployment", f"Revision/{REV}")


def test_two_revisions_on_one_node_each_get_their_own_m():
    other = "llama-00002"
    plan = plan_for([make_model_pod("a1", revision=REV), make_model_pod("a2", revision=REV),
                     make_model_pod("b1", revision=other, namespace="org-b", template_hash="abc")],
                    scales={("org-a", REV): RevisionScale(3, 3), ("org-b", other): RevisionScale(1, 1)})
    assert [(r.namespace, r.revision, r.overprovision) for r in plan.revisions] == [
        ("org-a", REV, 2), ("org-b", other, 1)]


@pytest.mark.parametrize("pod, role, reason_part", [
    (make_pod("ds", owner=("DaemonSet", "dcgm")), Role.IGNORED, "DaemonSet"),
    (make_pod("mirror", annotations={"kubernetes.io/config.mirror": "abc"}), Role.IGNORED, "mirror"),
    (make_pod("done", owner=("ReplicaSet", "x"), phase="Succeeded"), Role.IGNORED, "finished"),
    (make_pod("nb-0", owner=("StatefulSet", "nb")), Role.BLOCKER, "StatefulSet"),
    (make_pod("bare"), Role.BLOCKER, "bare pod"),
    (make_model_pod("keep", revision=REV, annotations={"karpenter.sh/do-not-disrupt": "true"}),
     Role.BLOCKER, "do-not-disrupt"),
    (make_model_pod("keep2", revision=REV,
                    annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
     Role.BLOCKER, "safe-to-evict"),
    (make_pod("raw", owner=("ReplicaSet", "raw-7d9")), Role.BLOCKER, "outside Knative"),
    (make_model_pod("m", revision=REV, annotations={"karpenter.sh/do-not-disrupt": "false"}), Role.MODEL, "Knative"),
])
def test_pod_classification(pod, role, reason_part):
    got_role, reason = pod_classify(PodView.from_object(pod))
    assert got_role == role
    assert reason_part in reason


def test_blockers_are_listed_in_the_report_before_confirmation():
    plan = plan_for([make_model_pod("m1", revision=REV), make_pod("nb-0", owner=("StatefulSet", "nb")),
                     make_pod("ds", owner=("DaemonSet", "dcgm"))])
    lines = plan.report_lines()
    assert "\torg-a/nb-0 - StatefulSet pod (a notebook or stateful workload)" in lines
    assert [p.name for p in plan.blockers] == ["nb-0"]
    assert [p.name for p in plan.ignored] == ["ds"]


def test_a_model_pod_without_a_podautoscaler_is_a_blocker_not_a_revision():
    plan = plan_for([make_model_pod("m1", revision=REV)], scales={})
    assert plan.revisions == ()
    assert "no PodAutoscaler" in plan.blockers[0].reason


def test_pods_of_one_revision_from_two_replicasets_are_refused():
    with pytest.raises(ValueError, match="several ReplicaSets"):
        plan_for([make_model_pod("m1", revision=REV, template_hash="aaa"),
                  make_model_pod("m2", revision=REV, template_hash="bbb")])


@pytest.mark.parametrize("kpa, replicas, initial, m, safe", [
    (3, 3, 3, 1, False),   # the seed's waiting line
    (4, 3, 3, 1, True),    # the seed's final line: initial_replicas + m
    (3, 2, 3, 1, True),    # scaled down meanwhile: current_replicas + m
    (4, 4, 3, 1, True),    # scaled up: still initial + m
    (4, 3, 3, 2, False),   # two orphans need two replacements
    (0, 0, 1, 1, False),   # not even the replacement is up
])
def test_the_seeds_safety_condition(kpa, replicas, initial, m, safe):
    assert revision_satisfied(current_kpa_scale=kpa, current_replicas=replicas, initial_replicas=initial,
                              overprovision=m) is safe


def test_progress_line_is_the_seeds():
    assert progress_line(revision=REV, overprovision=1, current_kpa_scale=3, current_replicas=3,
                         initial_kpa_scale=3) == \
        f"Revision {REV} - 1 extra needed - current_scale=3 replicas=3 initial_scale=3"


def test_orphan_patch_is_guarded_by_uid_and_owners_and_removes_both():
    owners = [{"kind": "ReplicaSet", "name": "rs", "uid": "u"}]
    assert orphan_patch(uid="abc", owner_references=owners, has_template_hash=True) == [
        {"op": "test", "path": "/metadata/uid", "value": "abc"},
        {"op": "test", "path": "/metadata/ownerReferences", "value": owners},
        {"op": "remove", "path": "/metadata/ownerReferences"},
        {"op": "remove", "path": "/metadata/labels/pod-template-hash"},
    ]


def test_the_jobs_own_orphans_are_not_blockers_but_other_bare_pods_are():
    orphan = make_pod("orphan", uid="u-orphan", labels={"serving.knative.dev/revision": REV})  # released by the job
    stranger = make_pod("scratch", uid="u-scratch")
    elsewhere = make_pod("away", uid="u-away", node="n2")
    pods = [PodView.from_object(p) for p in (orphan, stranger, elsewhere)]
    assert blockers_remaining(pods, node="n1", own_orphans={"u-orphan"}) == [
        "org-a/scratch (bare pod (no controller would replace it))"]
    assert len(blockers_remaining(pods, node="n1", own_orphans=set())) == 2


def test_a_model_pod_the_job_did_not_orphan_blocks_the_node():
    """It landed after the report, or its revision had no PodAutoscaler: no replacement
    covers it, so the node is not safe while it runs."""
    late = make_model_pod("late", revision=REV, uid="u-late")
    [blocker] = blockers_remaining([PodView.from_object(late)], node="n1", own_orphans={"u-orphan"})
    assert blocker.startswith("org-a/late (model pod this job did not orphan: Knative revision ")


def ready(pod: dict, *, is_ready: bool = True, deleting: bool = False) -> dict:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(is_ready)}]}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


def test_ready_pods_of_a_replicaset_leave_out_orphans_unready_and_terminating_pods():
    rs = f"{REV}-deployment-547cc9b97f"
    pods = [ready(make_model_pod("a", revision=REV)), ready(make_model_pod("b", revision=REV)),
            ready(make_pod("orphan", labels={"serving.knative.dev/revision": REV})),
            ready(make_model_pod("starting", revision=REV), is_ready=False),
            ready(make_model_pod("going", revision=REV), deleting=True),
            ready(make_model_pod("old", revision=REV, template_hash="0ld"))]
    assert replicaset_ready_pods(pods, replicaset=rs) == 2


# ---- the job's log as the CLI shows it, bad numbers, and the abort that cannot finish ------

from capacity.defrag.planning import LogFolder, abort_stuck_message, interval_validate, log_lines_to_drop  # noqa: E402


def fold(lines):
    folder = LogFolder()
    out = [printed for line in lines for printed in folder.feed(line)]
    return out + folder.flush()


def test_a_poll_repeated_464_times_prints_once_and_says_how_often():
    lines = ["Abort requested by CLI"] + ["kept: 2/3 ready without it"] * 464 + ["Aborted"]
    assert fold(lines) == ["Abort requested by CLI", "kept: 2/3 ready without it",
                           "… ×464 (the 1 line(s) above, 464 times in all)", "Aborted"]


def test_blocks_of_lines_fold_and_a_change_ends_the_fold_without_losing_a_line():
    lines = ["---", "scale=3"] * 5 + ["---", "scale=4", "Safe"]
    assert fold(lines) == ["---", "scale=3", "… ×5 (the 2 line(s) above, 5 times in all)", "---", "scale=4", "Safe"]


def test_nothing_repeated_is_printed_as_is_and_the_end_is_never_held_back():
    assert fold(["a", "b", "c", "a", "d"]) == ["a", "b", "c", "a", "d"]
    assert fold(["x", "x"]) == ["x", "… ×2 (the 1 line(s) above, 2 times in all)"]


@pytest.mark.parametrize("log_seq, dropped", [(0, None), (500, None), (501, (101, 101)), (5000, (101, 4600))])
def test_the_log_keeps_its_first_100_and_newest_400_lines(log_seq, dropped):
    assert log_lines_to_drop(log_seq=log_seq) == dropped


@pytest.mark.parametrize("value, error", [
    (10, None), (0.5, None), (float("nan"), "must be a finite number"), (float("inf"), "must be a finite number"),
    (-1, "must be between"), (0, "must be between"), (1e9, "must be between"), ("10", "must be a number"),
    (True, "must be a number")])
def test_intervals_name_their_field(value, error):
    message = interval_validate(value, field="--poll-interval", minimum=0.1, maximum=3600)
    if error is None:
        assert message is None
    else:
        assert message.startswith(f"--poll-interval {error}")


def test_a_whole_number_of_seconds_is_asked_for_where_it_must_be():
    assert interval_validate(2.5, field="timeout", minimum=1, maximum=86400, whole=True).startswith(
        "timeout must be a whole number")


def test_the_stuck_abort_names_the_orphans_the_pending_replacement_and_who_holds_the_room():
    message = abort_stuck_message(
        node="n1", waited_seconds=300.4, chosen_keep=False, recheck_seconds=300,
        kept=[{"revision": "org-a/m-00001", "ready": 2, "wanted": 3, "orphans": ["org-a/m-1"], "gpus": 8,
               "pending": [("org-a/m-9", "0/3 nodes are available: 1 node(s) were unschedulable")]}],
        cordoned=[{"node": "n2", "free": 8, "holder": "defrag job #7 (safe)"}])
    assert message.startswith("Abort stuck after 300s: the replacements cannot become ready. revision org-a/m-00001 "
                              "has 2/3 ready without its orphan(s) org-a/m-1 (8 GPU(s) on n1): org-a/m-9 is Pending "
                              "(0/3 nodes are available: 1 node(s) were unschedulable).")
    assert "node n2 (8 free GPU(s), cordoned by defrag job #7 (safe))" in message
    assert "`manage.py defrag n1 --abort --keep-orphans`" in message
    assert ("Checked again every 5 min: an orphan that can end by then (its revision scaled to zero, or its "
            "replacements ready) is deleted; the abort ends when none is left.") in message


# ---- the next step, decided from the job's record ------------------------------------------

from datetime import timedelta  # noqa: E402

from capacity.defrag.planning import Step, defrag_step_decide  # noqa: E402

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("state, next_check, abort, drain, step", [
    ("confirmed", None, False, False, Step.RECORD),
    ("waiting", NOW + timedelta(seconds=5), False, False, Step.NOT_DUE),
    ("waiting", NOW, False, False, Step.CHECK),
    ("waiting", NOW + timedelta(seconds=5), True, False, Step.TAKE_UP_ABORT),   # an abort does not wait
    ("safe", None, False, False, Step.REST),
    ("safe", None, False, True, Step.TAKE_UP_DRAIN),
    ("safe", None, True, True, Step.TAKE_UP_ABORT),                             # abort wins over drain
    ("failed", None, False, True, Step.REST),                                   # drain only from safe
    ("abort-stuck", NOW + timedelta(seconds=5), False, False, Step.REST),       # rests until its next check
    ("abort-stuck", NOW, False, False, Step.RECHECK),                           # …then is looked at again
    ("abort-stuck", None, False, False, Step.RECHECK),                          # stuck before it had a next check
    ("abort-stuck", None, True, False, Step.TAKE_UP_ABORT),                     # the operator's choice
    ("aborted", None, True, False, Step.REST),
    ("drained", None, True, False, Step.REST),
    ("aborting", NOW - timedelta(seconds=1), False, False, Step.ABORT),
])
def test_the_next_step_is_decided_from_the_record(state, next_check, abort, drain, step):
    assert defrag_step_decide(state=state, now=NOW, next_check_at=next_check, abort_pending=abort,
                              drain_requested=drain) == step


# ---- where to defrag: what emptying nodes frees, one after the other ---------------------

MOST, LEAST = Scoring.MOST_ALLOCATED, Scoring.LEAST_ALLOCATED


def advice_for(layout: dict[str, list[int] | str], *, held=(), scoring: str = MOST) -> DefragAdvice:
    """`layout`: node → the GPUs of its model pods (8-GPU H100 nodes). A string instead
    names a special node: "empty", "cordoned:4" (cordoned, one 4-GPU pod), "a10g:4" (an
    A10G node), "blocked:4" (a 4-GPU notebook StatefulSet pod), "blocked16:1" (the same on
    a 16-GPU H100 node)."""
    nodes, pods = [], []
    for name, spec in layout.items():
        kind, _, size = spec.partition(":") if isinstance(spec, str) else ("", "", "")
        gpus = [int(size)] if size else ([] if kind else spec)
        nodes.append(make_node(name, unschedulable=kind == "cordoned", gpus=16 if kind == "blocked16" else 8,
                               **({"product": "NVIDIA-A10G", "pool": "a10g"} if kind == "a10g" else {})))
        for i, g in enumerate(gpus):
            if kind.startswith("blocked"):
                pods.append(make_pod(f"{name}-nb-{i}", node=name, gpus=g, owner=("StatefulSet", f"{name}-nb")))
            else:
                pods.append(make_model_pod(f"{name}-{i}", revision=f"m{name}{i}-00001", node=name, gpus=g))
    return defrag_advice(ClusterSnapshot.build(taken_at=NOW, nodes=[NodeView.from_object(n) for n in nodes],
                                               pods=[PodView.from_object(p) for p in pods]),
                         held_nodes=held, scoring=scoring)


T, C, F, E, N = Freeing.TOGETHER, Freeing.CONTENDED, Freeing.FILLS_EMPTY, Freeing.NEEDS_EMPTY, Freeing.NO_ROOM
FILLS = "would only move {} pods onto an empty node under the scheduler's LeastAllocated scoring (no whole node freed)"
NONE_INTO_OTHERS = "No node can be emptied into the free GPUs of other non-empty nodes; "

# (layout, held, {scoring: (outcomes, summary)}): the same cluster under both strategies.
ADVICE = [
    pytest.param({**{n: [2, 2] for n in "abcdef"}, "z": "empty"}, (), {
        MOST: ({"a": T, "b": T, "c": T, "d": C, "e": C, "f": C},
               "3 nodes can be freed together; the next 3 each need the room the first ones use."),
        LEAST: (dict.fromkeys("abcdef", F), NONE_INTO_OTHERS + "6 " + FILLS.format("their") + ".")},
        id="six half-full nodes and an empty one: three freed by packing, none by spreading"),
    pytest.param({n: [2, 2] for n in "abcdef"}, (), {
        MOST: ({"a": T, "b": T, "c": T, "d": C, "e": C, "f": C},
               "3 nodes can be freed together; the next 3 each need the room the first ones use."),
        LEAST: ({"a": T, "b": T, "c": T, "d": C, "e": C, "f": C},
                "3 nodes can be freed together; the next 3 each need the room the first ones use.")},
        id="six half-full nodes and no empty one: spreading frees as many"),
    pytest.param({"a": [4], "b": [4], "z": "empty"}, (), {
        MOST: ({"a": T, "b": C}, "1 node can be freed; 1 more needs the room the first one uses."),
        LEAST: ({"a": F, "b": F}, NONE_INTO_OTHERS + "2 " + FILLS.format("their") + ".")},
        id="two nodes whose pods can only move onto each other"),
    pytest.param({"a": [1], "b": [6], "z": "empty"}, (), {
        MOST: ({"a": T, "b": C}, "1 node can be freed; 1 more needs the room the first one uses."),
        LEAST: ({"a": F, "b": F}, NONE_INTO_OTHERS + "2 " + FILLS.format("their") + ".")},
        id="packing puts the replacement on the fullest node, spreading on the empty one"),
    pytest.param({"a": [7], "b": [7], "z": "empty"}, (), {
        MOST: ({"a": E, "b": E}, NONE_INTO_OTHERS + "2 cannot be freed without using an empty node."),
        LEAST: ({"a": E, "b": E}, NONE_INTO_OTHERS + "2 cannot be freed without using an empty node.")},
        id="only the empty node has room: nothing freed under either"),
    pytest.param({"a": [8]}, (), {
        MOST: ({"a": N}, NONE_INTO_OTHERS + "1 cannot be freed at all (no room for its pods, even on empty nodes)."),
        LEAST: ({"a": N}, NONE_INTO_OTHERS + "1 cannot be freed at all (no room for its pods, even on empty nodes).")},
        id="no room anywhere"),
    pytest.param({"a": [4], "b": "cordoned:4", "c": [4], "z": "empty"}, ("c",), {
        MOST: ({"a": E}, NONE_INTO_OTHERS + "1 cannot be freed without using an empty node."),
        LEAST: ({"a": E}, NONE_INTO_OTHERS + "1 cannot be freed without using an empty node.")},
        id="cordoned and job-held nodes are neither room nor candidates"),
    pytest.param({"a": [4], "b": "a10g:4"}, (), {
        MOST: ({"a": N, "b": N}, NONE_INTO_OTHERS + "2 cannot be freed at all (no room for their pods, even on "
                                                    "empty nodes)."),
        LEAST: ({"a": N, "b": N}, NONE_INTO_OTHERS + "2 cannot be freed at all (no room for their pods, even on "
                                                     "empty nodes).")},
        id="GPU products do not share room"),
    pytest.param({"a": "blocked:4", "b": [4]}, (), {
        MOST: ({"b": T}, "1 node can be freed."), LEAST: ({"b": T}, "1 node can be freed.")},
        id="a blocked node is room but no candidate"),
    pytest.param({"a": [2], "b": [3], "c": [3, 1], "d": [2, 2, 2]}, (), {
        MOST: ({"a": T, "b": T, "c": C, "d": C},
               "2 nodes can be freed together; the next 2 each need the room the first ones use."),
        LEAST: ({"a": T, "b": T, "c": C, "d": C},
                "2 nodes can be freed together; the next 2 each need the room the first ones use.")},
        id="smallest first, each reserving the room its pods take"),
    pytest.param({"a": [2], "x": "blocked16:1", "z": "empty"}, (), {
        MOST: ({"a": T}, "1 node can be freed."), LEAST: ({"a": T}, "1 node can be freed.")},
        id="a partly used bigger node with more room left than the empty one takes the pod under both"),
    pytest.param({"a": [1], "x": "blocked16:1", "z": "empty"}, (), {
        MOST: ({"a": T}, "1 node can be freed."), LEAST: ({"a": F}, NONE_INTO_OTHERS + "1 " + FILLS.format("its") + ".")},
        id="an equal score between a partly used node and an empty one counts as the empty one"),
    pytest.param({"a": [2], "b": [2], "x": "blocked16:1", "z": "empty"}, (), {
        MOST: ({"a": T, "b": T}, "2 nodes can be freed together."),
        LEAST: ({"a": T, "b": C}, "1 node can be freed; 1 more needs the room the first one uses.")},
        id="spreading: once the first takes the partly used room, the next one's pods would go to the empty node"),
    pytest.param({"z": "empty", "y": "empty"}, (), {
        MOST: ({}, "No node to empty: every GPU node is empty, cordoned, held by a defrag job or blocked."),
        LEAST: ({}, "No node to empty: every GPU node is empty, cordoned, held by a defrag job or blocked.")},
        id="nothing to empty"),
]


@pytest.mark.parametrize("scoring", [MOST, LEAST])
@pytest.mark.parametrize("layout, held, expected", ADVICE)
def test_the_advice_simulates_the_candidates_in_order_where_the_scheduler_would_put_them(layout, held, expected,
                                                                                          scoring):
    outcomes, summary = expected[scoring]
    advice = advice_for(layout, held=held, scoring=scoring)
    assert {s.node: s.outcome for s in advice.steps} == outcomes
    assert advice.summary == summary
    empty = {name for name, spec in layout.items() if spec == "empty"}
    together = [s for s in advice.steps if s.outcome == T]
    assert [s.position for s in together] == list(range(1, len(together) + 1))
    for s in together:       # never planned onto an empty node, nor onto a node freed before it
        assert s.moves and not {m.to for m in s.moves} & (empty | {t.node for t in together[:s.position]})
    # Room is reserved: what the freed nodes' pods take never exceeds what a node had free.
    free = {name: (16 if str(spec).startswith("blocked16") else 8)
            - (sum(spec) if isinstance(spec, list) else int(spec.partition(":")[2] or 0))
            for name, spec in layout.items()}
    for s in together:
        for m in s.moves:
            free[m.to] -= m.gpus
    assert all(f >= 0 for f in free.values())
    # Only real frees are counted as whole nodes freed.
    assert sum(s.frees_whole_node for s in advice.steps) == len(together)


def test_under_spreading_the_advice_names_the_empty_node_and_what_the_operator_can_do():
    """The demo walk: the map said a pod fitted on the fullest node, the scheduler put it on an empty one."""
    advice = advice_for({"a": [1], "b": [6], "z": "empty", "y": "empty"}, scoring=LEAST)
    a = next(s for s in advice.steps if s.node == "a")
    assert (a.outcome, a.frees_whole_node, a.moves) == (F, False, ())
    assert a.outcome_label == "frees nothing: its pods would fill an empty node"
    assert a.why == (
        "its pod would go to empty node y (1 GPU) under the scheduler's LeastAllocated scoring (kube-scheduler's "
        "default spreads onto the emptiest node): no whole node freed. To free it, set the scheduler's "
        "NodeResourcesFit scoringStrategy to MostAllocated (and CAPACITY_SCHEDULER_SCORING=MostAllocated here), "
        "or cordon the 2 empty nodes y, z while the job runs and return them to service after; then its pods "
        "would go to b (1 GPU)")
    # Packing the same cluster: the pod goes to the fullest node and a is freed.
    packed = advice_for({"a": [1], "b": [6], "z": "empty", "y": "empty"}, scoring=MOST)
    assert packed.steps[0].node == "a" and packed.steps[0].moves == (Move(pod="org-a/a-0", gpus=1, to="b"),)


def test_a_node_contended_by_spreading_says_its_pods_would_go_to_the_empty_node():
    advice = advice_for({"a": [2], "b": [2], "x": "blocked16:1", "z": "empty"}, scoring=LEAST)
    a, b = advice.steps
    assert a.moves == (Move(pod="org-a/a-0", gpus=2, to="x"),)
    assert b.why.startswith("on its own its pods (2 GPUs) would fit on x (2 GPUs), but with the 1 node before it freed "
                            "too, its pod would go to empty node z (2 GPUs) under the scheduler's LeastAllocated scoring")


@pytest.mark.parametrize("value", ["leastallocated", "Spread", "RequestedToCapacityRatio", ""])
def test_an_unknown_scoring_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"CAPACITY_SCHEDULER_SCORING must be one of LeastAllocated, "
                                         r"MostAllocated .* not '" + value):
        advice_for({"a": [1], "b": [2]}, scoring=value)


@pytest.mark.parametrize("value", ["spread", "most-allocated", "RequestedToCapacityRatio"])
def test_the_product_does_not_start_with_an_unknown_scheduler_scoring(value):
    proc = manage_check(CAPACITY_SCHEDULER_SCORING=value)
    assert proc.returncode != 0
    assert (f"ImproperlyConfigured: CAPACITY_SCHEDULER_SCORING must be LeastAllocated (kube-scheduler's default) or "
            f"MostAllocated (a bin-packing scheduler), not '{value}'") in proc.stderr


@pytest.mark.parametrize("layout, whys", [
    pytest.param({"a": [4], "b": [4], "z": "empty"}, {
        "a": "its 1 pod (4 GPUs) fits on b (4 GPUs)",
        "b": "on its own its pods (4 GPUs) would fit on a (4 GPUs), but a (freed before it) uses that room: it can be "
             "freed instead, not as well; it would also hold replacements from a"}, id="contended"),
    pytest.param({"a": [7], "b": [7], "z": "empty"}, {
        "a": "cannot be freed without using an empty node: its pods need 7 GPUs (other non-empty nodes have 1 free "
             "GPU(s), at most 1 on one); they would go to z (7 GPUs)"}, id="needs the empty node"),
    pytest.param({"a": [8], "b": [1]}, {
        "a": "its pods need 8 GPUs and fit nowhere, not even on an empty node (other non-empty nodes have 7 free "
             "GPU(s), at most 7 on one)"}, id="no room"),
    pytest.param({"a": [1], "b": [2], "x": "blocked:1"}, {
        "a": "its 1 pod (1 GPU) fits on b (1 GPU)",
        "b": "with the 1 node before it freed too, its 2 pods (3 GPUs, 1 of them replacements from a) fit on "
             "x (3 GPUs)"}, id="a node freed later takes the replacements it received along"),
])
def test_why_names_where_the_pods_go_and_what_takes_the_room(layout, whys):
    steps = {s.node: s for s in advice_for(layout).steps}
    assert {node: steps[node].why for node in whys} == whys


def test_a_node_freed_later_moves_the_replacements_it_received_and_the_room_they_take():
    advice = advice_for({"a": [1], "b": [2], "x": "blocked:1"})
    assert advice.summary == "2 nodes can be freed together."
    a, b = advice.steps
    assert a.moves == (Move(pod="org-a/a-0", gpus=1, to="b"),)
    assert (b.gpus_moved, b.pods_moved, b.position) == (3, 2, 2)
    assert b.moves == (Move(pod="org-a/b-0", gpus=2, to="x"), Move(pod="org-a/a-0", gpus=1, to="x"))


def test_a_pools_advice_keeps_the_clusters_order():
    advice = advice_for({n: [2, 2] for n in "abcdef"}).only({"b", "e"})
    assert [(s.node, s.outcome, s.position) for s in advice.steps] == [("b", T, 2), ("e", C, None)]
    assert advice.summary == "1 node can be freed; 1 more needs the room the first one uses."
    spread = advice_for({"a": [1], "b": [6], "z": "empty"}, scoring=LEAST).only({"b"})
    assert spread.summary == NONE_INTO_OTHERS + "1 " + FILLS.format("its") + "."


@pytest.mark.parametrize("scoring, placement", [(LEAST, "spread"), (MOST, "most-allocated")])
def test_the_advice_puts_a_replacement_where_the_clusters_scheduler_does(scoring, placement):
    """Against simcluster's scheduler (kube-scheduler's filters and scoring) through the
    official client: cordon the candidate as a job does, make its pod's replacement, and the
    scheduler binds it to the node the advice named."""
    from clusters.kube import KubeGateway
    from clusters.selectors import snapshot_take
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from simcluster.control import SimControl
    from simcluster.testing import running_cluster

    def running(pod: dict) -> dict:
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        return pod

    objects = [make_node(n) for n in ("a", "b", "y", "z")] + [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}},
        {"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation", "spec": {"placement": placement}},
        running(make_model_pod("a-0", revision="ma0-00001", node="a", gpus=1)),
        running(make_model_pod("b-0", revision="mb0-00001", node="b", gpus=6))]
    with running_cluster(objects) as url:
        gateway = KubeGateway.from_kubeconfig(str(url.kubeconfig_path))
        advice = defrag_advice(snapshot_take(gateway, now=NOW), scoring=scoring)
        a = next(s for s in advice.steps if s.node == "a")
        api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(url.kubeconfig_path)))
        api.patch_node("a", {"spec": {"unschedulable": True}})
        replacement = make_model_pod("a-1", revision="ma0-00001", node=None, gpus=1)
        replacement["metadata"].pop("uid")
        api.create_namespaced_pod("org-a", replacement)
        SimControl(url).advance(0)
        landed = api.read_namespaced_pod("a-1", "org-a").spec.node_name
    if scoring == LEAST:
        assert (a.outcome, landed) == (F, "y")
        assert a.why.startswith("its pod would go to empty node y (1 GPU) under the scheduler's LeastAllocated scoring")
    else:
        assert (a.outcome, [m.to for m in a.moves], landed) == (T, ["b"], "b")


@pytest.mark.parametrize(("desired_scale", "current_replicas", "asleep"), [
    (0, 0, True),        # scaled to zero: nothing to replace
    (None, 0, False),    # the autoscaler has not said: the ReplicaSet alone may be a rollout's old one
    (0, 1, False),       # deciding zero, not there yet: its pods still serve
    (2, 0, False),
    (1, 1, False),
])
def test_a_revision_is_asleep_only_when_its_autoscaler_and_replicaset_both_want_no_pod(
        desired_scale, current_replicas, asleep):
    from capacity.defrag.planning import revision_asleep

    assert revision_asleep(desired_scale=desired_scale, current_replicas=current_replicas) is asleep


@pytest.mark.parametrize("pod_uid, terminating, outcome", [
    (None, False, EndSettle.GONE),              # it went out, and the pod finished terminating since
    ("uid-1", True, EndSettle.TERMINATING),     # it went out: the pod is in its grace period
    ("uid-2", False, EndSettle.REPLACED),       # a new pod under the name: not the job's
    ("uid-2", True, EndSettle.REPLACED),        # ... whatever becomes of that one
    ("uid-1", False, EndSettle.NOT_SENT),       # the pod serves on: it never took effect
])
def test_an_orphans_end_left_unrecorded_is_settled_from_the_pod_now_under_its_name(pod_uid, terminating, outcome):
    assert orphan_end_settle(orphan_uid="uid-1", pod_uid=pod_uid, terminating=terminating) == outcome
