"""Pure defrag planning: the discovery report, blockers, the safety condition, the next step."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from defrag_builders import make_model_pod, make_node, make_pod
from capacity.defrag.planning import (
    DefragPlan,
    EndSettle,
    RevisionScale,
    Role,
    blockers_remaining,
    defrag_plan,
    orphan_end_settle,
    orphan_patch,
    pod_classify,
    progress_line,
    replicaset_ready_pods,
    revision_satisfied,
)
from clusters.snapshot import NodeView, PodView

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


from capacity.defrag.planning import OrphanEndChoice, orphan_end_decide  # noqa: E402

BACK, ASLEEP, DELETED = "its revision is back to scale", f"revision {REV} is scaled to zero, no replacement needed", \
    "its model was deleted"
FORCED = "abort, operator chose to delete anyway"


@pytest.mark.parametrize("ready, wanted, model_deleted, asleep, force, checked_again, choice, why, context", [
    # Back to scale without it: deleted, whatever the operator chose.
    (3, 3, False, False, False, False, OrphanEndChoice.DELETE, BACK, "abort"),
    (4, 3, False, False, True, False, OrphanEndChoice.DELETE, BACK, "abort"),
    (3, 3, False, False, False, True, OrphanEndChoice.DELETE, BACK, "abort-stuck, checked again"),
    # Short of its wanted scale: kept, unless the operator chose to delete anyway.
    (2, 3, False, False, False, False, OrphanEndChoice.KEEP, "", "abort"),
    (0, 1, False, False, False, True, OrphanEndChoice.KEEP, "", "abort-stuck, checked again"),
    (2, 3, False, False, True, False, OrphanEndChoice.FORCE, "its revision has 2/3 ready without it", FORCED),
    (2, 3, False, False, True, True, OrphanEndChoice.FORCE, "its revision has 2/3 ready without it", FORCED),
    # Scaled to zero, or its model deleted: nothing wants it (wanted 0), deleted and said why.
    (0, 0, False, True, False, False, OrphanEndChoice.DELETE, ASLEEP, "abort"),
    (0, 0, False, True, False, True, OrphanEndChoice.DELETE, ASLEEP, "abort-stuck, checked again"),
    (0, 0, True, False, False, False, OrphanEndChoice.DELETE, DELETED, "abort"),
    (0, 0, True, False, True, True, OrphanEndChoice.DELETE, DELETED, "abort-stuck, checked again"),
])
def test_an_abort_deletes_an_orphan_its_revision_no_longer_needs_and_keeps_the_others_unless_forced(
        ready, wanted, model_deleted, asleep, force, checked_again, choice, why, context):
    decision = orphan_end_decide(revision=REV, ready=ready, wanted=wanted, model_deleted=model_deleted,
                                 asleep=asleep, force=force, checked_again=checked_again)
    assert (decision.choice, decision.why, decision.context) == (choice, why, context)
    assert decision.keep == (choice == OrphanEndChoice.KEEP)
