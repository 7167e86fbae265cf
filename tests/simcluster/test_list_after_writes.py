"""A LIST serves each object as it stands now, though the server keeps each stored
version's JSON from earlier LISTs: a write, a status write or a delete made after one LIST
shows in the next, in whole, selected and paged LISTs. Through the official client."""
from __future__ import annotations

from collections import Counter

import yaml

from simcluster.generate import generate

GENERATED = generate(nodes=3, pods=30, seed=5)


def _by_key(pods) -> dict:
    return {(p.metadata.namespace, p.metadata.name): p for p in pods}


def test_a_list_shows_every_write_made_after_an_earlier_list(kube_factory):
    cluster = kube_factory(yaml.safe_dump_all(GENERATED[1:]))
    core = cluster.core
    before = _by_key(core.list_pod_for_all_namespaces().items)
    core.list_pod_for_all_namespaces(label_selector="capacity.io/component")   # read twice: kept JSON is reused
    relabelled, annotated, deleted = sorted(before)[3], sorted(before)[7], sorted(before)[11]

    core.patch_namespaced_pod(relabelled[1], relabelled[0], {"metadata": {"labels": {"tier": "changed"}}})
    core.patch_namespaced_pod_status(annotated[1], annotated[0], {"status": {"message": "status written"}})
    core.delete_namespaced_pod(deleted[1], deleted[0], grace_period_seconds=0)

    after = core.list_pod_for_all_namespaces()
    pods = _by_key(after.items)
    assert pods[relabelled].metadata.labels["tier"] == "changed"
    assert pods[annotated].status.message == "status written"
    assert deleted not in pods
    for key in (relabelled, annotated):
        assert pods[key].metadata.resource_version == \
            core.read_namespaced_pod(key[1], key[0]).metadata.resource_version != before[key].metadata.resource_version
    # Objects nobody wrote are served as they were.
    untouched = sorted(before)[20]
    assert pods[untouched].metadata.resource_version == before[untouched].metadata.resource_version

    selected = core.list_pod_for_all_namespaces(label_selector="tier=changed").items
    assert [(p.metadata.namespace, p.metadata.name) for p in selected] == [relabelled]

    paged, token = [], None
    while True:
        page = core.list_pod_for_all_namespaces(limit=7, _continue=token) if token else \
            core.list_pod_for_all_namespaces(limit=7)
        paged += page.items
        token = page.metadata._continue
        if not token:
            break
    assert [(p.metadata.namespace, p.metadata.name, p.metadata.resource_version) for p in paged] == \
        [(p.metadata.namespace, p.metadata.name, p.metadata.resource_version) for p in after.items]


def test_pods_not_on_a_node_are_every_other_pod_as_they_stand_after_writes(kube_factory):
    cluster = kube_factory(yaml.safe_dump_all(GENERATED[1:]))
    core = cluster.core
    pods = core.list_pod_for_all_namespaces().items
    node = Counter(p.spec.node_name for p in pods).most_common(1)[0][0]   # a node with several pods
    core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName!={node}")   # an earlier reading
    relabelled = next(p for p in pods if p.spec.node_name != node)
    core.patch_namespaced_pod(relabelled.metadata.name, relabelled.metadata.namespace,
                              {"metadata": {"labels": {"tier": "changed"}}})
    deleted = next(p for p in pods if p.spec.node_name == node)
    core.delete_namespaced_pod(deleted.metadata.name, deleted.metadata.namespace, grace_period_seconds=0)

    now = core.list_pod_for_all_namespaces().items
    expected = [(p.metadata.namespace, p.metadata.name) for p in now if p.spec.node_name != node]
    selected = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName!={node}").items
    assert [(p.metadata.namespace, p.metadata.name) for p in selected] == expected
    assert 0 < len(selected) < len(now) - 1   # pods remain on the node
    assert next(p for p in selected if p.metadata.name == relabelled.metadata.name).metadata.labels["tier"] == "changed"
    both = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName!={node}", label_selector="tier=changed")
    assert [p.metadata.name for p in both.items] == [relabelled.metadata.name]
