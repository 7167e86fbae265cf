"""Every change the product makes to a customer's workload or node is in the audit trail,
with who asked (an actor or an actor label) and why (a cause).

Each feature's real write paths run end to end against the simulated cluster, through a
gateway that remembers every write request it sends (`RecordingGateway`: the one request
path of `clusters/kube.py`, `_send`). Then, write by write, an `AuditEntry` of the same
app must name the object written: by its target, or by its key in the entry's before/after
values (binpack's one entry per run, an org's entry per apply), or, for what a runbook
action removed along with its target, by its name in the values of the target's entry.
A row no one asked for (the beat's, a worker's for the schedule) carries no actor; its
cause then says which schedule ran it (CONVENTIONS.md, config/actors.py).

The worlds are the features' own (tests/orgs, tests/pruning, tests/capacity).
"""
from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import kubernetes
import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import Max

# The pruning and capacity worlds import their neighbours by bare name (`from pruning_world
# import …`), as pytest's rootdir import of those folders (no __init__.py) allows.
_TESTS = Path(__file__).resolve().parents[1]
for _folder in ("pruning", "capacity"):
    if str(_TESTS / _folder) not in sys.path:
        sys.path.insert(0, str(_TESTS / _folder))

from audit.models import AuditEntry  # noqa: E402
from capacity.binpack.services import pod_deletion_costs_apply  # noqa: E402
from capacity.defrag.models import JobState  # noqa: E402
from capacity.defrag.services import (  # noqa: E402
    defrag_discover,
    defrag_job_abort,
    defrag_job_drain,
    defrag_job_start,
    node_return_to_service,
)
from capacity.runbook import services as runbook  # noqa: E402
from capacity.runbook.models import ResourceSpec, ServedModel  # noqa: E402
from clusters import kube  # noqa: E402
from clusters.errors import KubeError  # noqa: E402
from clusters.labels import MIN_SCALE  # noqa: E402
from config import clock  # noqa: E402
from orgs import services as orgs  # noqa: E402
from orgs.models import Org  # noqa: E402
from orgs.tokens import activity_token_issue  # noqa: E402
from pruning.models import PruneDecision  # noqa: E402
from pruning.services import PruneParams, prune_decision_restore, prune_run_execute  # noqa: E402
from tests.capacity.conftest import defrag_world  # noqa: E402,F401 - the defrag tests' world
from tests.capacity.defrag_cluster import knative_service as defrag_model  # noqa: E402
from tests.capacity.defrag_cluster import run_until  # noqa: E402
from tests.capacity.defrag_cluster import scenario as defrag_scenario  # noqa: E402
from tests.capacity.test_binpack_services import scenario as binpack_scenario  # noqa: E402
from tests.capacity.test_runbook_durability import NS as RUNBOOK_NS  # noqa: E402
from tests.capacity.test_runbook_durability import OLD as RUNBOOK_OLD_REVISION  # noqa: E402
from tests.capacity.test_runbook_durability import World as RunbookWorld  # noqa: E402
from tests.capacity.test_runbook_durability import scenario as runbook_scenario  # noqa: E402
from tests.orgs.conftest import _fresh_throttle  # noqa: E402,F401 - each test starts a fresh activity window
from tests.orgs.test_services import scenario as orgs_scenario  # noqa: E402
from tests.pruning.conftest import prometheus_factory  # noqa: E402,F401 - the pruning tests' Prometheus
from tests.pruning.pruning_world import World as PruningWorld  # noqa: E402
from tests.pruning.pruning_world import deployment  # noqa: E402
from tests.pruning.test_with_orgs import NS as PYNODE_NS  # noqa: E402
from tests.pruning.test_with_orgs import org_of, pynode_service  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


# --- the writes the product sends -------------------------------------------------------------------
@dataclass(frozen=True)
class Write:
    app: str | None          # the feature acting when it was sent; None: the test's own setup
    verb: str                # create, patch, replace, delete, evict
    kind: str
    namespace: str
    name: str
    subresource: str
    succeeded: bool
    entries_before: int      # the newest audit entry's id when it was sent: its own entry comes after


    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.kind} {where}" + (f" ({self.subresource})" if self.subresource else "")


class RecordingGateway(kube.KubeGateway):
    """The product's gateway, remembering each write it sends and whether it was answered
    with success (retries included: one record per request the caller made)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes: list[Write] = []
        self.app: str | None = None
        self.entries_before = 0

    @contextmanager
    def acting(self, app: str) -> Iterator[None]:
        """What is sent meanwhile is `app`'s. Not thread-local: binpack writes from a pool."""
        before, self.app = self.app, app
        self.entries_before = _newest_entry()
        try:
            yield
        finally:
            self.app = before

    def _send(self, verb, resource, method, path, **kwargs):
        if method in ("GET", "HEAD"):
            return super()._send(verb, resource, method, path, **kwargs)
        namespace, name, subresource = _object_of(resource, path, kwargs.get("body"))
        # A pool thread (binpack's writers) has no database connection of the test's: the
        # action's start stands for its writes.
        mark = _newest_entry() if threading.current_thread() is threading.main_thread() else self.entries_before
        try:
            answer = super()._send(verb, resource, method, path, **kwargs)
        except KubeError:
            self.writes.append(Write(self.app, verb, resource.kind, namespace, name, subresource, False, mark))
            raise
        self.writes.append(Write(self.app, verb, resource.kind, namespace, name, subresource, True, mark))
        return answer


def _newest_entry() -> int:
    return AuditEntry.objects.aggregate(newest=Max("id"))["newest"] or 0


def _object_of(resource: kube.Resource, path: str, body) -> tuple[str, str, str]:
    """(namespace, name, subresource) of a request path; a create's name is in its body."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    parts = parts[2:] if parts[0] == "api" else parts[3:]
    namespace = ""
    if resource.namespaced and parts[0] == "namespaces" and len(parts) > 2:
        namespace, parts = parts[1], parts[2:]
    name = parts[1] if len(parts) > 1 else ((body or {}).get("metadata") or {}).get("name", "")
    return namespace, name, parts[2] if len(parts) > 2 else ""


@pytest.fixture
def record_writes(monkeypatch):
    """`record_writes(cluster)` → the RecordingGateway every service gets for that cluster."""
    made: list[RecordingGateway] = []

    def record(cluster) -> RecordingGateway:
        # Retries without waiting: the policy is not what is tested here.
        gateway = RecordingGateway.from_kubeconfig(cluster.kubeconfig_path, cluster.kube_context or None,
                                                   name=cluster.name, retry_attempts=3, backoff=0.0,
                                                   sleep=lambda s: None)
        others = kube.gateway_for
        monkeypatch.setattr(kube, "gateway_for", lambda c: gateway if c.pk == cluster.pk else others(c))
        made.append(gateway)
        return gateway

    yield record
    for gateway in made:
        gateway.close()


# --- what is not a change to a workload or a node ------------------------------------------------------
# Kept short on purpose: each kind here is written by the product and changes nothing a
# customer runs. The product holds no Kubernetes Leases (its leases are database rows) and
# writes no ConfigMap of its own (it only reads knative-serving/config-autoscaler).
NOT_A_CHANGE = {
    # The notices each feature posts about what it did (DefragCordon, GPUIdleScaledToZero…):
    # they tell kubectl users what the audited change was; they are not the change.
    ("create", "Event"),
}

# The beat's jobs as the causes name them (config/schedule.py): the binpack run's trigger
# "beat schedule", the orgs' "dormancy sweep" and "reconcile".
SAYS_SCHEDULE = re.compile(r"\b(schedule|sweep|reconcile)\b", re.IGNORECASE)


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def names(entry: AuditEntry, write: Write) -> bool:
    """Whether the entry says it is about the object written."""
    key = f"Node/{write.name}" if write.kind == "Node" else f"{write.namespace}/{write.name}"
    whole = re.compile(rf"(?<![\w.\-]){re.escape(key)}(?![\w.\-/])")   # "Pod/ns/name" names ns/name
    if whole.search(entry.target) or any(whole.search(s) for s in _strings([entry.old, entry.new])):
        return True
    # What a runbook action removed along with its target (a revision's pods, a model's
    # leftovers) is listed by name, or Kind/name, in the values of the target's entry.
    same_namespace = re.match(rf"(?:\w+[ /])?{re.escape(write.namespace)}/", entry.target)
    return bool(write.namespace and same_namespace) and any(
        s in (write.name, f"{write.kind}/{write.name}") for s in _strings([entry.old, entry.new]))


def _qualifies(entry: AuditEntry) -> bool:
    return bool(entry.cause) and bool(entry.actor_id or entry.actor_label or SAYS_SCHEDULE.search(entry.cause))


def unaudited(writes: list[Write]) -> list[str]:
    """Each change sent with success and not audited as it should be, and why.

    A write's entry is recorded after it was sent, and no later than the first entry
    that names a change sent after it (an org's apply, a binpack run: one entry for the
    writes sent back to back). An entry stands for one change of each object it names,
    so the entry of another step on the same object (a node's cordon, then its delete)
    never stands for this one."""
    found = []
    changes = [w for w in writes if w.succeeded and (w.verb, w.kind) not in NOT_A_CHANGE]
    claimed: set[tuple] = set()
    for index, write in enumerate(changes):
        if write.app is None:
            found.append(f"{write}: sent outside any feature's action (the test cannot tell whose it is)")
            continue
        later = [w for w in changes[index + 1:] if w.app == write.app]
        window = []
        for entry in AuditEntry.objects.filter(app=write.app, id__gt=write.entries_before).order_by("id"):
            window.append(entry)
            if any(names(entry, w) for w in later):
                break
        key = (write.kind, write.namespace, write.name)
        naming = [e for e in window if names(e, write) and (e.pk, key) not in claimed]
        chosen = next((e for e in naming if _qualifies(e)), None)
        if chosen is not None:
            claimed.add((chosen.pk, key))
        elif not naming:
            found.append(f"{write}: no {write.app} audit entry names it")
        elif not any(e.cause for e in naming):
            found.append(f"{write}: its entries ({', '.join(e.action for e in naming)}) give no cause")
        else:
            found.append(f"{write}: its entries name no actor and do not say it was the schedule: "
                         + "; ".join(f"{e.action}: {e.cause!r}" for e in naming))
    return found


def operator(username: str = "ops") -> User:
    return User.objects.create_superuser(username, f"{username}@example.com", "pw")


# --- orgs ----------------------------------------------------------------------------------------------
def _orgs_world(request) -> tuple:
    request.getfixturevalue("celery_eager")   # the queued apply runs at commit, in this process
    handle = request.getfixturevalue("sim_cluster_factory")(orgs_scenario())
    handle.advance(0)
    gateway = request.getfixturevalue("record_writes")(handle.cluster)
    with gateway.acting("orgs"):
        orgs.orgs_sync(cluster=handle.cluster, now=clock.now())
    return handle, gateway


def _acme_idle_and_swept(gateway) -> None:
    Org.objects.filter(slug="acme").update(last_activity_at=clock.now() - timedelta(hours=30))
    with gateway.acting("orgs"):
        orgs.dormancy_sweep(now=clock.now())


def orgs_sweep(request) -> tuple[RecordingGateway, set[str]]:
    _, gateway = _orgs_world(request)
    _acme_idle_and_swept(gateway)
    assert Org.objects.get(slug="acme").dormant
    return gateway, {"patch Service acme/pynode", "patch Revision acme/llm-predictor-00001",
                     "patch Revision acme/big-predictor-00001"}


def orgs_wake_by_activity(request) -> tuple[RecordingGateway, set[str]]:
    _, gateway = _orgs_world(request)
    _acme_idle_and_swept(gateway)
    request.getfixturevalue("redis_cache")
    caller = User.objects.create_user("model-gateway")
    caller.user_permissions.add(Permission.objects.get(codename="record_activity"))
    token = activity_token_issue(caller="model-gateway", user=caller, actor=None, now=clock.now())
    writes_before = len(gateway.writes)
    with gateway.acting("orgs"):
        answer = request.getfixturevalue("client").post("/api/orgs/acme/activity",
                                                        HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200 and not Org.objects.get(slug="acme").dormant
    assert len(gateway.writes) > writes_before, "the wake wrote nothing"
    return gateway, {"patch Service acme/pynode", "patch Revision acme/big-predictor-00001"}


def orgs_reconcile_repairs_drift(request) -> tuple[RecordingGateway, set[str]]:
    handle, gateway = _orgs_world(request)
    _acme_idle_and_swept(gateway)
    # Someone sets a model back by hand (the official client: not the product's write).
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    try:
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "serving.knative.dev", "v1", "acme", "revisions", "llm-predictor-00001",
            {"metadata": {"annotations": {MIN_SCALE: "1"}}})
    finally:
        api.close()
    writes_before = len(gateway.writes)
    with gateway.acting("orgs"):
        orgs.orgs_reconcile(now=clock.now(), cluster=handle.cluster)
    assert [str(w) for w in gateway.writes[writes_before:]] == ["patch Revision acme/llm-predictor-00001"]
    return gateway, {"patch Revision acme/llm-predictor-00001"}


def orgs_operator_disallows_allows_and_exempts(request) -> tuple[RecordingGateway, set[str]]:
    _, gateway = _orgs_world(request)
    _acme_idle_and_swept(gateway)
    ops = operator()
    for allowed in (False, True):
        with gateway.acting("orgs"):
            orgs.org_scale_to_zero_allow(org=Org.objects.get(slug="acme"), allowed=allowed, actor=ops,
                                         now=clock.now())
    with gateway.acting("orgs"):
        orgs.workload_hold_set(org=Org.objects.get(slug="acme"), kind="pynode", name="pynode", until=None,
                               reason="demo day", actor=ops, now=clock.now())
    return gateway, {"patch Service acme/pynode", "patch Revision acme/llm-predictor-00001"}


# --- pruning -------------------------------------------------------------------------------------------
@pytest.fixture
def pruning_world(tmp_path, prometheus_factory):  # noqa: F811 - the imported fixture
    with PruningWorld.start(tmp_path) as world:
        world.prometheus_factory = prometheus_factory
        yield world


def _pruned(request, *workloads: dict) -> tuple[PruningWorld, RecordingGateway, object]:
    """The workloads created idle, 40 minutes of history, and the schedule's scale-down run
    (as `pruning.tasks.prune_cluster` makes it: no actor)."""
    world = request.getfixturevalue("pruning_world")
    org = org_of(world)     # the team-c org and the cluster row the run acts on
    gateway = request.getfixturevalue("record_writes")(org.cluster)
    world.gateway.close()
    world.gateway = gateway
    for workload in workloads:
        world.create(workload)
    world.record_history(minutes=40)
    with gateway.acting("pruning"):
        run = prune_run_execute(kube_gateway=gateway, prometheus=world.prometheus(), now=world.now(),
                                params=PruneParams(run_mode="scale-down"), cluster=org.cluster, actor="")
    return world, gateway, run


def pruning_scale_down_by_the_schedule(request) -> tuple[RecordingGateway, set[str]]:
    _, gateway, run = _pruned(request, deployment("web", "team-a", util="0"), pynode_service())
    assert run.decisions.filter(result="succeeded").count() == 2
    return gateway, {"patch Deployment team-a/web (scale)", f"patch Service {PYNODE_NS}/kn"}


def pruning_restore_by_an_operator(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, run = _pruned(request, deployment("web", "team-a", util="0"))
    decision = run.decisions.get(owner_name="web", result="succeeded")
    with gateway.acting("pruning"):
        decision = prune_decision_restore(kube_gateway=gateway, decision=decision, actor="operator",
                                          now=world.now())
    assert decision.restore == PruneDecision.Restore.RESTORED
    return gateway, {"patch Deployment team-a/web (scale)"}


def pruning_restore_of_a_pynode_its_org_keeps_asleep(request) -> tuple[RecordingGateway, set[str]]:
    request.getfixturevalue("celery_eager")
    world, gateway, run = _pruned(request, pynode_service())
    decision = run.decisions.get(owner_name="kn", result="succeeded")
    Org.objects.filter(slug=PYNODE_NS).update(last_activity_at=clock.now() - timedelta(hours=30))
    with gateway.acting("orgs"):
        orgs.dormancy_sweep(now=clock.now())
    writes_before = len(gateway.writes)
    with gateway.acting("pruning"):
        decision = prune_decision_restore(kube_gateway=gateway, decision=decision, actor="operator",
                                          now=world.now())
    assert decision.restore == PruneDecision.Restore.RESTORED
    assert "into the org's record" in AuditEntry.objects.get(app="pruning", action="workload_restore").cause
    assert [str(w) for w in gateway.writes[writes_before:] if w.kind != "Event"] == [f"patch Service {PYNODE_NS}/kn"]
    with gateway.acting("orgs"):   # the operator wakes the org: the owner's floor comes back
        orgs.org_mark_active_now(org=Org.objects.get(slug=PYNODE_NS), actor=operator(), now=clock.now())
    return gateway, {f"patch Service {PYNODE_NS}/kn"}


# --- defrag --------------------------------------------------------------------------------------------
def _defrag_job_started(request):
    """A defrag job an operator started on the node with the model's pods (discovery and the
    start recorded): (world, gateway, operator, node, its pod as namespace/name, job)."""
    world = request.getfixturevalue("defrag_world")(defrag_scenario(defrag_model(min_scale=3)))
    gateway = request.getfixturevalue("record_writes")(world.cluster)
    world.gateway = gateway
    ops = operator()
    node = world.kube.node_with_pods()
    [pod] = world.kube.pods(node=node)
    with gateway.acting("defrag"):
        plan = defrag_discover(cluster=world.cluster, node_name=node, gateway=gateway)
        job = defrag_job_start(cluster=world.cluster, node_name=node, plan=plan, actor=ops, now=world.now(),
                               enqueue=False, poll_interval_seconds=2.0)
    return world, gateway, ops, node, f"{pod.metadata.namespace}/{pod.metadata.name}", job


def defrag_cordon_orphan_drain_and_delete_the_node(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops, node, pod, job = _defrag_job_started(request)
    with gateway.acting("defrag"):   # the worker steps the job: the operator's, who confirmed it
        job = run_until(world, job, {JobState.SAFE})
        job = defrag_job_drain(job=job, actor=ops, delete_node=True, now=world.now(), enqueue=False)
        job = run_until(world, job, {JobState.DRAINED}, dt=5)
    return gateway, {f"patch Node {node}", f"patch Pod {pod}", f"evict Pod {pod} (eviction)", f"delete Node {node}"}


def defrag_abort(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops, node, pod, job = _defrag_job_started(request)
    with gateway.acting("defrag"):
        job = run_until(world, job, {JobState.WAITING}, dt=0)
        job = defrag_job_abort(job=job, actor=ops, now=world.now(), enqueue=False)
        job = run_until(world, job, {JobState.ABORTED}, dt=2)
    return gateway, {f"patch Node {node}", f"patch Pod {pod}", f"delete Pod {pod}"}


def defrag_return_to_service(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops, node, _, job = _defrag_job_started(request)
    with gateway.acting("defrag"):
        job = run_until(world, job, {JobState.SAFE})
        node_return_to_service(cluster=world.cluster, node=node, actor=ops, job=job, gateway=gateway,
                               now=world.now(), enqueue=False)
        job.refresh_from_db()
        run_until(world, job, {JobState.ABORTED}, dt=2)    # the abort it asked for ends the orphan
    assert not world.kube.node_cordoned(node)
    return gateway, {f"patch Node {node}"}


# --- runbook -------------------------------------------------------------------------------------------
def _runbook_world(request) -> tuple[RunbookWorld, RecordingGateway, User]:
    handle = request.getfixturevalue("sim_cluster_factory")(runbook_scenario())
    handle.advance(120)
    Org.objects.create(slug="acme", cluster=handle.cluster, namespace=RUNBOOK_NS)
    gateway = request.getfixturevalue("record_writes")(handle.cluster)
    world = RunbookWorld(handle)
    request.addfinalizer(world.api.close)
    return world, gateway, operator()


def runbook_redeploy_and_unblock(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops = _runbook_world(request)
    with gateway.acting("runbook"):
        runbook.model_redeploy(model=world.model(), actor=ops)
    world.handle.advance(60)     # the new revision waits for the GPU the old one holds
    old_pods = [p.metadata.name for p in world.core.list_namespaced_pod(RUNBOOK_NS).items
                if p.metadata.labels.get("serving.knative.dev/revision") == RUNBOOK_OLD_REVISION]
    with gateway.acting("runbook"):
        runbook.revision_delete_old(model=world.model(), revision=RUNBOOK_OLD_REVISION, actor=ops)
    return gateway, {f"patch InferenceService {RUNBOOK_NS}/zq86d3o",
                     f"delete Revision {RUNBOOK_NS}/{RUNBOOK_OLD_REVISION}",
                     *(f"delete Pod {RUNBOOK_NS}/{name}" for name in old_pods)}


def runbook_resource_spec_apply(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops = _runbook_world(request)
    world.model()
    spec = ResourceSpec.objects.create(cluster=world.cluster, model="zq86d3o", gpu_count=1, cpu_request="2",
                                       cpu_limit="4", memory_request="8Gi", memory_limit="8Gi",
                                       created_at=clock.now(), created_by=ops)
    with gateway.acting("runbook"):
        applied = runbook.resource_spec_apply(spec=spec, actor=ops)
    assert [a.get("error") for a in applied] == [None]
    return gateway, {f"patch InferenceService {RUNBOOK_NS}/zq86d3o"}


def runbook_delete_a_model_stuck_deploying(request) -> tuple[RecordingGateway, set[str]]:
    world, gateway, ops = _runbook_world(request)
    model = world.stuck()
    with gateway.acting("runbook"):
        runbook.model_delete_stuck(model=model, actor=ops)
    assert ServedModel.objects.get(pk=model.pk).gone
    return gateway, {f"delete InferenceService {RUNBOOK_NS}/stuck"}


# --- binpack -------------------------------------------------------------------------------------------
def binpack_run_of_the_schedule(request) -> tuple[RecordingGateway, set[str]]:
    handle = request.getfixturevalue("sim_cluster_factory")(binpack_scenario())
    gateway = request.getfixturevalue("record_writes")(handle.cluster)
    with gateway.acting("binpack"):
        run, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    assert run.written == 4
    return gateway, {f"patch Pod team/{pod}" for pod in ("a-0", "a-1", "a-2", "b-0")}


SCENARIOS: dict[str, Callable] = {f.__name__: f for f in (
    orgs_sweep, orgs_wake_by_activity, orgs_reconcile_repairs_drift, orgs_operator_disallows_allows_and_exempts,
    pruning_scale_down_by_the_schedule, pruning_restore_by_an_operator,
    pruning_restore_of_a_pynode_its_org_keeps_asleep,
    defrag_cordon_orphan_drain_and_delete_the_node, defrag_abort, defrag_return_to_service,
    runbook_redeploy_and_unblock, runbook_resource_spec_apply, runbook_delete_a_model_stuck_deploying,
    binpack_run_of_the_schedule,
)}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_write_to_a_workload_or_node_is_audited_with_actor_and_cause(scenario, request):
    gateway, expected = SCENARIOS[scenario](request)
    sent = {str(w) for w in gateway.writes if w.succeeded}
    assert expected <= sent, f"the scenario did not make the writes it is about: {sorted(expected - sent)}"
    missing = unaudited(gateway.writes)
    assert not missing, f"{scenario}: changes not audited with actor and cause:\n" + "\n".join(missing)
