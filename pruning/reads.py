"""What a prune pass reads, in proportion to what looks idle.

Prometheus first (`pass_read`: the candidates query and the census side by side, then the
follow-up about just the candidate pods, while those pods are read), then Kubernetes
(`cluster_view_read`): the owners the walk of the pods left idle reaches, and every GPU pod
of those owners (an owner is idle only when all its GPU pods are: one idle replica of a
busy Deployment is no reason to stop it). Pods and owners are each read the cheapest of
three ways (`reads_choose`, a pure cost model):

- one GET per pod (and per owner) when few pods look idle, and one LIST of each owner's
  pods by its selector;
- one LIST of a namespace (pods, then each owner kind needed there) when enough of its
  pods look idle that listing it costs less than getting them one by one: the owners'
  other GPU pods come from that same LIST;
- one cluster-wide LIST per kind, as before, when so many look idle that this is cheapest.

Every read goes through the gateway (`clusters.kube`), so each counts in its call counters.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import wait
from dataclasses import dataclass
from datetime import datetime, timezone

from clusters import kube
from clusters.errors import Invalid, NotFound, PrometheusError
from clusters.labels import ISVC_LABEL, KNATIVE_SERVICE_LABEL
from clusters.snapshot import POD_LIST, PodView, asks_nvidia_device, gc_paused
from config.threads import SharedThreads

from .planning import (
    ClusterView, ObjectView, PruneSettings, counts_for_owner, owner_selector, pod_counts_for_owner, pods_to_look_up,
    resolve_owner, selector_matches, selector_text,
)
from .query import GPU_UTIL, GR_ENGINE, IdleAnswer, IdleQuery, parse_candidates, parse_census, parse_followup
from .selectors import kserve_stop_supported, object_view

# The cost model, in units of one GET of one object. Measured on the simulated cluster at
# 10,000 pods: a pod GET took 0.7–1.4 ms, an unpaged LIST of all 10,000 pods 0.29–0.47 s
# (29–47 µs a pod) and a LIST of one namespace's 200 pods 10–12 ms: one GET costs what
# listing 15 to 48 pods does. The model takes the low end, 15: a LIST also costs the API
# server and the network per object (a namespace LIST of 200 pods read 180 kB where ten
# GETs read 15 kB), which a simulated server on loopback underprices. So a namespace of
# 200 pods is listed once 15 or more of them look idle, and the whole 10,000-pod cluster
# once about 670 pods (6.7 %) do. bench/prune_pass.py: both sides stay within 2× of their
# floor at 10,000 and 50,000 pods.
LIST_COST_GETS = 1.0
PODS_PER_GET = 15
# Objects per page of a cluster-wide LIST (the pods are dropped page by page but for the
# candidates). Measured with 2,000 of 10,000 pods idle: the pass's peak RSS 176 MiB
# unpaged, 136 MiB by 1,000 (139 by 500, 138 by 2,500), its time the same within noise,
# 12 API calls instead of 3 (the snapshot's page size, measured the same way).
LIST_PAGE_SIZE = 1000

ALL_NAMESPACES = None   # `ReadPlan.list_namespaces` when every kind is listed cluster-wide
# GETs in flight at once (gpu-pruner's pass also keeps ten). The gateway is thread-safe and
# its connection pool holds ten connections on a 2-core host (five per core).
GET_CONCURRENCY = 10


@dataclass(frozen=True)
class ReadPlan:
    """How the candidate pods are read: `list_namespaces` (None = the whole cluster) are
    listed, every other candidate pod is read with a GET."""
    list_namespaces: frozenset | None
    get_pods: frozenset
    estimated_cost_gets: float

    @property
    def full(self) -> bool:
        return self.list_namespaces is ALL_NAMESPACES

    def describe(self) -> str:
        if self.full:
            return "cluster-wide LISTs"
        return f"{len(self.get_pods)} pod GETs, {len(self.list_namespaces)} namespace LISTs"


def _list_cost(pods: int) -> float:
    return LIST_COST_GETS + pods / PODS_PER_GET


def reads_choose(*, pods: Iterable[tuple[str, str]], pods_per_namespace: dict, pods_seen: int) -> ReadPlan:
    """The cheapest way to read `pods`, by the cost model above. Pod counts are the GPU pods
    Prometheus saw: a namespace or cluster with many other pods costs more to list than
    estimated, so the choice leans towards listing by their share."""
    wanted = frozenset(pods)
    by_ns = Counter(ns for ns, _ in wanted)
    listed, got, targeted = set(), set(), 0.0
    for ns, k in by_ns.items():
        list_ns = _list_cost(max(pods_per_namespace.get(ns, 0), k))
        if list_ns < k:
            listed.add(ns)
            targeted += list_ns
        else:
            got.update(p for p in wanted if p[0] == ns)
            targeted += k
    full = _list_cost(max(pods_seen, len(wanted)))
    if wanted and full < targeted:
        return ReadPlan(ALL_NAMESPACES, frozenset(), full)
    return ReadPlan(frozenset(listed), frozenset(got), targeted)


@dataclass(frozen=True)
class Candidates:
    """The first two answers: the candidate pods (a GPU under the threshold) and the census."""
    pods: frozenset
    pods_seen: int
    pods_per_namespace: dict
    sent: tuple[str, ...]


class NoSamples(PrometheusError):
    """Prometheus holds no GPU utilization sample at the evaluation time: the data is
    missing, which is not a cluster without GPU pods. No plan is made from it."""


def candidates_read(prometheus, query: IdleQuery, *, at: datetime) -> Candidates:
    """The candidates and the census, sent at once (`query_many`). A census of no GPU pod is
    checked against every GPU series (`presence_promql`): when none has a sample either,
    `NoSamples` says so, rather than a run planning from an empty reading as if the
    cluster had no GPUs."""
    first, census = query.candidates_promql(), query.census_promql()
    candidates, counted = prometheus.query_many([first, census], at=at)
    seen, per_ns = parse_census(counted)
    if not seen:
        presence = query.presence_promql()
        if not sum(float(s.value) for s in prometheus.query(presence, at=at)):
            raise NoSamples(
                f"no data: Prometheus had no samples of GPU utilization ({GR_ENGINE} or {GPU_UTIL}) at "
                f"{at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, the end of the {query.window_seconds // 60}-"
                f"minute window (and Prometheus' lookback before it, 5 minutes by default): the GPU data is missing, so no plan was "
                f"made and nothing was scaled. Is the DCGM exporter scraped, and is the evaluation time (the demo "
                f"clock, or --at) not ahead of the data?")
    return Candidates(frozenset(parse_candidates(candidates, label_scheme=query.label_scheme)), seen, per_ns,
                      (first, census))


def idle_gpus_read(prometheus, query: IdleQuery, *, at: datetime) -> tuple[IdleAnswer, list[str]]:
    """The candidates, the census and every GPU of the candidates; returns the answer and
    the PromQL sent."""
    first = candidates_read(prometheus, query, at=at)
    if not first.pods:
        return IdleAnswer(series=(), pods_seen=first.pods_seen, pods_per_namespace=first.pods_per_namespace), \
            list(first.sent)
    second = query.followup_promql(sorted(first.pods))
    series = parse_followup(prometheus.query(second, at=at), pods=first.pods, label_scheme=query.label_scheme)
    return (IdleAnswer(series=series, pods_seen=first.pods_seen, pods_per_namespace=first.pods_per_namespace),
            [*first.sent, second])


@dataclass(frozen=True)
class PassReads:
    """All a pass reads: Prometheus' answer, the PromQL sent, the pods to look up (neither
    busy nor without power data), how the cluster was read and what was read."""
    answer: IdleAnswer
    sent: list[str]
    look_up: frozenset
    plan: ReadPlan | None
    view: ClusterView


def pass_read(prometheus, gateway: kube.KubeGateway, query: IdleQuery, settings: PruneSettings, *,
              at: datetime) -> PassReads:
    """The three queries and the cluster reads of a pass. The candidate pods are read (by
    the plan `reads_choose` makes for them) while Prometheus evaluates the follow-up about
    them; then the owners of those the follow-up leaves to look up (`pods_to_look_up`:
    a pod with a busy GPU, or drawing power, is read but never planned) — walked while the
    follow-up is still out, else once it has answered. At 20 of 10,000 pods idle the
    follow-up and the pod GETs each took about a tenth of the pass."""
    first = candidates_read(prometheus, query, at=at)
    if not first.pods:
        answer = IdleAnswer(series=(), pods_seen=first.pods_seen, pods_per_namespace=first.pods_per_namespace)
        return PassReads(answer, list(first.sent), frozenset(), None, ClusterView(pods={}, objects={}))
    second = query.followup_promql(sorted(first.pods))
    pending = prometheus.query_started(second, at=at)
    # A series labelled with what no pod or namespace can be called names nothing in the
    # cluster: never read (the gateway refuses such a name), planned as a pod not found.
    readable = frozenset(key for key in first.pods if _nameable(key))
    plan = reads_choose(pods=readable, pods_per_namespace=first.pods_per_namespace, pods_seen=first.pods_seen)
    others: dict = {}
    try:
        with gc_paused():   # as in cluster_view_read
            pods = _pods_read(gateway, readable, plan, others=others)
    except BaseException:
        wait([pending])   # the follow-up has ended too when the caller hears of the failure
        raise
    walked = None
    if not pending.done():
        # The follow-up is still out: walk the owners of every candidate read meanwhile (at
        # 20 of 10,000 pods idle the walk then costs no time of its own); the few it later
        # shows busy were walked for nothing, never acted on.
        try:
            walked = cluster_view_read(gateway, pods=readable, plan=plan, pods_read=pods, others=others)
        except BaseException:
            wait([pending])
            raise
    series = parse_followup(pending.result(), pods=first.pods, label_scheme=query.label_scheme)
    answer = IdleAnswer(series=series, pods_seen=first.pods_seen, pods_per_namespace=first.pods_per_namespace)
    look_up = frozenset(pods_to_look_up(list(series), settings))
    if walked is None:
        view = cluster_view_read(gateway, pods=look_up & readable, plan=plan, pods_read=pods, others=others)
    else:
        view = ClusterView(pods={k: v for k, v in walked.pods.items() if k in look_up}, objects=walked.objects,
                           kserve_stop_supported=walked.kserve_stop_supported, owner_pods=walked.owner_pods)
    return PassReads(answer, [*first.sent, second], look_up, plan, view)


def _nameable(key: tuple[str, str]) -> bool:
    namespace, pod = key
    try:
        kube.name_check(namespace, what="namespace", label=True)
        kube.name_check(pod, what="pod name")
    except Invalid:
        return False
    return True


# The reading threads, shared by the passes of the process (a pass at 20 idle pods spent a
# tenth of its time starting threads).
_readers = SharedThreads(GET_CONCURRENCY, "prune-read")


def _each(fn: Callable, items) -> list:
    """fn(item) for every item, up to GET_CONCURRENCY at once; results in order, the first
    error raised once all have ended."""
    items = list(items)
    if len(items) < 2:
        return [fn(item) for item in items]
    futures = [_readers.pool().submit(fn, item) for item in items]
    wait(futures)
    return [f.result() for f in futures]


def _object_views(items) -> list[ObjectView]:
    return [object_view(item) for item in items]


class _Objects:
    """Objects by (resource, namespace, name), read the way the plan says: a namespace (or
    the cluster) listed once per kind, anything else with one GET each; remembered."""

    def __init__(self, gateway: kube.KubeGateway, plan: ReadPlan):
        self.gateway, self.plan = gateway, plan
        self.listed: dict[tuple, dict] = {}
        self.got: dict[tuple, ObjectView | None] = {}

    def listed_in(self, namespace: str) -> bool:
        return self.plan.full or namespace in self.plan.list_namespaces

    def known(self, resource: kube.Resource, namespace: str, name: str) -> bool:
        """True when `get` needs no GET: listed here, or already read."""
        return self.listed_in(namespace) or (resource, namespace, name) in self.got

    def get(self, resource: kube.Resource, namespace: str, name: str) -> ObjectView | None:
        if self.listed_in(namespace):
            scope = None if self.plan.full else namespace
            if (resource, scope) not in self.listed:
                try:   # each page made into views as it comes: one page of raw objects held at once
                    views = self.gateway.list(resource, namespace=scope, page_size=LIST_PAGE_SIZE,
                                              take=_object_views)
                except NotFound:   # the group is not served: no such objects
                    views = []
                self.listed[(resource, scope)] = {(v.namespace, v.name): v for v in views}
            return self.listed[(resource, scope)].get((namespace, name))
        key = (resource, namespace, name)
        if key not in self.got:
            try:
                raw = self.gateway.get(resource, name, namespace=namespace)
                raw.setdefault("kind", resource.kind)
                self.got[key] = object_view(raw)
            except NotFound:
                self.got[key] = None
        return self.got[key]


def _counts_for_owner(item) -> bool:
    """`planning.pod_counts_for_owner` on a pod's decoded fields, without making its view."""
    status = item.status
    return pod_counts_for_owner(nvidia=asks_nvidia_device(item.spec), phase=status.phase if status else None,
                                deleting=bool(item.metadata.deletionTimestamp))


def _pods_read(gateway: kube.KubeGateway, wanted: frozenset, plan: ReadPlan, *, others: dict | None = None) -> dict:
    """The `wanted` pods as views. `others`, when given, gets the other GPU pods (neither
    finished nor being deleted) of the listed scopes in the wanted pods' namespaces, by
    label set: {namespace: {((label, value), …): [pod name, …]}}, what telling an owner's
    pods by its selector needs. The pods of one ReplicaSet share one set, so a selector is
    matched once per set, not once per pod (bench/prune_pass.py, 2,000 of 10,000 pods idle:
    the pass's traced Python peak 21.4 MiB, 20.4 MiB before owners' pods were told)."""
    pods = {}
    namespaces = {ns for ns, _ in wanted}

    def candidates(items):
        # The candidates among a page's pods, decoded into just the fields a view reads; of
        # the rest, only the names and label sets of the GPU pods beside them are kept.
        out = []
        for item in items:
            meta = item.metadata
            key = (meta.namespace or "", meta.name)
            if key in wanted:
                out.append(PodView.from_fields(item))
            elif others is not None and key[0] in namespaces and _counts_for_owner(item):
                labels = tuple(sorted((meta.labels or {}).items()))
                others.setdefault(key[0], {}).setdefault(labels, []).append(meta.name)
        return out

    # The whole cluster page by page, or each namespace in one LIST.
    for scope in [None] if plan.full else sorted(plan.list_namespaces):
        for view in gateway.list(kube.PODS, namespace=scope, page_size=LIST_PAGE_SIZE if scope is None else None,
                                 decoder=POD_LIST, take=candidates):
            pods[(view.namespace, view.name)] = view

    def pod_get(key):
        try:
            return key, PodView.from_object(gateway.get(kube.PODS, key[1], namespace=key[0]))
        except NotFound:
            return key, None   # gone since Prometheus saw it: planning says so

    pods.update((key, view) for key, view in _each(pod_get, sorted(plan.get_pods)) if view is not None)
    return pods


def cluster_view_read(gateway: kube.KubeGateway, *, pods: Iterable[tuple[str, str]],
                      plan: ReadPlan | None = None, pods_read: dict | None = None,
                      others: dict | None = None) -> ClusterView:
    """The candidate `pods`, every object their owner walk reaches (planning.resolve_owner)
    and every GPU pod of the owners reached (`ClusterView.owner_pods`). `pods_read`: the
    pods already read by `plan` ({(namespace, name): PodView}, a pod absent from it is
    gone), with `others` (as `_pods_read` fills it); else they are read here."""
    wanted = frozenset(pods)
    if not wanted:
        return ClusterView(pods={}, objects={}, owner_pods={})
    plan = plan or ReadPlan(ALL_NAMESPACES, frozenset(), 0.0)
    # Decoded pages hold no reference cycles: the collector would only walk them (at 2,000
    # of 10,000 pods idle it took a tenth of the reads, as for the snapshot).
    with gc_paused():
        if pods_read is None:
            others = {}
            pods_read = _pods_read(gateway, wanted, plan, others=others)
        view = _cluster_view_read(gateway, {k: v for k, v in pods_read.items() if k in wanted}, plan)
        owner_pods = _owner_pods_read(gateway, view, plan, pods_read=pods_read, others=others)
        return ClusterView(pods=view.pods, objects=view.objects, kserve_stop_supported=view.kserve_stop_supported,
                           owner_pods=owner_pods)


def _owner_pods_read(gateway: kube.KubeGateway, view: ClusterView, plan: ReadPlan, *, pods_read: dict,
                     others: dict | None) -> dict:
    """Every GPU pod of each owner the view's pods resolve to, by the owner's selector:
    picked from what was listed where its namespace was listed (the candidates read, busy
    ones too, and `others`), else one LIST of the owner's pods. A candidate (it has GPU
    series) counts whatever it asks for. An owner whose pods cannot be told is left out
    (planning then never counts it idle)."""
    selectors: dict[tuple, tuple | None] = {}
    for pod in view.pods.values():
        owner, _ = resolve_owner(pod, view)
        if owner is not None and owner.key not in selectors:
            selectors[owner.key] = owner_selector(owner, view)
    found: dict[tuple, frozenset] = {}
    to_list = []
    for key, reqs in selectors.items():
        ns = key[1]
        if reqs is None:
            continue
        if others is not None and (plan.full or ns in plan.list_namespaces):
            names = {(ns, name) for labels, group in others.get(ns, {}).items()
                     if selector_matches(reqs, dict(labels)) for name in group}
            names.update(k for k, p in pods_read.items() if k[0] == ns and selector_matches(reqs, p.labels)
                         and counts_for_owner(p, has_gpu_series=True))
            found[key] = frozenset(names)
        else:
            try:
                to_list.append((key, selector_text(reqs)))
            except ValueError:
                continue   # an operator this code does not know: its pods cannot be told

    def owner_pods(items):
        out = []
        for item in items:
            key = (item.metadata.namespace or "", item.metadata.name)
            if _counts_for_owner(item) or (key in pods_read and counts_for_owner(pods_read[key],
                                                                                 has_gpu_series=True)):
                out.append(key)
        return out

    def owner_list(item):
        (kind, ns, name), text = item
        keys = gateway.list(kube.PODS, namespace=ns, label_selector=text, page_size=LIST_PAGE_SIZE,
                            decoder=POD_LIST, take=owner_pods)
        return (kind, ns, name), frozenset(keys)

    found.update(_each(owner_list, to_list))
    return found


def _cluster_view_read(gateway: kube.KubeGateway, views: dict, plan: ReadPlan) -> ClusterView:
    store = _Objects(gateway, plan)
    objects: dict[tuple, ObjectView] = {}
    misses: list[tuple] = []

    def fetch(resource, kind, ns, name):
        if not store.known(resource, ns, name):
            misses.append((resource, ns, name))   # read below, with the others of its level
            return None
        obj = store.get(resource, ns, name)
        if obj is not None:
            objects[(kind, ns, name)] = obj
        return obj

    def walk():
        for pod in views.values():
            ns, isvc = pod.namespace, pod.labels.get(ISVC_LABEL)
            if isvc:
                fetch(kube.INFERENCESERVICES, "InferenceService", ns, isvc)
                continue
            controller = pod.controller
            if controller is None:
                continue
            kind, name = controller.kind, controller.name
            if kind == "ReplicaSet":
                rs = fetch(kube.REPLICASETS, kind, ns, name)
                if rs is None or not rs.owner or rs.owner[0] != "Deployment":
                    continue
                dep = fetch(kube.DEPLOYMENTS, "Deployment", ns, rs.owner[1])
                if dep is not None and dep.owner and dep.owner[0] == "Revision":
                    rev = fetch(kube.REVISIONS, "Revision", ns, dep.owner[1])
                    service = rev.labels.get(KNATIVE_SERVICE_LABEL) if rev else None
                    if service:
                        fetch(kube.KNATIVE_SERVICES, "Service", ns, service)
            elif kind == "StatefulSet":
                sts = fetch(kube.STATEFULSETS, kind, ns, name)
                if sts is not None and sts.owner and sts.owner[0] == "Notebook":
                    fetch(kube.NOTEBOOKS, "Notebook", ns, sts.owner[1])

    stop_supported = True
    if any(p.labels.get(ISVC_LABEL) for p in views.values()):
        stop_supported = kserve_stop_supported(gateway)
    # Level by level: each walk stops where an object still has to be read by GET; those
    # are read together (GET_CONCURRENCY at once), and the walk goes one level further.
    # Listed kinds are listed in the walk itself, once per kind and scope.
    while True:
        misses.clear()
        walk()
        if not misses:
            break
        _each(lambda key: store.get(*key), dict.fromkeys(misses))
    return ClusterView(pods=views, objects=objects, kserve_stop_supported=stop_supported)
