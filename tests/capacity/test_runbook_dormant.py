"""The runbook's redeploy of a model its dormant org keeps at zero, in the admin, on the
simulated cluster through the real client (it models a new revision's initial scale, the
allow-zero-initial-scale flag, min-scale and the autoscaler's scale to zero).

A pynode the org holds at min-scale "0" keeps that "0" on its new revision: where the
cluster allows a zero initial scale the redeploy carries the switch's initial-scale "0"
too, so the new revision starts no pod, and the org's wake gives the owner's values back.
Where it does not, one pod starts and Knative's autoscaler ends it once idle. A model
(InferenceService) gets its owner's minReplicas on every new revision, so it runs a pod
until the org's scale-to-zero reconcile sets the new revision to "0", allowed or not.
The confirmation and the message say which, naming the org; an awake model is unchanged.
"""
from __future__ import annotations

from datetime import timedelta
from html import unescape

import kubernetes
import pytest
from django.contrib import messages as levels
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from audit.models import AuditEntry
from capacity.runbook.models import RunbookAction, ServedModel
from capacity.runbook import services
from clusters import kube
from clusters.labels import INITIAL_SCALE, MIN_SCALE, OWNER_INITIAL_SCALE, OWNER_MIN_SCALE, REDEPLOY_ANNOTATION
from orgs import services as orgs_services
from orgs import tasks as orgs_tasks
from orgs.models import DormancySwitch, Org

from test_runbook_admin import NS, confirmation, operator, scenario

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/capacity/servedmodel/"
KN = ("serving.knative.dev", "v1")
KSERVE = ("serving.kserve.io", "v1beta1")


class World:
    """The runbook's one-GPU cluster (a model and a pynode of org acme), the org's switch as
    the hourly sweep makes it, and what an operator checks with the official client."""

    def __init__(self, handle):
        self.handle = handle
        self.cluster = handle.cluster
        self.api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.crd = kubernetes.client.CustomObjectsApi(self.api)
        self.org = Org.objects.create(slug="acme", cluster=self.cluster, namespace=NS)

    def now(self):
        return self.handle.sim.clock.now()

    def advance(self, seconds: float) -> None:
        self.handle.advance(seconds)

    def allow_zero_initial_scale(self, value: str) -> None:
        self.core.patch_namespaced_config_map("config-autoscaler", "knative-serving",
                                              {"data": {"allow-zero-initial-scale": value}})

    def sleep(self) -> None:
        """The org idle past ORGS_DORMANT_AFTER: the sweep marks it dormant and its switch is
        applied; its workloads then scale to zero."""
        Org.objects.filter(pk=self.org.pk).update(last_activity_at=self.now() - timedelta(days=3))
        result = orgs_services.dormancy_sweep(now=self.now(), enqueue=False)
        [(_, switch_id)] = result.switches
        assert orgs_services.org_scale_to_zero_apply(org_id=self.org.pk, now=self.now(), switch_id=switch_id).complete
        self.advance(600)
        assert self.pods() == {}, "the org's workloads did not scale to zero"

    def wake(self) -> None:
        """Activity: the org wakes and its switch back is applied, as the queued task does."""
        assert orgs_services.org_mark_active(org_slug="acme", cause="activity", at=self.now(), enqueue=False).woke
        switch = DormancySwitch.objects.filter(org=self.org).order_by("-id").first()
        outcome = orgs_services.org_scale_to_zero_apply(org_id=self.org.pk, now=self.now(), switch_id=switch.id)
        assert outcome.complete, outcome.summary()

    def model(self, kind: str) -> ServedModel:
        services.registry_sync(cluster=self.cluster)
        return ServedModel.objects.get(cluster=self.cluster, kind=kind)

    def pods(self) -> dict[str, int]:
        """Live pods by revision, pynode and model alike."""
        found: dict[str, int] = {}
        for pod in self.core.list_namespaced_pod(NS).items:
            if not pod.metadata.deletion_timestamp:
                revision = pod.metadata.labels["serving.knative.dev/revision"]
                found[revision] = found.get(revision, 0) + 1
        return found

    def revisions(self, service: str) -> list[str]:
        items = self.crd.list_namespaced_custom_object(*KN, NS, "revisions")["items"]
        return sorted(r["metadata"]["name"] for r in items
                      if r["metadata"]["labels"].get("serving.knative.dev/service") == service)

    def pynode(self) -> dict:
        return self.crd.get_namespaced_custom_object(*KN, NS, "services", "pynode")

    def template(self) -> dict:
        return self.pynode()["spec"]["template"]["metadata"].get("annotations") or {}


@pytest.fixture
def world(sim_cluster_factory):
    w = World(sim_cluster_factory(scenario()))
    w.advance(120)
    yield w
    w.api.close()


def redeploy(client, model: ServedModel) -> tuple[str, list[tuple[int, str]]]:
    """The operator's redeploy in the panel: the confirmation page's text, then what the
    panel says after its button is pressed (level, message)."""
    page = client.post(CHANGELIST, {"action": "redeploy", "_selected_action": [model.pk]})
    done = client.post(CHANGELIST, confirmation(page), follow=True)
    return unescape(page.content.decode()), [(m.level, str(m)) for m in done.context["messages"]]


def test_where_zero_initial_scale_is_allowed_a_sleeping_pynode_is_redeployed_without_a_pod_and_wakes_with_its_org(
        world, client):
    world.allow_zero_initial_scale("false")      # the org slept before the cluster allowed a zero initial scale
    world.sleep()
    assert INITIAL_SCALE not in world.template() and world.template()[MIN_SCALE] == "0"
    world.allow_zero_initial_scale("true")
    pynode = world.model("pynode")
    before = world.revisions("pynode")
    operator(client, "redeploy_servedmodel")

    page, said = redeploy(client, pynode)

    assert f"{NS}/pynode on {world.cluster} (pynode): org acme is dormant since " in page
    assert "it keeps pynode org-acme/pynode at zero until it wakes. Redeployed, its new revision starts no pod " \
           "(knative-serving/config-autoscaler allows a zero initial scale (allow-zero-initial-scale: 'true'); " \
           "initial-scale 0 set with the stamp, as the org's switch sets it): it stays asleep" in page
    assert "Some of these models are" not in page                     # no pod starts: no warning
    [(level, message)] = said
    assert level == levels.SUCCESS
    assert message.startswith(f"{NS}/pynode: redeployed asleep: org acme is dormant since ")
    assert "its new revision starts no pod" in message and "it stays asleep" in message

    world.advance(120)
    after = world.revisions("pynode")
    assert len(after) == len(before) + 1, "one new revision"
    assert world.pods() == {}, "the redeploy woke the pynode"
    assert world.template()[INITIAL_SCALE] == "0"
    assert world.pynode()["metadata"]["annotations"][OWNER_INITIAL_SCALE] == ""      # its owner set none
    row = RunbookAction.objects.get(action="model_redeploy")
    assert row.state == "done"
    assert (row.old[INITIAL_SCALE], row.old[OWNER_INITIAL_SCALE]) == (None, None)
    assert (row.new[INITIAL_SCALE], row.new[OWNER_INITIAL_SCALE]) == ("0", "")
    entry = AuditEntry.objects.get(app="runbook", action="model_redeploy")
    assert entry.new[INITIAL_SCALE] == "0" and entry.old[INITIAL_SCALE] is None
    assert entry.new["org_keeps_at_zero"].startswith("org acme is dormant since ")

    # The same patch sent again changes nothing: no other revision, still no pod.
    world.handle.gateway.patch(kube.KNATIVE_SERVICES, "pynode", {
        "spec": {"template": {"metadata": {"annotations": {REDEPLOY_ANNOTATION: row.new[REDEPLOY_ANNOTATION],
                                                           INITIAL_SCALE: "0"}}}},
        "metadata": {"annotations": {OWNER_INITIAL_SCALE: ""}}}, namespace=NS)
    world.advance(60)
    assert world.revisions("pynode") == after and world.pods() == {}

    # The org's reconcile finds nothing to repair: the redeploy left the switch's state as it was.
    outcome = orgs_services.orgs_reconcile(now=world.now(), cluster=world.cluster).outcomes[0]
    assert (outcome.kind, outcome.drift, outcome.patched) == ("holding", [], [])

    # The org's wake gives the owner's template back (min-scale 1, no initial scale of its
    # own), and the pynode runs its owner's floor on the new revision.
    world.wake()
    assert world.template()[MIN_SCALE] == "1" and INITIAL_SCALE not in world.template()
    assert not {OWNER_MIN_SCALE, OWNER_INITIAL_SCALE} & set(world.pynode()["metadata"].get("annotations") or {})
    world.advance(120)
    (newest,) = set(world.revisions("pynode")) - set(after)
    assert world.pods() == {newest: 1, "zq86d3o-predictor-00001": 1}


def test_without_zero_initial_scale_the_confirmation_names_the_org_and_the_pod_that_starts(world, client):
    world.allow_zero_initial_scale("false")
    world.sleep()
    pynode = world.model("pynode")
    operator(client, "redeploy_servedmodel")

    page, said = redeploy(client, pynode)

    assert f"{NS}/pynode on {world.cluster} (pynode): org acme is dormant since " in page
    effect = ("its new revision starts 1 pod(s) (the cluster's initial-scale; initial-scale 0 is not set, as Knative "
              "refuses it without allow-zero-initial-scale: \"true\": knative-serving/config-autoscaler sets "
              "allow-zero-initial-scale: 'false'); its min-scale stays 0, so Knative's autoscaler ends it once it gets "
              "no requests")
    assert effect in page
    assert "kept at zero by their dormant org and redeploying starts pods for them" in page
    [(level, message)] = said
    assert level == levels.WARNING
    assert message.startswith(f"{NS}/pynode: redeploy started, and it wakes for a while: org acme is dormant since ")
    assert message.endswith(effect)
    assert INITIAL_SCALE not in world.template()
    assert INITIAL_SCALE not in RunbookAction.objects.get(action="model_redeploy").new

    # What it said: one pod of the new revision, ended by the autoscaler with no reconcile.
    world.advance(5)
    (newest,) = [r for r in world.pods()]
    assert world.pods() == {newest: 1} and newest.startswith("pynode-")
    world.advance(180)
    assert world.pods() == {}


def queued(monkeypatch) -> list[tuple]:
    """What the redeploy queues (task name, args, kwargs, countdown), run by the test as a
    worker would once its countdown is up."""
    sent: list[tuple] = []
    monkeypatch.setattr(services, "task_send", lambda name, *, args=(), kwargs=None, countdown=None, **_: sent.append(
        (name, tuple(args), kwargs or {}, countdown)))
    return sent


@pytest.mark.parametrize("allowed", ["true", "false"])
def test_a_sleeping_model_wakes_until_its_orgs_scale_to_zero_is_applied_again_whatever_the_initial_scale(
        world, client, monkeypatch, allowed):
    world.allow_zero_initial_scale(allowed)
    world.sleep()
    # The reconcile's interval as an operator retuned it in the admin is the one said.
    task = PeriodicTask.objects.get(name="orgs: scale-to-zero reconcile")
    task.interval, _ = IntervalSchedule.objects.get_or_create(every=15, period=IntervalSchedule.MINUTES)
    task.save()
    model = world.model("InferenceService")
    ops = operator(client, "redeploy_servedmodel")
    sent = queued(monkeypatch)

    page, said = redeploy(client, model)

    assert f"{NS}/zq86d3o on {world.cluster} (InferenceService): org acme is dormant since " in page
    effect = ("its new revision starts 1 pod(s) (min-scale 1: the owner's minReplicas, which KServe gives every new "
              "revision; the org's 0 is on the old one) and keeps them until the org's scale to zero, applied again "
              "60 s after this redeploy, sets it to min-scale 0 (or else the org's scale-to-zero reconcile sets it to "
              "min-scale 0 (within 900 s: the schedule \"orgs: scale-to-zero reconcile\" runs every 900 s)); "
              "Knative's autoscaler then ends them once they get no requests")
    assert effect in page
    [(level, message)] = said
    assert level == levels.WARNING and message.endswith(effect)
    isvc = world.crd.get_namespaced_custom_object(*KSERVE, NS, "inferenceservices", "zq86d3o")
    assert INITIAL_SCALE not in isvc["metadata"]["annotations"]       # it would not keep the model asleep
    cause = f"after the runbook's redeploy of {model} by {ops}, which woke it"
    assert sent == [("orgs.tasks.org_scale_to_zero_apply", (world.org.pk,), {"cause": cause}, 60)]

    # What it said: the new revision's pod runs until the queued apply, then goes.
    world.advance(60)
    assert world.pods() == {"zq86d3o-predictor-00002": 1}
    (name, args, kwargs, _), = sent
    assert orgs_tasks.org_scale_to_zero_apply.apply(args=args, kwargs=kwargs).get()["patched"] == [
        f"podautoscaler {NS}/zq86d3o-predictor-00002: min-scale 1 → 0"]
    (repair,) = AuditEntry.objects.filter(app="orgs", action="scale_to_zero_drift_repaired")
    assert repair.cause == cause and repair.new == {f"podautoscaler {NS}/zq86d3o-predictor-00002": "0"}
    world.advance(300)
    assert world.pods() == {}


def test_a_redeploy_whose_reapply_cannot_be_queued_says_the_reconcile_brings_it_back(world, client, monkeypatch):
    world.sleep()
    model = world.model("InferenceService")
    operator(client, "redeploy_servedmodel")

    def broker_down(*args, **kwargs):
        raise ConnectionError("redis: connection refused")

    monkeypatch.setattr(services, "task_send", broker_down)
    _, said = redeploy(client, model)

    [(level, message)] = said
    assert level == levels.WARNING and "applied again" not in message
    assert message.endswith("keeps them until the org's scale-to-zero reconcile sets it to min-scale 0 (within 600 s: "
                            "the schedule \"orgs: scale-to-zero reconcile\" runs every 600 s); Knative's autoscaler "
                            "then ends them once they get no requests")
    assert RunbookAction.objects.get(action="model_redeploy").state == RunbookAction.State.DONE


def test_an_awake_models_redeploy_is_unchanged(world, client):
    world.allow_zero_initial_scale("true")
    pynode = world.model("pynode")
    operator(client, "redeploy_servedmodel")

    page, said = redeploy(client, pynode)

    assert f"{NS}/pynode on {world.cluster} (pynode): a new revision rolls out, then the old one is retired</li>" \
        in page and "dormant" not in page
    assert said == [(levels.SUCCESS, f"{NS}/pynode: redeploy started (a new revision rolls out)")]
    assert INITIAL_SCALE not in world.template()
    assert set(RunbookAction.objects.get(action="model_redeploy").new) == {REDEPLOY_ANNOTATION, "kind"}
    world.advance(60)
    assert sum(n for rev, n in world.pods().items() if rev.startswith("pynode-")) == 1
