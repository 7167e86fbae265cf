"""WATCH through the official client's `watch.Watch` (chunked streams over HTTP)."""
from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import watch
from kubernetes.client import ApiException

from simcluster_helpers import pod

# A safety net only: each test stops its watch as soon as it has what it expects.
STREAM_TIMEOUT = 10


def collect(list_call, *args, count: int, **kwargs) -> list[tuple[str, str, dict]]:
    """(type, name, labels) of the first `count` events."""
    events = []
    w = watch.Watch()
    for event in w.stream(list_call, *args, timeout_seconds=STREAM_TIMEOUT, **kwargs):
        obj = event["object"]
        events.append((event["type"], obj.metadata.name, obj.metadata.labels or {}))
        if len(events) == count:
            w.stop()
    return events


def test_a_watch_without_resource_version_starts_with_what_exists(kube):
    kube.core.create_namespaced_pod("team-a", pod("a"))
    kube.core.create_namespaced_pod("team-a", pod("b"))
    events = collect(kube.core.list_namespaced_pod, "team-a", count=2)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_a_watch_from_a_resource_version_replays_added_modified_deleted(kube):
    start = kube.core.list_namespaced_pod("team-a").metadata.resource_version
    kube.core.create_namespaced_pod("team-a", pod("a"))
    kube.core.patch_namespaced_pod("a", "team-a", {"metadata": {"labels": {"v": "2"}}})
    kube.core.delete_namespaced_pod("a", "team-a")
    events = collect(kube.core.list_namespaced_pod, "team-a", resource_version=start, count=3)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert events[1][2] == {"v": "2"}


def test_an_open_watch_receives_writes_made_after_it_opened(kube):
    # The headers arrive as soon as the watch is open, before any event.
    response = urllib3.request("GET", f"{kube.url}/api/v1/namespaces/team-a/pods?watch=true"
                                      f"&timeoutSeconds={STREAM_TIMEOUT}", preload_content=False)
    assert response.status == 200
    kube.core.create_namespaced_pod("team-a", pod("late"))
    first = json.loads(next(iter(response)))
    response.release_conn()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "late")


def test_a_watch_only_sees_its_namespace_and_kind(kube):
    kube.core.create_namespace({"metadata": {"name": "team-b"}})
    start = kube.core.list_namespaced_pod("team-a").metadata.resource_version
    kube.core.create_namespaced_pod("team-b", pod("elsewhere", namespace="team-b"))
    kube.core.patch_node("gpu-1", {"metadata": {"labels": {"x": "y"}}})
    kube.core.create_namespaced_pod("team-a", pod("here"))
    events = collect(kube.core.list_namespaced_pod, "team-a", resource_version=start, count=1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "here")]


def test_a_label_selector_turns_leaving_into_deleted_and_joining_into_added(kube):
    kube.core.create_namespaced_pod("team-a", pod("a", labels={"app": "llm"}))
    kube.core.create_namespaced_pod("team-a", pod("b", labels={"app": "web"}))
    start = kube.core.list_namespaced_pod("team-a").metadata.resource_version
    kube.core.patch_namespaced_pod("a", "team-a", {"metadata": {"labels": {"app": "web"}}})   # leaves
    kube.core.patch_namespaced_pod("b", "team-a", {"metadata": {"labels": {"app": "llm"}}})   # joins
    kube.core.patch_namespaced_pod("b", "team-a", {"metadata": {"labels": {"v": "2"}}})       # stays
    events = collect(kube.core.list_namespaced_pod, "team-a", resource_version=start,
                     label_selector="app=llm", count=3)
    assert [(t, n) for t, n, _ in events] == [("DELETED", "a"), ("ADDED", "b"), ("MODIFIED", "b")]


def test_a_field_selector_filters_events(kube):
    start = kube.core.list_pod_for_all_namespaces().metadata.resource_version
    kube.core.create_namespaced_pod("team-a", pod("on-1", node="gpu-1"))
    kube.core.create_namespaced_pod("team-a", pod("on-2", node="gpu-2"))
    events = collect(kube.core.list_pod_for_all_namespaces, resource_version=start,
                     field_selector="spec.nodeName=gpu-2", count=1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "on-2")]


def test_a_watch_from_a_compacted_version_is_410_gone(kube):
    start = kube.core.list_namespaced_pod("team-a").metadata.resource_version
    kube.core.create_namespaced_pod("team-a", pod("a"))
    kube.core.create_namespaced_pod("team-a", pod("b"))
    kube.sim.store.compact(kube.sim.store.resource_version)
    with pytest.raises(ApiException) as caught:
        collect(kube.core.list_namespaced_pod, "team-a", resource_version=start, count=1)
    assert caught.value.status == 410


def test_the_410_arrives_as_an_error_event_in_a_200_stream(kube):
    kube.core.create_namespaced_pod("team-a", pod("a"))
    kube.sim.store.compact(kube.sim.store.resource_version)
    response = urllib3.request("GET", f"{kube.url}/api/v1/namespaces/team-a/pods?watch=true&resourceVersion=1")
    assert response.status == 200
    event = json.loads(response.data.splitlines()[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_timeout_seconds_ends_the_stream(kube):
    response = urllib3.request("GET", f"{kube.url}/api/v1/namespaces/team-a/pods?watch=1&timeoutSeconds=0")
    assert (response.status, response.data) == (200, b"")


def test_bookmarks_carry_the_resource_version_when_asked_for(kube):
    kube.core.create_namespaced_pod("team-a", pod("a"))
    response = urllib3.request("GET", f"{kube.url}/api/v1/namespaces/team-a/pods?watch=true"
                                      "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                                      "&allowWatchBookmarks=true&timeoutSeconds=0", preload_content=False)
    lines = [json.loads(line) for line in response.read().splitlines()]
    assert [e["type"] for e in lines] == ["ADDED", "BOOKMARK"]
    bookmark = lines[1]["object"]["metadata"]
    assert bookmark["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["resourceVersion"]) >= int(lines[0]["object"]["metadata"]["resourceVersion"])


def test_a_watch_of_custom_resources_through_the_custom_objects_api(kube):
    start = kube.custom.list_namespaced_custom_object("kubeflow.org", "v1", "team-a", "notebooks")[
        "metadata"]["resourceVersion"]
    kube.custom.create_namespaced_custom_object("kubeflow.org", "v1", "team-a", "notebooks", {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": "nb"},
        "spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "jupyter"}]}}}})
    w = watch.Watch()
    for event in w.stream(kube.custom.list_namespaced_custom_object, "kubeflow.org", "v1", "team-a",
                          "notebooks", resource_version=start, timeout_seconds=STREAM_TIMEOUT):
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "nb")
        w.stop()
