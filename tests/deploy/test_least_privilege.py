"""Least privilege, proven: every feature runs with the token of the `deploy/`
ServiceAccount under the `deploy/` ClusterRole, and each (verb, resource) pair taken out
of that role breaks some feature with 403 Forbidden.

Each feature gets its own simulated cluster holding the ClusterRole, its binding and the
ServiceAccount (token in its `simcluster.io/token` annotation). A second `Cluster` row
points at a kubeconfig with that token: the product's services only ever see that row or
its gateway. The admin kubeconfig (group system:masters) sets the scene and checks the
outcome with the official client, as an operator would.
"""
from __future__ import annotations

import copy
import itertools
from datetime import timedelta
from pathlib import Path

import kubernetes
import pytest
import yaml

from capacity.defrag import services as defrag
from capacity.binpack.services import pod_deletion_costs_apply
from capacity.defrag.models import JobState
from capacity.binpack.models import BinpackRun
from capacity.runbook.models import ServedModel
from capacity.runbook import services as runbook
from clusters import kube
from clusters.models import Cluster
from config import clock
from orgs import services as orgs
from orgs.models import Org
from simcluster.api.auth import rule_allows
from simcluster.generate import inference_service, namespace, node, pynode, resources
from simcluster.kubeconfig import write_kubeconfig

pytestmark = pytest.mark.django_db

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOKEN = "least-privilege-test-token"
H100, A10G = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A10G"
UTIL = "simcluster.io/gpu-utilization"


# --- the deploy/ RBAC documents ------------------------------------------------------------------
def rbac_documents() -> dict[str, dict]:
    docs = [d for path in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")}
    assert set(by_kind) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}, "deploy/ lacks RBAC documents"
    return by_kind


def rule_pairs(role: dict) -> list[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every combination the role's rules grant."""
    return sorted({(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]})


def without(role: dict, pair: tuple[str, str, str]) -> dict:
    """The role with exactly one (group, resource, verb) taken out, everything else kept."""
    group, resource, verb = pair
    rules = []
    for rule in role["rules"]:
        for g, r in itertools.product(rule["apiGroups"], rule["resources"]):
            verbs = [v for v in rule["verbs"] if (g, r, v) != pair]
            if verbs:
                rules.append({"apiGroups": [g], "resources": [r], "verbs": verbs})
    slim = copy.deepcopy(role)
    slim["rules"] = rules
    assert pair not in rule_pairs(slim) and len(rule_pairs(slim)) == len(rule_pairs(role)) - 1
    return slim


# --- a simulated cluster with the product's identity -------------------------------------------
class World:
    def __init__(self, handle, tmp_path, role):
        self.handle = handle
        self.api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.apps = kubernetes.client.AppsV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        sa_config = tmp_path / f"kubeconfig-sa-{handle.cluster.name}"
        write_kubeconfig(sa_config, handle.url, token=TOKEN)
        # The product's view: a Cluster row whose kubeconfig carries the ServiceAccount's token.
        self.cluster = Cluster.objects.create(name=f"sa-{handle.cluster.name}", kubeconfig_path=str(sa_config))
        sa = rbac_documents()["ServiceAccount"]["metadata"]
        self.user = f"system:serviceaccount:{sa['namespace']}:{sa['name']}"

    @property
    def gateway(self) -> kube.KubeGateway:
        return kube.gateway_for(self.cluster)

    @property
    def sim(self):
        return self.handle.sim

    def now(self):
        return self.sim.clock.now()

    def advance(self, seconds: float):
        self.handle.advance(seconds)
        return self.now()

    def denials(self) -> list:
        """What the simulated cluster refused the product (authorizer Attributes)."""
        return [d.attributes for d in self.handle.server.app.auth.denials if d.user == self.user]

    def close(self):
        self.api.close()


@pytest.fixture
def make_world(sim_cluster_factory, tmp_path, settings):
    settings.KUBE_RETRY_ATTEMPTS = 2
    worlds: list[World] = []

    def make(objects: list[dict], role: dict, settle: float = 60.0) -> World:
        docs = rbac_documents()
        sa = copy.deepcopy(docs["ServiceAccount"])
        sa["metadata"].setdefault("annotations", {})["simcluster.io/token"] = TOKEN
        rbac = [namespace(sa["metadata"]["namespace"]), sa, role, docs["ClusterRoleBinding"]]
        world = World(sim_cluster_factory(rbac + objects), tmp_path, role)
        worlds.append(world)
        world.advance(settle)
        return world

    make.worlds = worlds
    yield make
    for world in worlds:
        world.close()


# --- the features ------------------------------------------------------------------------------------
def gpu_nodes(n: int, product: str = H100, gpus: int = 8) -> list[dict]:
    nodes = [node(f"gpu-{i}", pool="gpu", product=product, gpus=gpus) for i in range(n)]
    for doc in nodes:   # a partial nodeInfo does not parse in the official client's models
        doc["status"].pop("nodeInfo", None)
    return nodes


def knative_service(name: str, ns: str, *, min_scale: int, util: str | None = None, product: str = H100) -> dict:
    annotations = {"autoscaling.knative.dev/min-scale": str(min_scale), "autoscaling.knative.dev/max-scale": "10"}
    if util is not None:
        annotations[UTIL] = util
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"template": {"metadata": {"annotations": annotations}, "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": product},
                "containers": [{"name": "main", "image": "registry.example.com/model:1",
                                "resources": resources(cpu="1", memory="1Gi", gpus=1)}]}}}}


def feature_sweep_and_scale_to_zero(make_world, role):
    """orgs: sync, dormancy sweep, scale to zero on Knative 1.21 (Revision) and 1.20 (PodAutoscaler)."""
    world = make_world([node("cpu-0", pool="cpu", cpu="64"), *gpu_nodes(1),
                        {**namespace("knative-serving"), "metadata": {"name": "knative-serving", "labels": {
                            "app.kubernetes.io/version": "1.21"}}},
                        namespace("org-sleepy", org="sleepy"), pynode("org-sleepy"),
                        inference_service("org-sleepy", "llm", product=H100),
                        namespace("org-old", org="old"), inference_service("org-old", "old-llm", product=H100)],
                       role, settle=120)
    orgs.orgs_sync(cluster=world.cluster, now=clock.now())
    Org.objects.filter(cluster=world.cluster).update(last_activity_at=clock.now() - timedelta(hours=30))
    assert orgs.dormancy_sweep(now=clock.now()).switched == ("old", "sleepy")

    outcome = orgs.org_scale_to_zero_apply(org_id=Org.objects.get(slug="sleepy").id)
    assert outcome.errors == [] and outcome.patched, outcome
    ksvc = world.custom.get_namespaced_custom_object("serving.knative.dev", "v1", "org-sleepy", "services", "pynode")
    assert ksvc["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"

    # The same product on an older Knative patches the PodAutoscaler directly.
    world.core.patch_namespace("knative-serving", {"metadata": {"labels": {"app.kubernetes.io/version": "1.20"}}})
    outcome = orgs.org_scale_to_zero_apply(org_id=Org.objects.get(slug="old").id)
    assert outcome.errors == [] and outcome.patched, outcome
    assert any("podautoscaler" in p.lower() or "pa" in p.lower() for p in outcome.patched), outcome.patched


def feature_binpack(make_world, role):
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve", "namespace": "team"},
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}}, "template": {
                      "metadata": {"labels": {"app": "serve"}},
                      "spec": {"containers": [{"name": "main", "image": "model:1",
                                               "resources": resources(cpu="1", memory="1Gi", gpus=1)}]}}}}
    world = make_world([*gpu_nodes(2), namespace("team"), deployment], role)
    run, plan = pod_deletion_costs_apply(cluster=world.cluster, trigger=BinpackRun.Trigger.SCHEDULE)
    assert not run.errors, run.errors
    costs = [(p.metadata.annotations or {}).get("controller.kubernetes.io/pod-deletion-cost")
             for p in world.core.list_namespaced_pod("team").items]
    assert any(c is not None for c in costs), (costs, plan)


def feature_runbook(make_world, role):
    ns = "org-acme"
    world = make_world([node("gpu-a10g-00", pool="a10g", product=A10G, gpus=1, cpu="32", memory="127532Mi"),
                        node("cpu-00", pool="cpu", cpu="64", memory="257000Mi"), namespace(ns, org="acme"),
                        inference_service(ns, "zq86d3o", product=A10G, gpus=1, min_replicas=1, max_replicas=1),
                        pynode(ns)], role, settle=120)
    Org.objects.create(slug="acme", cluster=world.cluster, namespace=ns)
    runbook.registry_sync(cluster=world.cluster)
    model = ServedModel.objects.get(cluster=world.cluster, name="zq86d3o")
    runbook.model_redeploy(model=model, actor=None)                       # patches the InferenceService
    runbook.model_redeploy(model=ServedModel.objects.get(cluster=world.cluster, kind="pynode"), actor=None)
    world.advance(60)
    runbook.registry_sync(cluster=world.cluster)
    model.refresh_from_db()
    (blocked,) = model.blocked
    runbook.revision_delete_old(model=model, revision=blocked["old_revision"], actor=None)
    revs = world.custom.list_namespaced_custom_object("serving.knative.dev", "v1", ns, "revisions")["items"]
    assert blocked["old_revision"] not in {r["metadata"]["name"] for r in revs}

    world.custom.create_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices",
                                                 inference_service(ns, "stuck", product="NVIDIA-B200"))
    world.advance(60)
    runbook.registry_sync(cluster=world.cluster)
    deleted = runbook.model_delete_stuck(model=ServedModel.objects.get(cluster=world.cluster, name="stuck"),
                                         actor=None)
    assert {"InferenceService/stuck", "Service/stuck-predictor", "Configuration/stuck-predictor"} <= set(deleted), \
        deleted
    assert any(d.startswith("Revision/stuck-predictor-") for d in deleted), deleted


def _run_until(world, job, states, *, dt=1.0, max_steps=200):
    for _ in range(max_steps):
        job = defrag.defrag_job_step(job=job, gateway=world.gateway, now=world.now())
        if job.state in states:
            return job
        if job.state == JobState.FAILED:
            raise AssertionError(f"defrag job failed: {job.error}")
        # A job retries a refused step on its next pass, up to its time limit: the first
        # refusal is already the feature failing, so stop here instead of stepping it out.
        if world.denials():
            raise AssertionError(f"defrag job {job.state}: the cluster refused {world.denials()}")
        world.advance(dt)
    raise AssertionError(f"job stuck in {job.state}: {job.log[-5:]} {job.error}")


def _job(world, node_name):
    plan = defrag.defrag_discover(cluster=world.cluster, node_name=node_name, gateway=world.gateway)
    return defrag.defrag_job_start(cluster=world.cluster, node_name=node_name, plan=plan, now=world.now(),
                                   enqueue=False, poll_interval_seconds=2.0)


def feature_defrag_to_drain(make_world, role):
    """capacity: a job to safe, a wait on the KPA (watch), drain with node deletion; a second job aborted."""
    ns = "org-a"
    world = make_world([*gpu_nodes(4), namespace(ns), knative_service("bt", ns, min_scale=3),
                        knative_service("other", ns, min_scale=2)], role)
    by_node: dict[str, set[str]] = {}
    for pod in world.core.list_namespaced_pod(ns).items:
        by_node.setdefault(pod.spec.node_name, set()).add(pod.metadata.labels["serving.knative.dev/service"])
    drained = next(n for n, s in sorted(by_node.items()) if s == {"bt"} or s == {"other"})
    job = _run_until(world, _job(world, drained), {JobState.SAFE})
    defrag.defrag_job_wait(job=job, gateway=world.gateway, timeout_seconds=1)   # list + watch PodAutoscalers
    job = defrag.defrag_job_drain(job=job, actor=None, delete_node=True, now=world.now(), enqueue=False)
    job = _run_until(world, job, {JobState.DRAINED}, dt=5)
    assert drained not in [n.metadata.name for n in world.core.list_node().items]
    assert world.core.list_namespaced_event(ns).items, "defrag records Events"

    aborted = next(n for n in sorted(by_node) if n != drained and n in
                   [x.metadata.name for x in world.core.list_node().items])
    job = _run_until(world, _job(world, aborted), {JobState.WAITING}, dt=0)
    [orphan] = job.orphans.all()[:1] or [None]
    job = defrag.defrag_job_abort(job=job, actor=None, now=world.now(), enqueue=False)
    job = _run_until(world, job, {JobState.ABORTED}, dt=2)
    assert not world.core.read_node(aborted).spec.unschedulable
    if orphan is not None:
        names = [p.metadata.name for p in world.core.list_namespaced_pod(orphan.namespace).items]
        assert orphan.pod_name not in names


def feature_prune_scale_down(make_world, role, tmp_path):
    """pruning: every owner kind scaled to zero with Events, through Prometheus history."""
    from tests.prometheus_fixtures import PrometheusServer, parse_exposition

    from clusters.prometheus import PrometheusGateway
    from pruning.services import PruneParams, prune_run_execute

    ns = "team-a"

    def template(name):
        return {"metadata": {"labels": {"app": name}, "annotations": {UTIL: "0"}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.product": A10G},
                         "containers": [{"name": "main", "image": "registry.example.com/model:1",
                                         "resources": resources(cpu="1", memory="1Gi", gpus=1)}]}}

    def workload(kind, name, api="apps/v1"):
        spec = {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template(name)}
        if kind == "StatefulSet":
            spec["serviceName"] = name
        return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec}

    world = make_world([*gpu_nodes(2, product=A10G), namespace(ns),
                        {**namespace("kserve"), "metadata": {"name": "kserve", "labels": {
                            "app.kubernetes.io/version": "0.15"}}},
                        workload("Deployment", "web"), workload("ReplicaSet", "bare"), workload("StatefulSet", "db"),
                        {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": "nb", "namespace": ns},
                         "spec": {"template": template("nb")}},
                        inference_service(ns, "llm", product=A10G, utilization="0"),
                        knative_service("kn", ns, min_scale=1, util="0", product=A10G)], role, settle=30)
    history: dict = {}
    for minute in range(41):
        import urllib.request
        with urllib.request.urlopen(world.handle.url + "/metrics", timeout=10) as response:
            parse_exposition(response.read().decode(), world.now(), history)
        if minute < 40:
            world.advance(60)
    server = PrometheusServer(tmp_path / f"prom-{world.cluster.name}")
    server.backfill([s for s in history.values() if s.samples])
    server.start()
    try:
        run = prune_run_execute(kube_gateway=world.gateway, prometheus=PrometheusGateway(server.url),
                                now=world.now(), params=PruneParams(run_mode="scale-down"), actor="test",
                                cluster=world.cluster)
    finally:
        server.stop()
    acted = {(d.owner_kind, d.owner_name) for d in run.decisions.all() if d.result == "succeeded"}
    assert acted == {("Deployment", "web"), ("ReplicaSet", "bare"), ("StatefulSet", "db"), ("Notebook", "nb"),
                     ("InferenceService", "llm"), ("Service", "kn")}, \
        [(d.owner_kind, d.owner_name, d.result, d.reason, d.error) for d in run.decisions.all()]
    assert run.status == "succeeded" and run.failed == 0
    assert all(d.event_sent for d in run.decisions.all() if d.result == "succeeded"), \
        [(d.owner_name, d.error) for d in run.decisions.all()]
    assert world.apps.read_namespaced_deployment("web", ns).spec.replicas == 0


def feature_campaign(make_world, role):
    """capacity: a campaign cordons its nodes, checks each node's budgets (PodDisruptionBudgets
    among them) before its defrag job starts, and ends with every planned node safe."""
    from capacity.campaigns.models import LIVE_CAMPAIGN_STATES, CampaignState
    from capacity.campaigns.selectors import campaign_plan_read
    from capacity.campaigns.services import campaign_start, campaign_step
    from capacity.defrag.models import LIVE_STATES, DefragJob

    ns = "org-c"
    world = make_world([*gpu_nodes(3), namespace(ns), *(knative_service(f"m{i}", ns, min_scale=1) for i in range(3))],
                       role)
    plan = campaign_plan_read(cluster=world.cluster, selector={"nvidia.com/gpu.product": H100}, goal=1,
                              gateway=world.gateway, now=world.now())
    assert plan.freed == 1, plan.report_lines()
    campaign = campaign_start(cluster=world.cluster, plan=plan, actor=None, max_in_flight=1, gateway=world.gateway,
                              now=world.now(), enqueue=False)
    for _ in range(200):
        campaign = campaign_step(campaign=campaign, gateway=world.gateway, now=world.now(), enqueue=False)
        for job in DefragJob.objects.filter(campaign_nodes__campaign=campaign, state__in=LIVE_STATES):
            defrag.defrag_job_step(job=job, gateway=world.gateway, now=world.now())
        if world.denials():
            raise AssertionError(f"campaign {campaign.state}: the cluster refused {world.denials()}")
        if campaign.state not in LIVE_CAMPAIGN_STATES:
            break
        world.advance(2)
    assert campaign.state == CampaignState.DONE, (campaign.state, campaign.error)
    assert [n.state for n in campaign.nodes.filter(role="freed")] == ["safe"], campaign.error


FEATURES = {
    "binpack": lambda mk, role, tmp: feature_binpack(mk, role),
    "sweep": lambda mk, role, tmp: feature_sweep_and_scale_to_zero(mk, role),
    "runbook": lambda mk, role, tmp: feature_runbook(mk, role),
    "defrag": lambda mk, role, tmp: feature_defrag_to_drain(mk, role),
    "prune": feature_prune_scale_down,
    "campaign": lambda mk, role, tmp: feature_campaign(mk, role),
}


@pytest.mark.slow
@pytest.mark.parametrize("feature", list(FEATURES))
def test_every_feature_works_with_the_deploy_service_account(feature, make_world, tmp_path):
    FEATURES[feature](make_world, rbac_documents()["ClusterRole"], tmp_path)


PAIRS = rule_pairs(rbac_documents()["ClusterRole"])


def test_the_cluster_role_names_scale_eviction_and_events_and_nothing_wild():
    assert ("apps", "*/scale", "patch") in PAIRS
    assert ("", "pods/eviction", "create") in PAIRS
    assert ("", "events", "create") in PAIRS
    assert not [p for p in PAIRS if "*" in (p[0], p[2]) or p[1] == "*"]
    assert not [p for p in PAIRS if p[1] in ("secrets", "configmaps")]   # the product reads no secrets


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=["/".join(p) for p in PAIRS])
def test_each_rule_taken_out_breaks_a_feature_with_forbidden(pair, make_world, tmp_path):
    role = without(rbac_documents()["ClusterRole"], pair)
    failures = {}
    for name, feature in FEATURES.items():
        before = len(failures)
        try:
            feature(make_world, role, tmp_path)
        except Exception as exc:   # noqa: BLE001 - Forbidden itself, or the outcome it prevented
            failures[name] = f"{type(exc).__name__}: {exc}"
        if len(failures) > before:
            break
    denied = [a for w in make_world.worlds for a in w.denials()]
    assert failures, f"no feature failed without {pair}: the rule is not needed"
    removed = {"apiGroups": [pair[0]], "resources": [pair[1]], "verbs": [pair[2]]}
    assert any(rule_allows(removed, a) for a in denied), f"{failures} but the cluster refused only {denied}"

