"""Which nodes to empty: the advice simulates the candidates in order over one snapshot,
placing each replacement where the cluster's scheduler would."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from defrag_builders import make_model_pod, make_node, make_pod
from capacity.gpumap.advice import DefragAdvice, Freeing, Move, Scoring, defrag_advice
from clusters.snapshot import ClusterSnapshot, NodeView, PodView
from tests.settings_check import manage_check

NOW = datetime(2026, 1, 1, tzinfo=UTC)


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
