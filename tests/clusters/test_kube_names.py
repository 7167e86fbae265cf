"""Names and namespaces the gateway puts into request paths: one no Kubernetes object can
have is refused before any request, so it can never address another object, a
subresource or a query (`n1?x=1` once read node n1)."""
from __future__ import annotations

import logging
import re

import pytest

from clusters import kube
from clusters.errors import Invalid

pytestmark = pytest.mark.django_db

SCENARIO = """
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {pool: a}}
status:
  capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
  allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
---
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: team}
spec: {containers: [{name: main, image: busybox}]}
"""

# Each would have reached another object or query before (read by experiment on this server):
# "n1?x=1" and "n1#x" read n1, "n1/status" its status subresource, ".." went up a level.
HOSTILE_NAMES = ["n1?x=1", "n1/status", "../x", "..", "n1#x", "n1%2Fstatus", "", "N1", "n1 ", "-n1", "a" * 254]
HOSTILE_NAMESPACES = ["team?x=1", "team/pods/p1/..", "..", "Team", "a" * 64, "team.example"]


def requests_seen(caplog) -> list[str]:
    """The simulated cluster's access log: one line per request, written before its answer."""
    return [r.getMessage() for r in caplog.records if r.name == "simcluster.http"]


@pytest.fixture
def gw(sim_cluster_factory, caplog):
    caplog.set_level(logging.DEBUG, logger="simcluster.http")
    return sim_cluster_factory(SCENARIO).gateway


def calls_by_name(name: str):
    """Every gateway method that puts a name into its path, called with `name`."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    return {
        "get": lambda gw: gw.get(kube.NODES, name),
        "get status": lambda gw: gw.get(kube.NODES, name, subresource="status"),
        "get in namespace": lambda gw: gw.get(kube.PODS, name, namespace="team"),
        "patch": lambda gw: gw.patch(kube.NODES, name, {"metadata": {"labels": {"pool": "b"}}}),
        "replace": lambda gw: gw.replace(kube.NODES, node),
        "delete": lambda gw: gw.delete(kube.PODS, name, namespace="team"),
        "get_scale": lambda gw: gw.get_scale(kube.DEPLOYMENTS, name, namespace="team"),
        "set_scale": lambda gw: gw.set_scale(kube.DEPLOYMENTS, name, 0, namespace="team"),
        "evict": lambda gw: gw.evict(name, namespace="team"),
        "create_event": lambda gw: gw.create_event(node, reason="Test", message="m"),
        "namespace by name": lambda gw: gw.get(kube.NAMESPACES, name),
    }


def calls_by_namespace(namespace: str):
    """Every gateway method that puts a namespace into its path, called with `namespace`."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2", "namespace": namespace},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    involved = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": namespace}}
    return {
        "get": lambda gw: gw.get(kube.PODS, "p1", namespace=namespace),
        "list": lambda gw: gw.list(kube.PODS, namespace=namespace),
        "list_page": lambda gw: gw.list_page(kube.PODS, namespace=namespace),
        "watch": lambda gw: next(gw.watch(kube.PODS, namespace=namespace, timeout_seconds=1)),
        "create": lambda gw: gw.create(kube.PODS, pod),
        "patch": lambda gw: gw.patch(kube.PODS, "p1", {"metadata": {"labels": {"x": "1"}}}, namespace=namespace),
        "delete": lambda gw: gw.delete(kube.PODS, "p1", namespace=namespace),
        "evict": lambda gw: gw.evict("p1", namespace=namespace),
        "create_event": lambda gw: gw.create_event(involved, reason="Test", message="m"),
    }


def assert_refused_unsent(gw, caplog, call, bad: str, what: str, rule: str) -> None:
    before = gw.calls_total()
    caplog.clear()
    with pytest.raises(Invalid, match=re.escape(repr(bad))) as refused:
        call(gw)
    assert refused.value.code == 400 and not refused.value.transient
    assert re.search(f"{what} {re.escape(repr(bad))} is not a valid Kubernetes name: it must be a {rule}",
                     str(refused.value)), str(refused.value)
    assert gw.calls_total() == before
    # Anything sent before would be logged before this answer (same connection, in order).
    gw.get(kube.NAMESPACES, "team")
    assert requests_seen(caplog) == ['"GET /api/v1/namespaces/team HTTP/1.1" 200 -']


@pytest.mark.parametrize("method", list(calls_by_name("x")))
def test_a_name_no_object_can_have_is_refused_naming_it_and_the_rule_before_any_request(gw, caplog, method):
    rule = "DNS-1123 label" if method == "namespace by name" else "DNS-1123 subdomain"
    what = {"create_event": "involved Node name", "evict": "Pod name", "delete": "Pod name",
            "get in namespace": "Pod name", "get_scale": "Deployment name", "set_scale": "Deployment name",
            "namespace by name": "Namespace name"}.get(method, "Node name")
    for bad in HOSTILE_NAMES:
        if bad == "" and method in ("replace", "create_event"):
            continue  # an object without a name has its own refusal (tests/clusters/test_kube.py)
        assert_refused_unsent(gw, caplog, calls_by_name(bad)[method], bad, what, rule)
    # Nothing changed: node n1 and pod p1 are as they were.
    assert gw.get(kube.NODES, "n1")["metadata"]["labels"] == {"pool": "a"}
    assert gw.get(kube.PODS, "p1", namespace="team")["metadata"].get("deletionTimestamp") is None


@pytest.mark.parametrize("method", list(calls_by_namespace("x")))
def test_a_namespace_no_namespace_can_have_is_refused_before_any_request(gw, caplog, method):
    for bad in HOSTILE_NAMESPACES:
        assert_refused_unsent(gw, caplog, calls_by_namespace(bad)[method], bad, "namespace", "DNS-1123 label")
    assert [p["metadata"]["name"] for p in gw.list(kube.PODS, namespace="team")] == ["p1"]


def test_dotted_names_still_work_and_go_out_as_they_are(gw, caplog):
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1.pool-a.example"}}
    gw.create(kube.NODES, node)
    caplog.clear()
    patched = gw.patch(kube.NODES, "gpu-1.pool-a.example", {"metadata": {"labels": {"pool": "a"}}})
    assert patched["metadata"]["labels"] == {"pool": "a"}
    assert gw.get(kube.NODES, "gpu-1.pool-a.example", subresource="status")["metadata"]["name"] == \
        "gpu-1.pool-a.example"
    gw.delete(kube.NODES, "gpu-1.pool-a.example")
    assert requests_seen(caplog) == [
        '"PATCH /api/v1/nodes/gpu-1.pool-a.example HTTP/1.1" 200 -',
        '"GET /api/v1/nodes/gpu-1.pool-a.example/status HTTP/1.1" 200 -',
        '"DELETE /api/v1/nodes/gpu-1.pool-a.example HTTP/1.1" 200 -',
    ]
    assert [n["metadata"]["name"] for n in gw.list(kube.NODES)] == ["n1"]
