"""CREATE, GET, LIST, UPDATE and DELETE through the official kubernetes client."""
from __future__ import annotations

import pytest
from kubernetes.client import ApiException

from simcluster_helpers import pod, status_of


def test_create_get_and_list_a_pod(kube):
    created = kube.core.create_namespaced_pod("team-a", pod("p1", labels={"app": "llm"}))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    fetched = kube.core.read_namespaced_pod("p1", "team-a")
    assert fetched.metadata.uid == created.metadata.uid
    assert [p.metadata.name for p in kube.core.list_namespaced_pod("team-a").items] == ["p1"]


def test_generate_name_gives_a_fresh_name_each_time(kube):
    body = pod("")
    body["metadata"] = {"generateName": "worker-", "namespace": "team-a"}
    first = kube.core.create_namespaced_pod("team-a", body)
    second = kube.core.create_namespaced_pod("team-a", body)
    assert first.metadata.name.startswith("worker-") and second.metadata.name.startswith("worker-")
    assert first.metadata.name != second.metadata.name


def test_creating_twice_is_409_already_exists(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespaced_pod("team-a", pod("p1"))
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (409, "AlreadyExists")
    assert status["message"] == 'pods "p1" already exists'


def test_creating_in_a_missing_namespace_is_404_namespace_not_found(kube):
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespaced_pod("nowhere", pod("p1", namespace="nowhere"))
    assert caught.value.status == 404
    assert status_of(caught.value)["message"] == 'namespaces "nowhere" not found'


def test_reading_a_missing_object_is_404(kube):
    with pytest.raises(ApiException) as caught:
        kube.apps.read_namespaced_deployment("ghost", "team-a")
    status = status_of(caught.value)
    assert (status["reason"], status["message"]) == ("NotFound", 'deployments.apps "ghost" not found')


def test_update_with_a_stale_resource_version_is_409_conflict(kube):
    created = kube.core.create_namespaced_pod("team-a", pod("p1"))
    created.metadata.labels = {"v": "1"}
    kube.core.replace_namespaced_pod("p1", "team-a", created)           # moves the resourceVersion on
    created.metadata.labels = {"v": "2"}
    with pytest.raises(ApiException) as caught:
        kube.core.replace_namespaced_pod("p1", "team-a", created)       # still the old one
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status["message"]
    assert kube.core.read_namespaced_pod("p1", "team-a").metadata.labels == {"v": "1"}


def test_update_with_the_current_resource_version_succeeds(kube):
    created = kube.core.create_namespaced_pod("team-a", pod("p1"))
    created.metadata.labels = {"v": "1"}
    updated = kube.core.replace_namespaced_pod("p1", "team-a", created)
    assert updated.metadata.labels == {"v": "1"}
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)


def test_dry_run_create_stores_nothing(kube):
    answered = kube.core.create_namespaced_pod("team-a", pod("p1"), dry_run="All")
    assert answered.metadata.name == "p1"
    assert kube.core.list_namespaced_pod("team-a").items == []


@pytest.mark.parametrize("name", ["Upper", "under_score", "-dash", "a" * 254])
def test_invalid_names_are_422_invalid(kube, name):
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespaced_pod("team-a", pod(name))
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    assert status["details"]["causes"][0]["field"] == "metadata.name"


def test_a_namespace_name_must_be_a_dns_label(kube):
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespace({"metadata": {"name": "has.dots"}})
    assert caught.value.status == 422


@pytest.mark.parametrize("labels", [{"bad key!": "x"}, {"ok": "bad value!"}, {"ok": "x" * 64},
                                    {"/no-prefix": "x"}])
def test_invalid_labels_are_422(kube, labels):
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespaced_pod("team-a", pod("p1", labels=labels))
    assert status_of(caught.value)["reason"] == "Invalid"
    assert status_of(caught.value)["details"]["causes"][0]["field"] == "metadata.labels"


def test_a_bad_label_is_refused_every_time_naming_both_its_key_and_its_value(kube):
    # Keys and values are checked once and remembered: the second refusal must say
    # exactly what the first did, and nothing is stored either time.
    refusals = []
    for name in ("p1", "p2"):
        with pytest.raises(ApiException) as caught:
            kube.core.create_namespaced_pod("team-a", pod(name, labels={"bad key!": "bad value!"}))
        refusals.append([(c["field"], c["message"]) for c in status_of(caught.value)["details"]["causes"]])
    assert refusals[0] == refusals[1]
    assert [message.split(":")[0] for _, message in refusals[0]] == ['Invalid value', 'Invalid value']
    assert '"bad key!"' in refusals[0][0][1] and '"bad value!"' in refusals[0][1][1]
    assert kube.core.list_namespaced_pod("team-a").items == []


@pytest.mark.parametrize("cost", ["+5", "007", "1.5", "abc", "2147483648", "-2147483649", ""])
def test_a_deletion_cost_that_is_not_a_plain_int32_is_422(kube, cost):
    with pytest.raises(ApiException) as caught:
        kube.core.create_namespaced_pod("team-a", pod("p1", annotations={
            "controller.kubernetes.io/pod-deletion-cost": cost}))
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    cause = status["details"]["causes"][0]
    assert cause["field"] == "metadata.annotations[controller.kubernetes.io/pod-deletion-cost]"
    assert "must be a 32bit integer" in cause["message"]


@pytest.mark.parametrize("cost", ["0", "-5", "2147483647", "-2147483648", "100"])
def test_a_plain_int32_deletion_cost_is_accepted(kube, cost):
    created = kube.core.create_namespaced_pod("team-a", pod("p1", annotations={
        "controller.kubernetes.io/pod-deletion-cost": cost}))
    assert created.metadata.annotations["controller.kubernetes.io/pod-deletion-cost"] == cost


def test_a_patch_cannot_set_an_invalid_deletion_cost_either(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    with pytest.raises(ApiException) as caught:
        kube.core.patch_namespaced_pod("p1", "team-a", {"metadata": {"annotations": {
            "controller.kubernetes.io/pod-deletion-cost": "01"}}})
    assert caught.value.status == 422


def test_cluster_wide_list_of_a_namespaced_kind(kube):
    kube.core.create_namespace({"metadata": {"name": "team-b"}})
    kube.core.create_namespaced_pod("team-a", pod("a1"))
    kube.core.create_namespaced_pod("team-b", pod("b1", namespace="team-b"))
    listed = kube.core.list_pod_for_all_namespaces()
    assert [(p.metadata.namespace, p.metadata.name) for p in listed.items] == [("team-a", "a1"), ("team-b", "b1")]
    assert int(listed.metadata.resource_version) >= 1


@pytest.mark.parametrize("selector, expected", [
    ("app=llm", ["a", "b"]),
    ("app==llm", ["a", "b"]),
    ("app!=llm", ["c", "d"]),
    ("tier in (gpu, cpu)", ["a", "c"]),
    ("tier notin (gpu)", ["b", "c", "d"]),
    ("tier", ["a", "c"]),
    ("!tier", ["b", "d"]),
    ("app=llm,tier=gpu", ["a"]),
])
def test_label_selector_grammar(kube, selector, expected):
    for name, labels in {"a": {"app": "llm", "tier": "gpu"}, "b": {"app": "llm"},
                         "c": {"app": "web", "tier": "cpu"}, "d": {}}.items():
        kube.core.create_namespaced_pod("team-a", pod(name, labels=labels))
    listed = kube.core.list_namespaced_pod("team-a", label_selector=selector)
    assert [p.metadata.name for p in listed.items] == expected


def test_field_selectors_on_node_name_phase_and_name(kube):
    kube.core.create_namespaced_pod("team-a", pod("on-1", node="gpu-1"))
    kube.core.create_namespaced_pod("team-a", pod("on-2", node="gpu-2"))
    kube.core.create_namespaced_pod("team-a", pod("nowhere"))
    by_node = kube.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1")
    assert [p.metadata.name for p in by_node.items] == ["on-1"]
    unbound = kube.core.list_namespaced_pod("team-a", field_selector="spec.nodeName=")
    assert [p.metadata.name for p in unbound.items] == ["nowhere"]
    by_name = kube.core.list_namespaced_pod("team-a", field_selector="metadata.name=on-2")
    assert [p.metadata.name for p in by_name.items] == ["on-2"]


def test_field_selector_on_node_unschedulable(kube):
    kube.core.patch_node("gpu-2", {"spec": {"unschedulable": True}})
    cordoned = kube.core.list_node(field_selector="spec.unschedulable=true")
    assert [n.metadata.name for n in cordoned.items] == ["gpu-2"]


@pytest.mark.parametrize("kwargs, reason_text", [
    ({"label_selector": "tier in (gpu"}, "unbalanced"),
    ({"label_selector": "a b c"}, "unable to parse"),
    ({"field_selector": "spec.image=x"}, "field label not supported"),
])
def test_malformed_selectors_are_400(kube, kwargs, reason_text):
    with pytest.raises(ApiException) as caught:
        kube.core.list_namespaced_pod("team-a", **kwargs)
    status = status_of(caught.value)
    assert (caught.value.status, status["reason"]) == (400, "BadRequest")
    assert reason_text in status["message"]


def test_limit_and_continue_page_through_a_list(kube):
    for i in range(5):
        kube.core.create_namespaced_pod("team-a", pod(f"p{i}"))
    seen, token, pages = [], None, 0
    while True:
        page = kube.core.list_namespaced_pod("team-a", limit=2, _continue=token)
        seen += [p.metadata.name for p in page.items]
        pages += 1
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(seen)
    assert (seen, pages) == (["p0", "p1", "p2", "p3", "p4"], 3)


def test_a_forged_continue_token_is_400(kube):
    with pytest.raises(ApiException) as caught:
        kube.core.list_namespaced_pod("team-a", _continue="not-a-token")
    assert caught.value.status == 400


def test_delete_of_an_unbound_pod_is_immediate(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    answer = kube.core.delete_namespaced_pod("p1", "team-a")   # pods answer with the deleted object
    assert answer.metadata.name == "p1"
    assert kube.core.list_namespaced_pod("team-a").items == []


def test_delete_of_a_bound_pod_waits_for_its_grace_period(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1", node="gpu-1"))
    kube.core.delete_namespaced_pod("p1", "team-a", grace_period_seconds=30)
    terminating = kube.core.read_namespaced_pod("p1", "team-a")
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30


def test_delete_with_a_uid_precondition_that_does_not_match_is_409(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    with pytest.raises(ApiException) as caught:
        kube.core.delete_namespaced_pod("p1", "team-a", body={"preconditions": {"uid": "not-the-uid"}})
    assert caught.value.status == 409
    assert "Precondition failed" in status_of(caught.value)["message"]


def test_delete_dry_run_keeps_the_object(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    kube.core.delete_namespaced_pod("p1", "team-a", dry_run="All")
    assert kube.core.read_namespaced_pod("p1", "team-a").metadata.name == "p1"


def test_delete_collection_by_label(kube):
    kube.core.create_namespaced_pod("team-a", pod("keep", labels={"app": "web"}))
    kube.core.create_namespaced_pod("team-a", pod("drop-1", labels={"app": "llm"}))
    kube.core.create_namespaced_pod("team-a", pod("drop-2", labels={"app": "llm"}))
    kube.core.delete_collection_namespaced_pod("team-a", label_selector="app=llm")
    assert [p.metadata.name for p in kube.core.list_namespaced_pod("team-a").items] == ["keep"]


def test_deleting_a_namespace_removes_what_it_holds(kube):
    kube.core.create_namespaced_pod("team-a", pod("p1"))
    kube.core.delete_namespace("team-a")
    assert kube.core.list_pod_for_all_namespaces().items == []
    with pytest.raises(ApiException) as caught:
        kube.core.read_namespace("team-a")
    assert caught.value.status == 404
