"""Paged LISTs (`limit` + `continue`) as kube-apiserver serves them from etcd: pages
concatenate to the unpaged list, every page shows the objects as they stood when the
first page was read (writes between pages do not show), and a token whose version the
history has been compacted past answers 410 Expired with a token for an inconsistent
remainder. Through the official client and kubectl."""
from __future__ import annotations

import json

import kubernetes
import pytest
import yaml

from simcluster.generate import generate

GENERATED = generate(nodes=4, pods=60, seed=3)
# Upstream's message (k8s.io/apiserver/pkg/storage/etcd3/errors.go, inconsistentContinue).
INCONSISTENT = ("The provided continue parameter is too old to display a consistent list result. You can "
                "start a new list without the continue parameter, or use the continue token in this response "
                "to retrieve the remainder of the results. Continuing with the provided token results in an "
                "inconsistent list - objects that were created, modified, or deleted between the time the first "
                "chunk was returned and now may show up in the list.")


def _scenario(compaction_seconds: float = 0.0) -> str:
    settings = {"apiVersion": "simcluster.io/v1alpha1", "kind": "Simulation", "metadata": {"name": "paging"},
                "spec": {"etcd_compaction_interval_seconds": compaction_seconds}}
    return yaml.safe_dump_all([settings, *GENERATED[1:]])


@pytest.fixture
def cluster(kube_factory):
    return kube_factory(_scenario())


def _names(pods) -> list[tuple[str, str]]:
    return [(p.metadata.namespace, p.metadata.name) for p in pods]


def _all_pages(list_fn, limit: int, **kwargs) -> tuple[list, list]:
    """Every page of a paged list: (items, pages)."""
    items, pages, token = [], [], None
    while True:
        page = list_fn(limit=limit, _continue=token, **kwargs) if token else list_fn(limit=limit, **kwargs)
        pages.append(page)
        items += page.items
        token = page.metadata._continue
        if not token:
            return items, pages


def test_pages_concatenate_to_the_unpaged_list(cluster):
    whole = cluster.core.list_pod_for_all_namespaces().items
    assert len(whole) == 60
    items, pages = _all_pages(cluster.core.list_pod_for_all_namespaces, 7)
    assert _names(items) == _names(whole)
    assert [len(p.items) for p in pages] == [7] * 8 + [4]
    # Without selectors each page says how many are left, as upstream does.
    assert [p.metadata.remaining_item_count for p in pages[:-1]] == [60 - 7 * (i + 1) for i in range(8)]
    assert pages[-1].metadata.remaining_item_count is None
    assert {p.metadata.resource_version for p in pages} == {pages[0].metadata.resource_version}


def test_namespaced_and_selected_pages_concatenate_to_their_unpaged_lists(cluster):
    namespace = GENERATED[-1]["metadata"]["namespace"]
    whole = cluster.core.list_namespaced_pod(namespace).items
    assert len(whole) >= 3
    items, _ = _all_pages(cluster.core.list_namespaced_pod, 2, namespace=namespace)
    assert _names(items) == _names(whole)
    selector = "capacity.io/component=model"
    selected = cluster.core.list_pod_for_all_namespaces(label_selector=selector).items
    assert 0 < len(selected) < 60
    items, pages = _all_pages(cluster.core.list_pod_for_all_namespaces, 5, label_selector=selector)
    assert _names(items) == _names(selected)
    # A selector hides the count of what is left (upstream counts keys, not matches).
    assert all(p.metadata.remaining_item_count is None for p in pages)


def test_pages_after_writes_show_the_list_as_it_stood_at_the_first_page(cluster):
    first = cluster.core.list_pod_for_all_namespaces(limit=10)
    before = {(p.metadata.namespace, p.metadata.name): p for p in cluster.core.list_pod_for_all_namespaces().items}
    later = sorted(before)[30:]
    deleted, relabelled = later[0], later[5]
    cluster.core.delete_namespaced_pod(deleted[1], deleted[0], grace_period_seconds=0)
    cluster.core.patch_namespaced_pod(relabelled[1], relabelled[0], {"metadata": {"labels": {"tier": "changed"}}})
    created_ns = later[-1][0]
    cluster.core.create_namespaced_pod(created_ns, {"metadata": {"name": "zz-created-between-pages"},
                                                    "spec": {"containers": [{"name": "c", "image": "x"}]}})
    cluster.control.advance(0)   # controllers react (the ReplicaSet replaces the deleted pod)
    now = {(p.metadata.namespace, p.metadata.name) for p in cluster.core.list_pod_for_all_namespaces().items}
    assert deleted not in now and (created_ns, "zz-created-between-pages") in now

    items, token = list(first.items), first.metadata._continue
    while token:
        page = cluster.core.list_pod_for_all_namespaces(limit=10, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        items += page.items
        token = page.metadata._continue
    assert _names(items) == sorted(before)
    by_key = {(p.metadata.namespace, p.metadata.name): p for p in items}
    assert "tier" not in (by_key[relabelled].metadata.labels or {})
    assert by_key[deleted].metadata.uid == before[deleted].metadata.uid


def test_a_token_older_than_the_compacted_history_answers_410_expired(kube_factory):
    cluster = kube_factory(_scenario(compaction_seconds=300))
    first = cluster.core.list_pod_for_all_namespaces(limit=25)
    pod = first.items[0]
    cluster.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                      {"metadata": {"labels": {"tier": "after-first-page"}}})
    # The second page still reads at the first page's version within one interval...
    second = cluster.core.list_pod_for_all_namespaces(limit=25, _continue=first.metadata._continue)
    assert second.metadata.resource_version == first.metadata.resource_version
    # ...but two compactions later (5 minutes each, as kube-apiserver) it is gone.
    cluster.control.advance(601)
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.core.list_pod_for_all_namespaces(limit=25, _continue=second.metadata._continue)
    assert raised.value.status == 410
    status = json.loads(raised.value.body)
    assert (status["kind"], status["status"], status["reason"], status["code"]) == ("Status", "Failure",
                                                                                    "Expired", 410)
    assert status["message"] == INCONSISTENT
    # The token in the answer continues at the latest version: the rest of the pods, as they are now.
    rest = cluster.core.list_pod_for_all_namespaces(_continue=status["metadata"]["continue"])
    assert _names(first.items + second.items + rest.items) == \
        _names(cluster.core.list_pod_for_all_namespaces().items)
    assert rest.metadata.resource_version != first.metadata.resource_version


def test_a_token_the_server_did_not_issue_is_a_400(cluster):
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.core.list_pod_for_all_namespaces(limit=5, _continue="bm90LWEtdG9rZW4")
    assert raised.value.status == 400
    assert "continue key is not valid" in json.loads(raised.value.body)["message"]


def test_kubectl_pages_get_pods_and_prints_every_pod_once(cluster):
    result = cluster.kubectl("get", "pods", "-A", "--chunk-size=8", "-v=6")
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    expected = _names(cluster.core.list_pod_for_all_namespaces().items)
    assert [(row[0], row[1]) for row in rows] == expected
    # kubectl asked page by page: 60 pods in chunks of 8 is 8 requests, 7 with a token.
    list_calls = [line for line in result.stderr.splitlines() if "GET" in line and "/api/v1/pods?" in line
                  and "200 OK" in line]
    assert len(list_calls) == 8
    assert sum("continue=" in line for line in list_calls) == 7
    listed = json.loads(cluster.kubectl("get", "pods", "-A", "--chunk-size=8", "-o", "json").stdout)
    assert _names_of_dicts(listed["items"]) == expected


def _names_of_dicts(items: list[dict]) -> list[tuple[str, str]]:
    return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]


def _pages_of(cluster, limit: int, **kwargs) -> list[tuple[list, int | None, bool]]:
    """Each page's (names, remainingItemCount, has a continue token)."""
    list_fn = cluster.core.list_namespaced_pod if "namespace" in kwargs else cluster.core.list_pod_for_all_namespaces
    _, pages = _all_pages(list_fn, limit, **kwargs)
    return [(_names(p.items), p.metadata.remaining_item_count, bool(p.metadata._continue)) for p in pages]


def test_pages_read_right_after_a_write_and_after_a_whole_list_are_the_same(cluster):
    """The server answers a page from its own key-ordered list of the type once a whole
    LIST has made one, and by key lookups while none is kept (a write drops it): a client
    must not be able to tell which."""
    namespace = GENERATED[-1]["metadata"]["namespace"]
    cases = [dict(limit=7), dict(limit=60), dict(limit=100), dict(limit=2, namespace=namespace),
             dict(limit=5, label_selector="capacity.io/component=model"),
             dict(limit=4, field_selector="status.phase=Running"),
             dict(limit=3, namespace=namespace, label_selector="capacity.io/component=model")]
    pod = cluster.core.list_pod_for_all_namespaces(limit=1).items[0]
    cluster.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                      {"metadata": {"labels": {"tier": "written"}}})
    after_write = [_pages_of(cluster, **case) for case in cases]
    whole = _names(cluster.core.list_pod_for_all_namespaces().items)
    after_whole_list = [_pages_of(cluster, **case) for case in cases]
    assert after_whole_list == after_write
    assert [name for page in after_write[0] for name in page[0]] == whole
    assert [page[1] for page in after_write[0]] == [60 - 7 * (i + 1) for i in range(8)] + [None]
    assert after_write[1] == [(whole, None, False)]   # a limit the list fills exactly: no token
    assert all(page[1] is None for case in after_write[4:] for page in case)   # selectors: no count
    selected = _names(cluster.core.list_pod_for_all_namespaces(label_selector="capacity.io/component=model").items)
    assert [name for page in after_whole_list[4] for name in page[0]] == selected
