"""Scale to zero on clusters as they are, through the real client against the simulated
cluster: the owner's floor is kept (no mass wake), a wake is never lost, a cluster without
KServe still switches its pynodes, and an unknown Knative version rolls no pod."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from clusters import discovery, kube
from clusters.errors import NotFound
from clusters.models import Cluster
from config import clock
from config.schedule import SCHEDULES
from orgs import services
from audit.models import AuditEntry
from orgs.models import DormancySwitch, Org
from orgs.planning import MIN_SCALE, OWNER_MIN_SCALE
from simcluster.generate import inference_service, namespace, node, pynode
from tests.orgs.test_safety import broker_down  # noqa: F401 - the fixture
from tests.orgs.test_services import ann, ksvc_min_scale, make_idle

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "NVIDIA-H100-80GB-HBM3"
SIMULATION = "simcluster.io/v1alpha1"


def world(*, knative_label: str | None = "1.21.0", sim_knative: str = "1.21", unserved: tuple[str, ...] = (),
          orgs: dict[str, list[dict]] | None = None, extra: tuple[dict, ...] = ()) -> list[dict]:
    docs: list[dict] = [{"apiVersion": SIMULATION, "kind": "Simulation",
                         "spec": {"knative_version": sim_knative, "unserved_groups": list(unserved)}},
                        node("cpu-0", pool="cpu", cpu="64"),
                        *[node(f"gpu-{i}", pool="gpu", product=H100, gpus=8) for i in range(2)]]
    labels = {"app.kubernetes.io/version": knative_label} if knative_label is not None else {}
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "knative-serving", "labels": labels}})
    for slug, workloads in (orgs or {}).items():
        docs += [namespace(slug, org=slug), *workloads]
    return docs + list(extra)


def running_pods(gw, ns: str, selector: str) -> list[dict]:
    return [p for p in gw.list(kube.PODS, namespace=ns, label_selector=selector)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def gpu_pods(gw) -> int:
    return sum(1 for p in gw.list(kube.PODS) if p["status"].get("phase") in ("Running", "Pending")
               and not p["metadata"].get("deletionTimestamp")
               and any("nvidia.com/gpu" in ((c.get("resources") or {}).get("requests") or {})
                       for c in p["spec"]["containers"]))


# --- the rule: the switch owns only the scaling it adds ------------------------------------------
def test_a_reconcile_of_orgs_never_applied_wakes_no_model_its_owner_let_sleep(sim_cluster_factory, capsys):
    """The mass wake: a first reconcile once set min-scale 1 on every model of every org it
    had never applied, minReplicas 0 included, audited nothing and reported '0 drift'."""
    sleepers = [inference_service("quiet", f"m{i}", product=H100, min_replicas=0) for i in range(3)]
    sim = sim_cluster_factory(world(orgs={
        "quiet": [*sleepers, inference_service("quiet", "warm", product=H100, min_replicas=1), pynode("quiet")],
        "sleepy": [inference_service("sleepy", "llm", product=H100, min_replicas=1), pynode("sleepy")]}))
    sim.advance(300)   # the min-scale 0 models went to zero with no load
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("sleepy")
    Org.objects.filter(slug="sleepy").update(dormant=True, dormant_since=clock.now())   # never applied
    before = gpu_pods(gw)
    assert before == 2, "only the two minReplicas-1 models hold a GPU"

    call_command("reconcile_scale_to_zero")
    sim.advance(120)

    for i in range(3):
        assert ann(gw, kube.REVISIONS, f"m{i}-predictor-00001", ns="quiet") == "0", "minReplicas 0 stays at 0"
    assert ann(gw, kube.REVISIONS, "warm-predictor-00001", ns="quiet") == "1"
    assert ksvc_min_scale(gw, "pynode", ns="quiet") == "1"
    assert gpu_pods(gw) <= before, "no GPU was spent by the reconcile"
    out = capsys.readouterr().out
    assert "quiet: scale to zero disabled applied (first apply): already holding, nothing patched" in out
    assert "sleepy: scale to zero enabled applied (first apply): 2 workload(s) patched" in out
    quiet, sleepy = Org.objects.get(slug="quiet"), Org.objects.get(slug="sleepy")
    assert (quiet.applied, sleepy.applied) == ("disabled", "enabled")
    assert not AuditEntry.objects.filter(org=quiet).exists(), "nothing patched, nothing to audit"
    [record] = AuditEntry.objects.filter(org=sleepy)
    assert (record.action, record.cause, record.actor) == ("scale_to_zero_applied", "reconcile: first apply", None)
    assert record.old == {"ksvc sleepy/pynode": "1", "revision sleepy/llm-predictor-00001": "1",
                          "setting": "never applied"}
    assert record.new == {"ksvc sleepy/pynode": "0", "revision sleepy/llm-predictor-00001": "0",
                          "setting": "enabled"}


def test_a_pynode_goes_back_to_its_owners_value_and_the_record_is_gone(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme", min_scale=2)]}))
    sim.advance(0)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    ksvc = gw.get(kube.KNATIVE_SERVICES, "pynode", namespace="acme")
    assert ksvc["metadata"]["annotations"][OWNER_MIN_SCALE] == "2"
    assert ksvc["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "0"

    services.org_mark_active(org_slug="acme", cause="activity")

    ksvc = gw.get(kube.KNATIVE_SERVICES, "pynode", namespace="acme")
    assert ksvc["spec"]["template"]["metadata"]["annotations"][MIN_SCALE] == "2", "not 1: the owner asked for 2"
    assert OWNER_MIN_SCALE not in (ksvc["metadata"].get("annotations") or {})
    slept, woke = DormancySwitch.objects.filter(org__slug="acme").order_by("at", "id")
    causes = list(AuditEntry.objects.filter(org__slug="acme").order_by("at", "id").values_list("action", "cause"))
    assert causes == [("scale_to_zero_applied", f"switch #{slept.id}: became dormant (dormancy sweep)"),
                      ("scale_to_zero_applied", f"switch #{woke.id}: became active (activity)")]


def test_a_pynode_its_owner_created_at_zero_while_the_org_slept_stays_asleep_after_the_wake(
        sim_cluster_factory, celery_eager, capsys):
    """Its "0" has no record of the owner's value, as a "0" written by a product from before
    values were recorded has none; but it was created after the org went to sleep, so no
    product wrote it: the wake leaves it at its owner's 0, with or without a reconcile between."""
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme")], "globex": [pynode("globex")]}))
    sim.advance(0)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    make_idle("globex")
    services.dormancy_sweep(now=clock.now())
    sim.advance(60)
    for slug in ("acme", "globex"):
        sleeper = pynode(slug, min_scale=0)
        sleeper["metadata"]["name"] = "pynode-b"
        gw.create(kube.KNATIVE_SERVICES, sleeper, namespace=slug)

    services.org_mark_active(org_slug="acme", cause="activity")   # no reconcile since it was made
    call_command("reconcile_scale_to_zero")
    services.org_mark_active(org_slug="globex", cause="activity")

    assert "ksvc globex/pynode-b: min-scale stays 0 (owner's value 0 recorded)" in capsys.readouterr().out
    for slug in ("acme", "globex"):
        assert ksvc_min_scale(gw, "pynode-b", ns=slug) == "0", f"{slug}: its owner let it sleep"
        assert ksvc_min_scale(gw, "pynode", ns=slug) == "1", f"{slug}: the org's own pynode woke"


def test_an_owner_who_raises_the_floor_while_the_org_sleeps_gets_it_back_at_the_wake(sim_cluster_factory,
                                                                                       celery_eager):
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    sim.advance(0)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    gw.patch(kube.KNATIVE_SERVICES, "pynode",
             {"spec": {"template": {"metadata": {"annotations": {MIN_SCALE: "2"}}}}}, namespace="acme")

    call_command("reconcile_scale_to_zero")
    assert ksvc_min_scale(gw, "pynode", ns="acme") == "0", "the org still sleeps"
    services.org_mark_active(org_slug="acme", cause="activity")

    assert ksvc_min_scale(gw, "pynode", ns="acme") == "2", "the owner's new floor, not the one recorded before"


# --- a wake is never lost ------------------------------------------------------------------------
def test_a_wake_the_queue_refused_says_so_and_the_retry_task_applies_it(sim_cluster_factory, celery_eager,
                                                                      broker_down, capsys):  # noqa: F811
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    sim.advance(0)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    call_command("sweep_dormancy")
    assert ksvc_min_scale(gw, "pynode") == "0"

    with pytest.raises(CommandError) as refused:
        call_command("record_activity", "acme", "--queue")

    message = str(refused.value)
    assert "\n" not in message
    assert "marked active, but the scale-to-zero disable could not be queued (OperationalError" in message
    assert "the retry task applies it within 2 minutes" in message
    assert not Org.objects.get(slug="acme").dormant, "the org row holds the intent"
    assert ksvc_min_scale(gw, "pynode") == "0", "nothing reached the cluster yet"

    # The retry leaves a fresh switch to its own queued apply for RETRY_GRACE, then applies it.
    assert services.orgs_apply_unapplied(now=clock.now()) == []
    [outcome] = services.orgs_apply_unapplied(now=clock.now() + services.RETRY_GRACE + timedelta(seconds=1))
    assert outcome.complete and outcome.cause == "retry: wanted disabled, applied enabled"
    assert ksvc_min_scale(gw, "pynode") == "1"
    assert Org.objects.get(slug="acme").applied == "disabled"
    assert services.orgs_apply_unapplied(now=clock.now() + timedelta(minutes=5)) == [], "nothing left to do"
    [retry] = [p for p in SCHEDULES if p.task == "orgs.tasks.scale_to_zero_retry"]
    assert retry.every_seconds + services.RETRY_GRACE.total_seconds() <= 120, "within two minutes of the wake"


def test_the_retry_task_repairs_a_partial_apply(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme"), inference_service("acme", "llm", product=H100)]}))
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    sim.control.set_faults(seed=0, error_rate=1.0, match={"verbs": ["patch"], "resources": ["revisions"]})
    with pytest.raises(CommandError, match=r"^1 of 1 dormant org\(s\) not fully scaled to zero .*\(switch\): 1 patched, 1 pending"):
        call_command("sweep_dormancy")
    org = Org.objects.get(slug="acme")
    assert org.dormant and org.applied == "" and org.pending == [
        "revision acme/llm-predictor-00001: 500 InternalError: simcluster injected fault: internal error"]
    assert AuditEntry.objects.get(org=org).action == "scale_to_zero_apply_incomplete"
    assert ksvc_min_scale(sim.gateway, "pynode") == "0", "what could be applied was"

    sim.control.clear_faults()
    [outcome] = services.orgs_apply_unapplied(now=clock.now() + timedelta(minutes=1))
    assert outcome.complete and outcome.cause == "retry: a partial apply"
    org.refresh_from_db()
    assert org.applied == "enabled" and org.pending == []
    assert ann(sim.gateway, kube.REVISIONS, "llm-predictor-00001") == "0"


# --- a cluster without KServe ---------------------------------------------------------------------
def test_a_group_the_cluster_does_not_serve_answers_404_page_not_found(sim_cluster_factory):
    sim = sim_cluster_factory(world(unserved=("serving.kserve.io",)))
    gw = sim.gateway
    with pytest.raises(NotFound) as missing:
        gw.list(kube.INFERENCESERVICES, namespace="default")
    assert "404 page not found" in str(missing.value)
    assert "serving.kserve.io" not in gw.api_groups()
    assert "serving.knative.dev" in gw.api_groups()


def test_without_kserve_the_sweep_scales_pynodes_to_zero_and_the_wake_brings_them_back(sim_cluster_factory,
                                                                                        capsys):
    sim = sim_cluster_factory(world(unserved=("serving.kserve.io",), orgs={"acme": [pynode("acme")]}))
    sim.advance(60)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    assert len(running_pods(gw, "acme", "serving.knative.dev/service=pynode")) == 1
    make_idle("acme")

    call_command("sweep_dormancy")   # exits 0: nothing raised
    sim.advance(300)

    out = capsys.readouterr().out
    assert "acme: scale to zero enabled applied (switch): 1 workload(s) patched" in out
    assert "KServe is not served on this cluster: no models to switch" in out
    assert ksvc_min_scale(gw, "pynode") == "0"
    assert running_pods(gw, "acme", "serving.knative.dev/service=pynode") == [], "scaled to zero"
    org = Org.objects.get(slug="acme")
    assert org.dormant and org.applied == "enabled" and org.pending == [] and org.last_error == ""
    cluster = Cluster.objects.get(id=sim.cluster.id)
    assert "serving.kserve.io" not in cluster.api_groups and "serving.knative.dev" in cluster.api_groups

    call_command("record_activity", "acme")
    sim.advance(60)

    assert "acme: activity recorded; it was dormant and is awake: scale to zero disabled applied (switch)" in capsys.readouterr().out
    assert ksvc_min_scale(gw, "pynode") == "1"
    assert len(running_pods(gw, "acme", "serving.knative.dev/service=pynode")) == 1, "back"
    call_command("reconcile_scale_to_zero")
    assert "acme: scale to zero disabled applied (holding)" in capsys.readouterr().out


def test_a_group_uninstalled_after_discovery_is_found_out_at_its_first_404(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    discovery.cluster_discovery_refresh(cluster=sim.cluster, now=clock.now())
    assert "serving.kserve.io" in Cluster.objects.get(id=sim.cluster.id).api_groups
    sim.sim.settings.unserved_groups.append("serving.kserve.io")   # KServe removed meanwhile
    make_idle("acme")

    services.dormancy_sweep(now=clock.now())

    org = Org.objects.get(slug="acme")
    assert org.applied == "enabled" and org.pending == []
    assert "serving.kserve.io" not in Cluster.objects.get(id=sim.cluster.id).api_groups
    assert ksvc_min_scale(sim.gateway, "pynode") == "0"


# --- an unknown Knative version -------------------------------------------------------------------
def _model_state(gw, ns="acme"):
    pods = gw.list(kube.PODS, namespace=ns, label_selector="serving.knative.dev/revision=llm-predictor-00001")
    sets = gw.list(kube.REPLICASETS, namespace=ns, label_selector="serving.knative.dev/revision=llm-predictor-00001")
    return sorted(p["metadata"]["uid"] for p in pods), sorted(r["metadata"]["name"] for r in sets)


def test_with_a_devel_version_label_a_dormancy_switch_replaces_no_running_pod(sim_cluster_factory, celery_eager):
    """Upstream's source manifests label knative-serving `devel`; the Knative underneath is
    1.15, where a Revision patch rolls the Deployment and a PodAutoscaler patch holds."""
    sim = sim_cluster_factory(world(knative_label="devel", sim_knative="1.15", orgs={
        "acme": [inference_service("acme", "llm", product=H100, min_replicas=1), pynode("acme")]}))
    sim.advance(60)
    gw = sim.gateway
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    pods, replicasets = _model_state(gw)
    assert len(pods) == 1 and len(replicasets) == 1
    make_idle("acme")

    services.dormancy_sweep(now=clock.now())
    sim.advance(5)

    assert ann(gw, kube.PODAUTOSCALERS, "llm-predictor-00001") == "0"
    assert ann(gw, kube.REVISIONS, "llm-predictor-00001") == "1", "the Revision is not patched on a guess"
    assert _model_state(gw) == (pods, replicasets), "the same pod, the same ReplicaSet"
    cluster = Cluster.objects.get(id=sim.cluster.id)
    assert cluster.knative_lever == "podautoscaler-patch"
    assert "Knative version unknown (namespace label app.kubernetes.io/version='devel'" in cluster.knative_lever_reason
    assert "replaces no pod" in cluster.knative_lever_reason
    assert "podautoscaler-patch (Knative unknown)" in Org.objects.get(slug="acme").mechanism

    services.org_mark_active(org_slug="acme", cause="activity")
    sim.advance(5)

    assert ann(gw, kube.PODAUTOSCALERS, "llm-predictor-00001") == "1"
    assert _model_state(gw) == (pods, replicasets), "woken without a restart either"


def test_the_version_is_read_from_the_controller_image_when_the_label_says_devel(sim_cluster_factory):
    controller = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "controller", "namespace": "knative-serving"},
                  "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "controller"}},
                           "template": {"metadata": {"labels": {"app": "controller"}}, "spec": {"containers": [
                               {"name": "controller",
                                "image": "gcr.io/knative-releases/knative.dev/serving/cmd/controller:v1.15.2"}]}}}}
    sim = sim_cluster_factory(world(knative_label="devel", extra=(controller,)))
    stated = discovery.knative_version_read(sim.gateway)
    assert (stated.version, stated.source) == ("v1.15.2", "image tag of Deployment knative-serving/controller")


@pytest.mark.parametrize(("image", "tag"), [
    ("gcr.io/knative-releases/knative.dev/serving/cmd/controller:v1.15.2", "v1.15.2"),
    ("gcr.io/knative-releases/knative.dev/serving/cmd/controller@sha256:0123abcd", ""),
    ("registry:5000/serving/controller", ""),
    ("registry:5000/serving/controller:1.16.0@sha256:0123", "1.16.0"),
])
def test_image_tags(image, tag):
    assert discovery.image_tag(image) == tag


# --- what the panel and the schedule show -------------------------------------------------------
def test_the_panel_shows_the_partial_state_the_lever_and_the_groups_found(sim_cluster_factory, celery_eager, client):
    from django.contrib.auth.models import User

    sim = sim_cluster_factory(world(knative_label="devel", sim_knative="1.15", unserved=("serving.kserve.io",),
                                    orgs={"acme": [pynode("acme")]}))
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    make_idle("acme")
    sim.control.set_faults(seed=0, error_rate=1.0, match={"verbs": ["patch"]})
    services.dormancy_sweep(now=clock.now())
    client.force_login(User.objects.create_superuser("root", password="pw"))

    org_page = client.get(f"/admin/orgs/org/{Org.objects.get(slug='acme').id}/change/").content.decode()
    assert "partial: enabled not yet on 1 part(s), retried every minute" in org_page
    assert "podautoscaler-patch: Knative version unknown" in org_page
    cluster_page = client.get(f"/admin/clusters/cluster/{sim.cluster.id}/change/").content.decode()
    assert "KServe: not served" in cluster_page and "Knative Serving: served (v1)" in cluster_page
    assert "replaces no pod" in cluster_page


def test_the_discovery_task_records_each_clusters_groups(sim_cluster_factory):
    from clusters.tasks import discovery_refresh_all, discovery_refresh_cluster

    sim = sim_cluster_factory(world(unserved=("serving.kserve.io", "kubeflow.org")))
    assert discovery_refresh_all() == 1, "one task per cluster"
    found = discovery_refresh_cluster(sim.cluster.id)
    assert "serving.kserve.io" not in found and "serving.knative.dev" in found
    row = Cluster.objects.get(id=sim.cluster.id)
    assert row.api_groups_seen_at is not None and row.api_groups_error == ""
    assert [p for p in SCHEDULES if p.task == "clusters.tasks.discovery_refresh_all"][0].every_seconds == 300


def test_a_scenario_may_not_hold_objects_of_a_group_it_does_not_serve(sim_cluster_factory):
    from simcluster.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="InferenceService is in API group 'serving.kserve.io', which this "
                                            "scenario's Simulation says is not served"):
        sim_cluster_factory(world(unserved=("serving.kserve.io",),
                                  orgs={"acme": [inference_service("acme", "llm", product=H100)]}))


def test_the_activity_api_says_when_a_wake_could_not_be_queued(sim_cluster_factory, celery_eager, client,
                                                              redis_cache, broker_down):  # noqa: F811
    from django.contrib.auth.models import Permission, User

    from orgs.tokens import activity_token_issue

    sim = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    Org.objects.filter(slug="acme").update(dormant=True, applied="enabled")
    user = User.objects.create_user("model-gateway")
    user.user_permissions.add(Permission.objects.get(codename="record_activity"))
    token = activity_token_issue(caller="model-gateway", user=user, actor=None, now=clock.now())

    body = client.post("/api/orgs/acme/activity", HTTP_AUTHORIZATION=f"Bearer {token}").json()

    assert body["recorded"] and body["woke"]
    assert "could not be queued" in body["message"] and "within 2 minutes" in body["message"]
    assert not Org.objects.get(slug="acme").dormant
