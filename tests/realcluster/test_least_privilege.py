"""Least privilege on the real RBAC authorizer: each (group, resource, verb) of deploy/'s
ClusterRole (and of deploy/knative/'s Role) taken out makes a feature of the product,
run with the ServiceAccount's token, fail with kube-apiserver's own 403 naming that
resource and verb.

tests/deploy/test_least_privilege.py proves the same on simcluster's RBAC by running
whole features per rule. Here each rule has the smallest feature call that needs it (a
defrag discovery, a pruner's owner write, a runbook delete-stuck...), run against one
scene of real objects built once for the module. For each rule: the role is replaced
without it, the test polls the authorizer (SubjectAccessReview) until it refuses that
access, runs the call, reads what the product reports (its error, the job's or action's
recorded error, the panel's reason), and puts the role back, polling until granted.
The feature tests beside this file show the whole role is enough: every one of them
runs the product as this ServiceAccount.
"""
from __future__ import annotations

import copy
import itertools
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from capacity.binpack.services import pod_deletion_costs_apply
from capacity.defrag import services as defrag
from capacity.defrag.models import AbortChoice, JobState
from capacity.runbook import services as runbook
from capacity.runbook.models import RunbookAction, ServedModel
from clusters import kube
from clusters.models import Cluster
from orgs import services as orgs
from orgs.models import Org
from pruning import actions as prune_actions
from pruning import planning as prune_planning
from pruning.models import PruneRun
from pruning.services import PruneParams, prune_run_execute

from .identity import DEPLOY, deploy_object, until_authorizer_says
from .pool import SERVING, GpuPool, ready

KSERVE = ("serving.kserve.io", "v1beta1")
MIN_SCALE = "autoscaling.knative.dev/min-scale"
KNATIVE_VERSION_LABEL = "app.kubernetes.io/version"
SECONDS = 40                         # wall time for the real controllers to act
PRUNE_WINDOW, PRUNE_STEP = 30, 15    # seconds: a window of two steps, as test_features_prune.py


# --- the roles, one rule out at a time -------------------------------------------------------------
def rule_pairs(role: dict) -> list[tuple[str, str, str]]:
    return sorted({(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]})


def without(role: dict, pair: tuple[str, str, str]) -> dict:
    """The role with exactly one (group, resource, verb) taken out, everything else kept."""
    rules = []
    for rule in role["rules"]:
        for g, r in itertools.product(rule["apiGroups"], rule["resources"]):
            verbs = [v for v in rule["verbs"] if (g, r, v) != pair]
            if verbs:
                rules.append({**{k: v for k, v in rule.items() if k not in ("apiGroups", "resources", "verbs")},
                              "apiGroups": [g], "resources": [r], "verbs": verbs})
    slim = copy.deepcopy(role)
    slim["rules"] = rules
    assert pair not in rule_pairs(slim) and len(rule_pairs(slim)) == len(rule_pairs(role)) - 1
    return slim


CLUSTER_ROLE = deploy_object("ClusterRole")
KNATIVE_ROLE = deploy_object("Role", DEPLOY / "knative" / "rbac.yaml")
PAIRS = [("ClusterRole", p) for p in rule_pairs(CLUSTER_ROLE)] + [("Role", p) for p in rule_pairs(KNATIVE_ROLE)]



def role_put(backend, kind: str, role: dict) -> None:
    rbac = client.RbacAuthorizationV1Api(backend.api_client)
    if kind == "ClusterRole":
        current = rbac.read_cluster_role(role["metadata"]["name"])
        rbac.replace_cluster_role(role["metadata"]["name"], {**role, "metadata": {
            **role["metadata"], "resourceVersion": current.metadata.resource_version}})
    else:
        ns = role["metadata"]["namespace"]
        current = rbac.read_namespaced_role(role["metadata"]["name"], ns)
        rbac.replace_namespaced_role(role["metadata"]["name"], ns, {**role, "metadata": {
            **role["metadata"], "resourceVersion": current.metadata.resource_version}})


def access(role: dict, pair: tuple[str, str, str], namespace: str) -> dict:
    """The SubjectAccessReview attributes of the call a probe makes for `pair`."""
    group, resource, verb = pair
    [rule] = [r for r in role["rules"] if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]]
    resource, _, subresource = resource.partition("/")
    if resource == "*":
        resource = "deployments"
    if role["kind"] == "Role":
        namespace = role["metadata"]["namespace"]
    cluster_scoped = resource in ("nodes", "namespaces")
    return dict(verb=verb, resource=resource, group=group, subresource=subresource,
                namespace="" if cluster_scoped else namespace, name=(rule.get("resourceNames") or [""])[0])


def forbidden_sentence(user: str, pair: tuple[str, str, str]) -> re.Pattern:
    """kube-apiserver's Forbidden message (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters
    `forbiddenMessage`) for this user, verb and resource."""
    group, resource, verb = pair
    name = re.escape(resource).replace(r"\*", "[a-z]+")
    return re.compile(f'User "{re.escape(user)}" cannot {verb} resource "{name}" in API group "{re.escape(group)}"')


# --- the scene the probes act on (admin), built once ------------------------------------------------
NOTEBOOK_CRD = ("kubeflow.org", "v1", "Notebook", "notebooks")
MODELSERVING_CRD = ("workload.serving.volcano.sh", "v1alpha1", "ModelServing", "modelservings")


def crd_install(backend, group: str, version: str, kind: str, plural: str) -> None:
    """A CRD serving the group, version and names Kubeflow's Notebook (or Kthena's
    ModelServing) has, without its schema (any fields kept): the real tier installs
    neither; served, the kinds answer the product's reads and writes as on a cluster
    running them."""
    ext = client.ApiextensionsV1Api(backend.api_client)
    name = f"{plural}.{group}"
    try:
        ext.create_custom_resource_definition({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    backend.settle(lambda: any(c.type == "Established" and c.status == "True"
                               for c in ext.read_custom_resource_definition(name).status.conditions or []),
                   what=f"CRD {name} established")


@dataclass
class Scene:
    backend: object
    pool: GpuPool            # a model (Knative Service `kn`, one pod on `kn_node`), an InferenceService,
                             # workloads at zero replicas, a Notebook
    kn_node: str
    idle_pool: GpuPool       # an idle Deployment for the pruner
    notebook_pool: GpuPool   # an idle Notebook's two StatefulSet pods: the pruner lists the namespace

    @property
    def ns(self) -> str:
        return self.pool.ns


def notebook_with_pods(pool: GpuPool, name: str, replicas: int) -> None:
    notebook = pool.custom.create_namespaced_custom_object("kubeflow.org", "v1", pool.ns, "notebooks", {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{"name": name, "image": "dev.local/nb:1"}]}}}})
    if not replicas:
        return
    sts = pool._workload("StatefulSet", name, replicas=replicas)
    sts["spec"].update(serviceName=name, podManagementPolicy="Parallel")
    sts["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": name,
                                           "uid": notebook["metadata"]["uid"], "controller": True}]
    pool.apps.create_namespaced_stateful_set(pool.ns, sts)


@pytest.fixture(scope="module")
def scene(real_tier, product_identity):
    backend = real_tier
    crd_install(backend, *NOTEBOOK_CRD)
    crd_install(backend, *MODELSERVING_CRD)
    # The pruner's namespaces first: their pods must grow older than its window.
    idle = GpuPool(backend, "lp-idle")
    idle.node_add("n1")
    idle.deployment("idle", replicas=1)
    notebooks = GpuPool(backend, "lp-nb")
    notebooks.node_add("n1")
    notebook_with_pods(notebooks, "nb", 2)
    pool = GpuPool(backend, "lp")
    for suffix in ("n1", "n2"):
        pool.node_add(suffix)
    pool.knative_service("kn", min_scale=1)
    pool.deployment("web", replicas=0)
    pool.replicaset("bare", replicas=0)
    sts = pool._workload("StatefulSet", "db", replicas=0)
    sts["spec"]["serviceName"] = "db"
    pool.apps.create_namespaced_stateful_set(pool.ns, sts)
    notebook_with_pods(pool, "nb", 0)
    isvc_create(pool, "llm", product=None)
    backend.settle(lambda: pool.model_ready("kn-00001", 1), what="kn-00001 with one Ready pod", seconds=SECONDS)
    backend.settle(lambda: any(ready(p) for p in pool.pods(revision="llm-predictor-00001")),
                   what="llm's predictor pod Ready", seconds=SECONDS)
    backend.settle(lambda: len([p for p in notebooks.pods() if ready(p)]) == 2 and idle.pods()
                   and all(ready(p) for p in idle.pods()), what="the idle pods Ready", seconds=SECONDS)
    kn_node = pool.node_with_pods("kn-00001", 1)
    yield Scene(backend, pool, kn_node, idle, notebooks)
    for made in (pool, idle, notebooks):
        made.close()


def isvc_create(pool: GpuPool, name: str, *, product: str | None) -> None:
    pinning = pool.pinning()
    if product:
        pinning["nodeSelector"] = {**pinning["nodeSelector"], "nvidia.com/gpu.product": product}
    pool.custom.create_namespaced_custom_object(*KSERVE, pool.ns, "inferenceservices", {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name},
        "spec": {"predictor": {"minReplicas": 1, "maxReplicas": 1, **pinning,
                               "containers": [{"name": "kserve-container", "image": "dev.local/model:1",
                                               "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                             "requests": {"nvidia.com/gpu": "1"}}}]}}})


# --- the probes: the smallest feature call that needs each rule -------------------------------------
@dataclass
class Probe:
    cluster: Cluster
    scene: Scene
    cleanups: list

    @property
    def gateway(self) -> kube.KubeGateway:
        return kube.gateway_for(self.cluster)

    @property
    def now(self):
        return self.scene.backend.now()


PROBES: dict[tuple[str, str, str], Callable[[Probe], str]] = {}


def needs(*pairs: tuple[str, str, str]):
    def register(fn):
        for pair in pairs:
            PROBES[pair] = fn
        return fn
    return register


def job_said(job) -> str:
    return "\n".join([job.error or "", *job.log[-6:]])


@needs(("", "nodes", "get"), ("", "pods", "list"), ("autoscaling.internal.knative.dev", "podautoscalers", "get"),
       ("apps", "replicasets", "get"))
def defrag_discover(p: Probe) -> str:
    """Defrag's discovery of the model's node: the node, its pods, each revision's KPA and ReplicaSet."""
    return "\n".join(defrag.defrag_discover(cluster=p.cluster, node_name=p.scene.kn_node).report_lines())


def _defrag_job(p: Probe, node: str):
    plan = defrag.defrag_discover(cluster=p.cluster, node_name=node)
    p.cleanups.append(lambda: _ignore_404(lambda: p.scene.pool.core.patch_node(node, {"spec": {"unschedulable": False}})))
    return defrag.defrag_job_start(cluster=p.cluster, node_name=node, plan=plan, now=p.now, enqueue=False,
                                   poll_interval_seconds=1.0)


def _steps(p: Probe, job, until: set, *, seconds: float = SECONDS):
    """Step the job until it reaches `until` or records an API error (the operator reads it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = defrag.defrag_job_step(job=job, now=p.now)
        if job.state in until or job.error:
            return job
        time.sleep(0.2)
    raise AssertionError(f"defrag job stuck in {job.state}: {job_said(job)}")


@needs(("policy", "poddisruptionbudgets", "list"))
def campaign_checks_a_nodes_budgets(p: Probe) -> str:
    """A campaign's check of its next node before that node's defrag job starts: the node and
    its pods read afresh, discovery, then the PodDisruptionBudgets of the pods' namespaces."""
    from capacity.campaigns.models import Campaign, CampaignNode
    from capacity.campaigns.services.budgets import node_start_verdict

    campaign = Campaign.objects.create(cluster=p.cluster, selector={"kubernetes.io/hostname": p.scene.kn_node},
                                       max_in_flight=1, plan={}, created_at=p.now)
    row = CampaignNode.objects.create(campaign=campaign, node_name=p.scene.kn_node, position=1)
    verdict = node_start_verdict(campaign, row, p.gateway, p.now)
    return f"start: {verdict.plan is not None}, wait: {verdict.wait!r}, drop: {verdict.drop!r}"


@needs(("", "nodes", "patch"), ("", "pods", "get"), ("", "pods", "patch"))
def defrag_cordon_and_orphan(p: Probe) -> str:
    """Defrag on the model's node: cordon (node patch), re-read and orphan the pod (pod get, patch)."""
    job = _steps(p, _defrag_job(p, p.scene.kn_node), {JobState.WAITING, JobState.SAFE})
    return job_said(job)


@needs(("autoscaling.internal.knative.dev", "podautoscalers", "list"),
       ("autoscaling.internal.knative.dev", "podautoscalers", "watch"))
def defrag_wait_on_the_kpa(p: Probe) -> str:
    """A recorded defrag job waits for its revisions' KPAs to move: one LIST, then a WATCH."""
    job = defrag.defrag_job_step(job=_defrag_job(p, p.scene.kn_node), now=p.now)   # record: reads only
    assert job.state == JobState.RECORDED, job_said(job)
    return f"woke: {defrag.defrag_job_wait(job=job, timeout_seconds=1)}"


@needs(("", "nodes", "delete"))
def defrag_drain_deletes_the_node(p: Probe) -> str:
    """Defrag of an empty node to safe, then drained with node deletion."""
    node = p.scene.pool.node_add(f"empty{len(p.cleanups)}")
    job = _steps(p, _defrag_job(p, node), {JobState.SAFE})
    job = defrag.defrag_job_drain(job=job, actor=None, delete_node=True, now=p.now, enqueue=False)
    return job_said(_steps(p, job, {JobState.DRAINED}))


def _model_alone(p: Probe, prefix: str) -> tuple[GpuPool, str]:
    """A model of its own (one pod) on two fresh nodes: what a drain or abort may disturb."""
    pool = GpuPool(p.scene.backend, prefix)
    p.cleanups.append(pool.close)
    pool.node_add("n1")
    pool.node_add("n2")
    pool.knative_service("m", min_scale=1)
    pool.backend.settle(lambda: pool.model_ready("m-00001", 1), what="m-00001 Ready", seconds=SECONDS)
    return pool, pool.node_with_pods("m-00001", 1)


@needs(("", "pods/eviction", "create"))
def defrag_drain_evicts_the_orphan(p: Probe) -> str:
    _, node = _model_alone(p, "lp-drain")
    job = _steps(p, _defrag_job(p, node), {JobState.SAFE})
    job = defrag.defrag_job_drain(job=job, actor=None, now=p.now, enqueue=False)
    return job_said(_steps(p, job, {JobState.DRAINED}))


@needs(("", "pods", "delete"))
def defrag_abort_deletes_the_orphan(p: Probe) -> str:
    _, node = _model_alone(p, "lp-abort")
    job = _steps(p, _defrag_job(p, node), {JobState.WAITING, JobState.SAFE})
    job = defrag.defrag_job_abort(job=job, actor=None, orphans=AbortChoice.DELETE, now=p.now, enqueue=False)
    return job_said(_steps(p, job, {JobState.ABORTED}))


@needs(("apps", "deployments", "list"), ("apps", "statefulsets", "list"), ("apps", "replicasets", "list"),
       ("workload.serving.volcano.sh", "modelservings", "list"), ("", "nodes", "list"))
def binpack_run(p: Probe) -> str:
    """Binpack: the workloads' opt-outs (every kind listed), then the snapshot of nodes and pods."""
    try:
        run, _ = pod_deletion_costs_apply(cluster=p.cluster)
    except Exception as exc:   # noqa: BLE001 - what the run's caller (the task) records
        return f"{type(exc).__name__}: {exc}"
    return "\n".join(run.errors)


@needs(("", "namespaces", "list"))
def orgs_sync(p: Probe) -> str:
    return repr(orgs.orgs_sync(cluster=p.cluster, now=p.now))


@needs(("", "namespaces", "get"), ("", "configmaps", "get"))
def knative_lever(p: Probe) -> str:
    """What the cluster's panel says of scale to zero: the Knative version and initial scale."""
    return orgs.cluster_knative_lever(gateway=p.gateway, cluster=p.cluster, now=p.now).explain()


OWNERS = {"Deployment": "web", "StatefulSet": "db", "InferenceService": "llm", "Service": "kn", "Notebook": "nb"}


def _owner_read(kind: str):
    def probe(p: Probe) -> str:
        """The pruner re-reads an owner right before acting on it."""
        return str(prune_actions.read_owner(p.gateway, kind, p.scene.ns, OWNERS[kind])["metadata"]["name"])
    return probe


needs(("apps", "deployments", "get"))(_owner_read("Deployment"))
needs(("apps", "statefulsets", "get"))(_owner_read("StatefulSet"))
needs(("serving.kserve.io", "inferenceservices", "get"))(_owner_read("InferenceService"))
needs(("serving.knative.dev", "services", "get"))(_owner_read("Service"))
needs(("kubeflow.org", "notebooks", "get"))(_owner_read("Notebook"))


def _owner_write(kind: str, method: str, state: Callable[[dict], dict]):
    def probe(p: Probe) -> str:
        """The pruner's write of an owner, here setting what it holds now (no change if let through)."""
        owner = prune_actions.read_owner(p.gateway, kind, p.scene.ns, OWNERS[kind])
        prune_actions.write(p.gateway, kind=kind, namespace=p.scene.ns, name=OWNERS[kind], method=method,
                            state=state(owner))
        return "written"
    return probe


needs(("apps", "*/scale", "patch"))(_owner_write(
    "Deployment", prune_planning.M_SCALE, lambda o: {"replicas": o["spec"]["replicas"]}))
needs(("serving.knative.dev", "services", "patch"))(_owner_write(
    "Service", prune_planning.M_KNATIVE_MIN_SCALE,
    lambda o: {"templateAnnotations": {MIN_SCALE: o["spec"]["template"]["metadata"]["annotations"][MIN_SCALE]}}))
needs(("serving.kserve.io", "inferenceservices", "patch"))(_owner_write(
    "InferenceService", prune_planning.M_MIN_REPLICAS, lambda o: {"minReplicas": o["spec"]["predictor"]["minReplicas"]}))
needs(("kubeflow.org", "notebooks", "patch"))(_owner_write(
    "Notebook", prune_planning.M_NOTEBOOK, lambda o: {"annotations": {"capacity.test/probe": "1"}}))


@needs(("serving.kserve.io", "inferenceservices", "list"), ("serving.knative.dev", "services", "list"),
       ("serving.knative.dev", "revisions", "list"))
def runbook_registry_sync(p: Probe) -> str:
    return f"{len(runbook.registry_sync(cluster=p.cluster))} models"


_stuck = itertools.count()


@needs(("serving.kserve.io", "inferenceservices", "delete"), ("serving.knative.dev", "services", "delete"),
       ("serving.knative.dev", "configurations", "delete"))
def runbook_delete_stuck(p: Probe) -> str:
    """The runbook's delete-stuck of a model asking for a GPU no node has: the
    InferenceService, then what KServe and Knative made for it."""
    pool, name = p.scene.pool, f"stuck{next(_stuck)}"
    isvc_create(pool, name, product="NVIDIA-B200")
    p.cleanups.append(lambda: _ignore_404(lambda: pool.custom.delete_namespaced_custom_object(
        *KSERVE, pool.ns, "inferenceservices", name)))
    pool.backend.settle(lambda: pool.custom.list_namespaced_custom_object(
        *SERVING, pool.ns, "revisions", label_selector=f"serving.knative.dev/service={name}-predictor")["items"],
        what=f"{name}'s revision", seconds=SECONDS)
    runbook.registry_sync(cluster=p.cluster)
    model = ServedModel.objects.get(cluster=p.cluster, name=name)
    try:
        deleted = runbook.model_delete_stuck(model=model, actor=None)
    except Exception as exc:   # noqa: BLE001 - the admin action shows it
        return f"{type(exc).__name__}: {exc}"
    action = RunbookAction.objects.filter(action="model_delete_stuck").latest("id")
    return f"deleted {deleted}; not deleted {action.new.get('not_deleted')}; {action.error}"


@needs(("serving.knative.dev", "revisions", "delete"))
def runbook_unblock(p: Probe) -> str:
    """The runbook's unblock: a redeployed 1-GPU model's new revision waits for the GPU its
    old revision holds; the operator deletes the old revision."""
    from .test_features_runbook import isvc_ready, model_pods, synced

    pool = GpuPool(p.scene.backend, "lp-unblock")
    p.cleanups.append(pool.close)
    pool.node_add("n1", gpus=1)
    isvc_create(pool, "llm", product=None)
    old, new = "llm-predictor-00001", "llm-predictor-00002"
    pool.backend.settle(lambda: isvc_ready(pool, "llm") and pool.model_ready(old, 1), what="llm Ready",
                        seconds=SECONDS)
    runbook.model_redeploy(model=synced(p.cluster, pool, "llm"), actor=None)
    pool.backend.settle(lambda: model_pods(pool, "llm") == {old: "Running", new: "Pending"}
                        and synced(p.cluster, pool, "llm").blocked, what=f"{new} Pending, reported blocked",
                        seconds=SECONDS)
    runbook.revision_delete_old(model=synced(p.cluster, pool, "llm"), revision=old, actor=None)
    return f"{old} deleted"


def _ignore_404(call) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def _org_switch(p: Probe) -> str:
    ns = p.scene.ns
    org = Org.objects.create(slug=ns, cluster=p.cluster, namespace=ns,
                             last_activity_at=p.now - timedelta(hours=25))
    result = orgs.dormancy_sweep(now=p.now, enqueue=False)
    [(_, switch_id)] = [pair for pair in result.switches if pair[0] == org.id]
    outcome = orgs.org_scale_to_zero_apply(org_id=org.id, now=p.now, switch_id=switch_id)
    return f"{outcome.summary()} {outcome.errors}"


@needs(("autoscaling.internal.knative.dev", "podautoscalers", "patch"))
def scale_to_zero_on_knative_1_15(p: Probe) -> str:
    """An idle org's model switched to zero: on Knative <= 1.20 its PodAutoscaler is patched."""
    return _org_switch(p)


@needs(("serving.knative.dev", "revisions", "patch"))
def scale_to_zero_on_knative_1_21(p: Probe) -> str:
    """The same switch where Knative says it is 1.21: the routed Revision is patched."""
    core = p.scene.pool.core
    labels = core.read_namespace("knative-serving").metadata.labels or {}
    p.cleanups.append(lambda: core.patch_namespace("knative-serving", {"metadata": {"labels": {
        KNATIVE_VERSION_LABEL: labels.get(KNATIVE_VERSION_LABEL)}}}))
    core.patch_namespace("knative-serving", {"metadata": {"labels": {KNATIVE_VERSION_LABEL: "1.21.0"}}})
    return _org_switch(p)


def _prune(p: Probe, prometheus, pool: GpuPool, pods: list) -> str:
    """The pruner in scale-down mode over `pool`'s namespace, `pods` idle for its window."""
    from tests.prometheus_fixtures import Series, gpu_labels

    backend = pool.backend
    youngest = max(pod.metadata.creation_timestamp for pod in pods)
    backend.settle(lambda: backend.now() - youngest >= timedelta(seconds=PRUNE_WINDOW + 1),
                   what="the idle pods older than the prune window", seconds=PRUNE_WINDOW + 5)
    now = backend.now()
    moments = [now - timedelta(seconds=s) for s in range(PRUNE_WINDOW + 60, -1, -5)]
    series = [Series("DCGM_FI_DEV_GPU_UTIL", gpu_labels(pool.ns, pod.metadata.name, node=pod.spec.node_name),
                     [(m, 0.0) for m in moments]) for pod in pods]
    run = prune_run_execute(kube_gateway=p.gateway, prometheus=prometheus(series), now=now, cluster=p.cluster,
                            actor="test", params=PruneParams(run_mode="scale-down", namespace=pool.ns,
                                                             window_seconds=PRUNE_WINDOW, step_seconds=PRUNE_STEP,
                                                             max_gap_seconds=PRUNE_STEP * 2, grace_seconds=0))
    run = PruneRun.objects.get(pk=run.pk)
    return "\n".join([run.status, *run.errors, *(f"{d.owner_kind}/{d.owner_name} {d.result} {d.error}"
                                                 for d in run.decisions.all())])


@needs(("", "events", "create"))
def prune_scale_down_announced(p: Probe, prometheus) -> str:
    """An idle Deployment scaled to zero by the pruner, and the Event announcing it."""
    pool = p.scene.idle_pool
    p.cleanups.append(lambda: pool.apps.patch_namespaced_deployment_scale("idle", pool.ns, {"spec": {"replicas": 1}}))
    return _prune(p, prometheus, pool, pool.pods(app="idle"))


@needs(("kubeflow.org", "notebooks", "list"))
def prune_reads_a_listed_namespace(p: Probe, prometheus) -> str:
    """Two idle pods of one Notebook: the pruner lists their namespace's owners, Notebooks too."""
    pool = p.scene.notebook_pool
    p.cleanups.append(lambda: pool.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1", pool.ns, "notebooks", "nb",
        {"metadata": {"annotations": {"kubeflow-resource-stopped": None}}}))
    return _prune(p, prometheus, pool, pool.pods(app="nb"))


@needs(("serving.knative.dev", "revisions", "get"))
def prune_walks_a_model_pod_to_its_service(p: Probe, prometheus) -> str:
    """An idle Knative pod: the pruner walks ReplicaSet, Deployment, Revision to its Service."""
    return _prune(p, prometheus, p.scene.pool, p.scene.pool.pods(revision="kn-00001"))


PRUNE_PROBES = (prune_scale_down_announced, prune_reads_a_listed_namespace, prune_walks_a_model_pod_to_its_service)
# The pruner's probes last: the pods they judge idle grow older than its window meanwhile.
ORDERED = sorted(PAIRS, key=lambda entry: PROBES.get(entry[1]) in PRUNE_PROBES)


# --- the test -----------------------------------------------------------------------------------------
@pytest.fixture
def prometheus(tmp_path):
    from clusters.prometheus import PrometheusGateway
    from tests.prometheus_fixtures import PrometheusServer

    servers = []

    def start(series) -> PrometheusGateway:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}")
        server.backfill(series)
        servers.append(server.start())
        return PrometheusGateway(server.url)

    yield start
    for server in servers:
        server.stop()


def test_every_rule_has_a_probe():
    assert sorted(PROBES) == sorted(p for _, p in PAIRS)


def test_the_products_token_is_the_service_accounts_and_reads_no_secret(real_tier, product_identity):
    """What the feature tests run the product with: the apiserver says who the token is,
    and refuses it what deploy/ does not grant."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=product_identity.kubeconfig_path)
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review({
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == product_identity.user == \
            "system:serviceaccount:gpu-capacity:gpu-capacity"
        assert "system:masters" not in review.status.user_info.groups
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_namespaced_secret("gpu-capacity")
        assert refused.value.status == 403
    finally:
        api.close()


@pytest.mark.prometheus
@pytest.mark.parametrize("kind,pair", ORDERED, ids=["/".join(p) for _, p in ORDERED])
def test_each_rule_taken_out_fails_a_feature_with_the_apiservers_403(kind, pair, scene, product_identity, db,
                                                                     settings, prometheus):
    from clusters.kube import forget_gateways

    settings.KUBE_RETRY_ATTEMPTS = 1      # a 403 is final; nothing to retry
    forget_gateways()
    cluster = Cluster.objects.create(name="least-privilege", kubeconfig_path=product_identity.kubeconfig_path)
    backend, user = scene.backend, product_identity.user
    role = CLUSTER_ROLE if kind == "ClusterRole" else KNATIVE_ROLE
    attributes = access(role, pair, scene.ns)
    probe = Probe(cluster, scene, [])
    call = PROBES[pair]
    role_put(backend, kind, without(role, pair))
    try:
        until_authorizer_says(backend, user, False, **attributes)
        try:
            shown = call(probe, prometheus) if call in PRUNE_PROBES else call(probe)
        except Exception as exc:   # noqa: BLE001 - the error the feature surfaces is what is read
            shown = f"{type(exc).__name__}: {exc}"
    finally:
        role_put(backend, kind, role)
        until_authorizer_says(backend, user, True, **attributes)
        for cleanup in reversed(probe.cleanups):
            cleanup()
        forget_gateways()
    assert "403" in shown or "Forbidden" in shown or "forbidden" in shown, shown
    assert forbidden_sentence(user, pair).search(shown), shown
