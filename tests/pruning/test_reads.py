"""A prune pass reads in proportion to what looks idle: GETs of the few idle pods and their
owners, a namespace LIST where idle pods gather, cluster-wide LISTs when most are idle.
Counted through the real gateway against the simulated cluster and a real Prometheus."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from clusters import kube
from clusters.kube import KubeGateway
from pruning import reads
from pruning.services import PruneParams, prune_run_execute

from pruning_world import World, deployment
from tests.expiring_pages import compacting_between_pages

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]


class ScopedCounts(KubeGateway):
    """The real gateway, also noting each read's scope (the call counters name no namespace)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: list[tuple[str, str, str | None]] = []

        self.on_read = lambda verb, resource: None

    def get(self, resource, name, *, namespace=None, subresource=None):
        self.reads.append(("get", resource.name, namespace))
        self.on_read("get", resource.name)
        return super().get(resource, name, namespace=namespace, subresource=subresource)

    def list_page(self, resource, *, namespace=None, **kwargs):
        self.reads.append(("list", resource.name, namespace))
        self.on_read("list", resource.name)
        return super().list_page(resource, namespace=namespace, **kwargs)


@pytest.mark.parametrize("k,per_ns,seen,expected", [
    # 2 idle pods among 1,000 spread over busy namespaces: two GETs.
    ({"a": 2}, {"a": 400}, 1000, ("get", 2)),
    # 10 of a 20-pod namespace idle: listing it (1 + 20/15 GETs' worth) beats 10 GETs.
    ({"a": 10, "b": 1}, {"a": 20, "b": 500}, 1000, ("namespaces", {"a"})),
    # Most of the cluster idle: one cluster-wide LIST.
    ({"a": 300, "b": 300}, {"a": 400, "b": 400}, 800, ("full", None)),
    # About 6.7 % of 10,000 pods is where the whole cluster is worth listing.
    ({f"ns{i}": 1 for i in range(660)}, {f"ns{i}": 200 for i in range(50)}, 10_000, ("get", 660)),
    ({f"ns{i}": 1 for i in range(680)}, {f"ns{i}": 200 for i in range(50)}, 10_000, ("full", None)),
    # 10 idle in each of two 200-pod namespaces: 20 GETs, not two 200-pod LISTs.
    ({"a": 10, "b": 10}, {"a": 200, "b": 200}, 10_000, ("get", 20)),
])
def test_the_cheapest_reads_are_chosen(k, per_ns, seen, expected):
    pods = [(ns, f"p{i}") for ns, n in k.items() for i in range(n)]
    plan = reads.reads_choose(pods=pods, pods_per_namespace=per_ns, pods_seen=seen)
    how, what = expected
    if how == "full":
        assert plan.full
    elif how == "get":
        assert not plan.full and plan.list_namespaces == frozenset() and len(plan.get_pods) == what
    else:
        assert not plan.full and plan.list_namespaces == what
        assert {ns for ns, _ in plan.get_pods} == set(k) - what


@pytest.fixture
def make_world(tmp_path, prometheus_factory, monkeypatch):
    # A 42-pod cluster is read here as the measured model reads a ~210-pod one (a GET
    # costs what listing 3 pods does instead of 15), so that GETs, namespace LISTs and
    # cluster-wide LISTs each have their turn at a size a test can afford.
    monkeypatch.setattr(reads, "PODS_PER_GET", 3)
    worlds = []

    def make(*, team_a_busy: bool) -> World:
        cm = World.start(tmp_path / f"w{len(worlds)}", nodes=6)
        w = cm.__enter__()
        worlds.append(cm)
        w.prometheus_factory = prometheus_factory
        for i in range(3):   # 30 pods in team-a, busy or idle
            w.create(deployment(f"serve-{i}", "team-a", replicas=10, util="70" if team_a_busy else "0"))
        for name in ("solo-1", "solo-2"):   # two idle pods among them
            w.create(deployment(name, "team-a", util="0"))
        w.create(deployment("batch", "team-c", replicas=10, util="0"))   # a namespace all idle
        w.record_history(minutes=40)
        w.gateway.close()
        w.gateway = ScopedCounts.from_kubeconfig(w.kubeconfig)
        return w

    yield make
    for cm in worlds:
        cm.__exit__(None, None, None)


def test_few_idle_pods_are_read_one_by_one_and_a_gathered_namespace_is_listed(make_world):
    world = make_world(team_a_busy=True)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(max_scale_downs=50))
    assert (run.pods_seen, run.busy_pods, run.idle_candidates, run.planned) == (42, 30, 12, 3)
    # No cluster-wide read at all.
    assert all(ns is not None for _, _, ns in world.gateway.reads), world.gateway.reads
    # team-a: its two idle pods and their owners one by one, and each owner's pods by its
    # selector (one LIST each); team-c: listed, once per kind (its pods tell the owner's).
    team_a = sorted((verb, res) for verb, res, ns in world.gateway.reads if ns == "team-a")
    assert team_a == ([("get", "deployments.apps")] * 2 + [("get", "pods")] * 2 + [("get", "replicasets.apps")] * 2
                      + [("list", "pods")] * 2)
    team_c = sorted((verb, res) for verb, res, ns in world.gateway.reads if ns == "team-c")
    assert team_c == [("list", "deployments.apps"), ("list", "pods"), ("list", "replicasets.apps")]
    assert run.kube_api_calls == 11


def test_many_idle_pods_are_read_with_cluster_wide_lists(make_world):
    world = make_world(team_a_busy=False)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(max_scale_downs=50))
    assert (run.pods_seen, run.busy_pods, run.idle_candidates, run.planned) == (42, 0, 42, 6)
    assert sorted(world.gateway.reads) == [("list", "deployments.apps", None), ("list", "pods", None),
                                           ("list", "replicasets.apps", None)]
    assert run.kube_api_calls == 3


def test_no_idle_pod_reads_nothing_from_the_cluster(make_world):
    world = make_world(team_a_busy=True)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(namespace="team-b"))
    assert run.pods_seen == 0 and run.kube_api_calls == 0 and world.gateway.reads == []


def test_a_series_named_as_no_pod_can_be_is_planned_not_found_and_never_read(make_world):
    """An exporter's label the cluster could never hold as a pod's or namespace's name (a
    relabelling gone wrong, a hostile exporter) is not sent to the API, where "?" or "/" would
    address another object, and does not fail the pass: the pod is not in the cluster."""
    from tests.prometheus_fixtures import Series

    world = make_world(team_a_busy=True)
    solo = [s for s in world.history.values() if s.samples and s.labels.get("pod", "").startswith("solo-1")]
    hostile = [("team-a", "solo-1?x=1"), ("team-a", "solo-1/status"), ("Team-A", "solo-9"), ("team-a", "..")]

    def with_hostile(series):
        return series + [Series(s.metric, {**s.labels, "namespace": ns, "pod": pod}, list(s.samples))
                         for ns, pod in hostile for s in solo]

    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=with_hostile),
                            now=world.now(), params=PruneParams(max_scale_downs=50))
    assert run.status == "succeeded", run.errors
    assert run.skip_counts.get("pod-not-found") == len(hostile), run.skip_counts
    # As without them: solo-1, solo-2 and team-c's batch planned, with the same 11 reads.
    assert run.planned == 3
    assert "Team-A" not in {ns for _, _, ns in world.gateway.reads} and run.kube_api_calls == 11, world.gateway.reads


def test_cluster_wide_lists_are_read_page_by_page_with_the_same_decisions(make_world, monkeypatch):
    world = make_world(team_a_busy=False)
    whole = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                              params=PruneParams(max_scale_downs=50))
    monkeypatch.setattr(reads, "LIST_PAGE_SIZE", 5)
    world.gateway.reads.clear()
    paged = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                              params=PruneParams(max_scale_downs=50))
    decisions = [sorted((d.namespace, d.pod, d.owner_kind, d.owner_name, d.decision, d.reason)
                        for d in run.decisions.all()) for run in (whole, paged)]
    assert decisions[0] == decisions[1] and paged.planned == whole.planned == 6
    assert [r for r in world.gateway.reads if r[1] == "pods"] == [("list", "pods", None)] * 9   # 42 pods by 5
    assert paged.kube_api_calls > whole.kube_api_calls == 3


def test_pods_read_by_get_share_one_get_of_each_owner(make_world):
    world = make_world(team_a_busy=True)
    batch = frozenset(("team-c", p["metadata"]["name"]) for p in world.gateway.list(kube.PODS, namespace="team-c"))
    world.gateway.reads.clear()
    plan = reads.ReadPlan(list_namespaces=frozenset(), get_pods=batch, estimated_cost_gets=len(batch))
    view = reads.cluster_view_read(world.gateway, pods=batch, plan=plan)
    assert set(view.pods) == batch and len(batch) == 10
    # Ten pods of one Deployment: ten pod GETs, then its ReplicaSet and Deployment once each,
    # and one LIST of the Deployment's pods.
    assert sorted(world.gateway.reads) == ([("get", "deployments.apps", "team-c")] + [("get", "pods", "team-c")] * 10
                                           + [("get", "replicasets.apps", "team-c"), ("list", "pods", "team-c")])
    assert {kind for kind, _, _ in view.objects} == {"ReplicaSet", "Deployment"}
    assert view.owner_pods == {("Deployment", "team-c", "batch"): batch}


class FollowupTimed:
    """The product's Prometheus gateway, with the follow-up query (the one a pass starts
    with `query_started`) answering either before the candidate pods are read or only once
    the owners' pods have been listed (a Prometheus slower than the Kubernetes reads)."""

    def __init__(self, inner, gateway: ScopedCounts, *, late: bool):
        self.inner, self.late = inner, late
        self.walked, self.future = threading.Event(), None
        self._pool = ThreadPoolExecutor(1)
        gateway.on_read = self._on_read

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def query_started(self, promql, *, at=None):
        def answer():
            if self.late:
                assert self.walked.wait(10), "the owners were never walked while the follow-up was out"
            return self.inner.query(promql, at=at)
        self.future = self._pool.submit(answer)
        return self.future

    def _on_read(self, verb, resource):
        if verb == "get" and resource == "pods" and not self.late:
            self.future.result(timeout=10)   # the follow-up has answered before any pod is read
        if verb == "list" and resource == "pods":
            self.walked.set()


@pytest.mark.parametrize("late", [False, True], ids=["follow-up first", "follow-up late"])
def test_a_pod_with_a_busy_gpu_is_read_with_the_candidates_but_never_planned(tmp_path, prometheus_factory, late):
    from tests.prometheus_fixtures import Series

    with World.start(tmp_path) as world:
        world.prometheus_factory = prometheus_factory
        world.create(deployment("mixed", "team-a", gpus=2, util="0"))   # one of its two GPUs made busy below
        world.create(deployment("idle", "team-a", util="0"))
        world.create(deployment("busy", "team-a", replicas=20, util="70"))   # team-a too big to list for two pods
        world.record_history(minutes=40)
        world.gateway.close()
        world.gateway = ScopedCounts.from_kubeconfig(world.kubeconfig)

        def one_gpu_busy(series):
            mixed = [s for s in series if s.labels.get("pod", "").startswith("mixed-")]
            busy_gpu = max(s.labels["gpu"] for s in mixed)
            return [Series(s.metric, s.labels, [(t, 50.0) for t, _ in s.samples])
                    if s in mixed and s.labels["gpu"] == busy_gpu else s for s in series]

        prometheus = FollowupTimed(world.prometheus(transform=one_gpu_busy), world.gateway, late=late)
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=prometheus, now=world.now(),
                                params=PruneParams(max_scale_downs=50))
        assert (run.pods_seen, run.busy_pods, run.idle_candidates, run.planned) == (22, 21, 1, 1)
        assert [(d.owner_name, d.decision) for d in run.decisions.all()] == [("idle", "prune")]
        # "mixed" came back with the candidates (a GPU under the threshold): its pod is read
        # while the follow-up says it is busy. Its owners are walked too only when the
        # follow-up is still out once the pods are read (the walk then costs no time of its
        # own); either way it is never planned, and the reads stay those of the candidates.
        owners = [("get", "deployments.apps", "team-a"), ("get", "replicasets.apps", "team-a"),
                  ("list", "pods", "team-a")]
        expected = sorted([("get", "pods", "team-a")] * 2 + owners * (2 if late else 1))
        assert sorted(world.gateway.reads) == expected
        assert run.kube_api_calls == len(expected)


def test_cluster_wide_pages_whose_continue_expires_are_read_again_in_one_list(make_world, monkeypatch):
    world = make_world(team_a_busy=False)
    whole = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                              params=PruneParams(max_scale_downs=50))
    monkeypatch.setattr(reads, "LIST_PAGE_SIZE", 5)
    pod = world.gateway.list(kube.PODS, namespace="team-c")[0]["metadata"]["name"]
    compacting_between_pages(world.gateway, world.server.sim, monkeypatch, pod=pod, namespace="team-c")
    world.gateway.reads.clear()
    world.gateway.errors.clear()
    expired = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                                params=PruneParams(max_scale_downs=50))
    decisions = [sorted((d.namespace, d.pod, d.owner_kind, d.owner_name, d.decision, d.reason)
                        for d in run.decisions.all()) for run in (whole, expired)]
    # Every idle pod decided once, as when nothing expired: none twice, none lost.
    assert expired.status == whole.status and decisions[0] == decisions[1] and expired.planned == 6
    # The first page, its expired continue (410 Expired), then one LIST of every pod.
    assert [r for r in world.gateway.reads if r[1] == "pods"] == [("list", "pods", None)] * 3
    assert world.gateway.errors[("list", "pods")] == 1


@pytest.mark.parametrize("resources,phase,deleting,counts", [
    ({"limits": {"nvidia.com/gpu": "1"}}, "Running", False, True),
    ({"requests": {"nvidia.com/mig-1g.5gb": "1"}}, "Pending", False, True),   # a MIG slice, still waiting
    ({"limits": {"nvidia.com/gpu": "0"}, "requests": {"cpu": "2"}}, "Running", False, False),
    ({"limits": {"nvidia.com/gpu": "1"}}, "Succeeded", False, False),
    ({"limits": {"nvidia.com/gpu": "1"}}, "Running", True, False),
])
def test_which_listed_pods_count_for_their_owner(resources, phase, deleting, counts):
    import orjson

    from clusters.snapshot import POD_LIST

    meta = {"name": "p", "namespace": "a", **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    page = POD_LIST.decode(orjson.dumps({"items": [{"metadata": meta, "status": {"phase": phase},
                                                    "spec": {"containers": [{"name": "c", "resources": resources}]}}]}))
    assert reads._counts_for_owner(page.items[0]) is counts
