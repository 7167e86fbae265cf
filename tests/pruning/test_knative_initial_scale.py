"""A Knative Service scaled to zero by the pruner, and Knative's initial scale.

Setting min-scale "0" on a Service's template makes a new Revision, which starts
`initial-scale` pods (1 by default): a GPU pod started only to be stopped again. Where
`knative-serving/config-autoscaler` allows a zero initial scale, the prune sets
initial-scale "0" in the same write (the new Revision starts no pod) and restore puts back
exactly the initial-scale the owner had; where it does not (or the ConfigMap cannot be
read), only min-scale is written and every message says that a pod starts, and why.
End to end: the simulated cluster (it models a new revision's initial scale and the flag,
not Knative's webhook refusal of a "0" without it), a real Prometheus, the database.
"""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from kubernetes import client as k8s

from audit.models import AuditEntry
from clusters.errors import Forbidden, Unavailable
from clusters.knative import INITIAL_SCALE_UNKNOWN, initial_scale_from_config
from clusters.kube import KubeGateway
from clusters.labels import INITIAL_SCALE, INITIAL_SCALE_LEGACY, MIN_SCALE, MIN_SCALE_LEGACY
from clusters.models import Cluster
from pruning import actions, planning
from pruning.models import PruneDecision, PruneRun
from pruning.services import PruneParams, decision_settle, prune_decision_restore, prune_run_execute

from pruning_world import World, deployment, knative_service

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]

NS = "team-c"
KN = ("serving.knative.dev", "v1")
ALLOWED = {"allow-zero-initial-scale": "true"}


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        yield w


def ksvc_with(name: str, *, initial: str | None = None, key: str = INITIAL_SCALE) -> dict:
    obj = knative_service(name, NS, util="0")
    if initial is not None:
        obj["spec"]["template"]["metadata"]["annotations"][key] = initial
    return obj


def autoscaler_config(world: World, data: dict | None) -> None:
    """config-autoscaler's data as given; None: no such ConfigMap. The simulated install
    creates it again (empty) at the next step of its clock, after the run has read it."""
    core = k8s.CoreV1Api(world.api)
    if data is None:
        core.delete_namespaced_config_map("config-autoscaler", "knative-serving")
    else:
        core.patch_namespaced_config_map("config-autoscaler", "knative-serving", {"data": data})


def template(world: World, name: str) -> dict:
    ksvc = k8s.CustomObjectsApi(world.api).get_namespaced_custom_object(*KN, NS, "services", name)
    return ksvc["spec"]["template"]["metadata"].get("annotations") or {}


def pods_of(world: World, revision: str) -> list[str]:
    pods = k8s.CoreV1Api(world.api).list_namespaced_pod(
        NS, label_selector=f"serving.knative.dev/revision={revision}").items
    return [p.metadata.name for p in pods if not p.metadata.deletion_timestamp]


def scale_down(world: World, gateway: KubeGateway | None = None, **params) -> PruneRun:
    return prune_run_execute(kube_gateway=gateway or world.gateway, prometheus=world.prometheus(), now=world.now(),
                             params=PruneParams(run_mode="scale-down", **params), actor="test")


def pruned(world: World, obj: dict, config: dict | None) -> PruneRun:
    """`obj` created idle, 40 minutes of history, config-autoscaler's data as given, then a
    scale-down run."""
    world.create(obj)
    world.record_history(minutes=40)
    autoscaler_config(world, config)
    return scale_down(world)


def acted(run: PruneRun, name: str = "kn") -> PruneDecision:
    return run.decisions.get(owner_name=name, result="succeeded")


def event_message(world: World, name: str, reason: str) -> str:
    events = k8s.CoreV1Api(world.api).list_namespaced_event(NS).items
    return next(e.message for e in events if e.reason == reason and e.involved_object.name == name)


# --- the words, pure ---------------------------------------------------------------------------
@pytest.mark.parametrize(("config", "error", "zero", "words"), [
    (ALLOWED, "", True, ["set to min-scale 0 and initial-scale 0 (its new revision starts no pod: "
                         "knative-serving/config-autoscaler allows a zero initial scale "
                         "(allow-zero-initial-scale: 'true'))"]),
    ({"allow-zero-initial-scale": "false", "initial-scale": "2"}, "", False,
     ["its new revision starts 2 pod(s) (the cluster's initial-scale)", "initial-scale \"0\" is not set",
      "sets allow-zero-initial-scale: 'false'"]),
    ({}, "", False, ["starts 1 pod(s) (the cluster's initial-scale)", "has no allow-zero-initial-scale"]),
    (None, "", False, ["starts 1 pod(s)", "no knative-serving/config-autoscaler (Knative's defaults)"]),
    (None, "403 Forbidden: configmaps", False,
     ["starts the cluster's initial scale of pods (1 by default)", "could not be read (403 Forbidden: configmaps)"]),
])
def test_the_effect_and_the_note_say_whether_a_pod_starts_and_why(config, error, zero, words):
    initial = initial_scale_from_config(config=config, error=error)
    assert initial.zero_allowed is zero
    effect = planning.knative_min_scale_effect(initial, zero_initial=zero, template={MIN_SCALE: "1"})
    for word in words:
        assert word in effect, effect
    note = planning.knative_initial_scale_note(initial)
    assert note.startswith(initial.cause + ": ")
    assert ("starts no pod" in note) is zero and ("starts its initial-scale pods" in note) is not zero


def test_a_template_that_sets_its_own_initial_scale_starts_that_many():
    initial = initial_scale_from_config(config={})
    for key in (INITIAL_SCALE, INITIAL_SCALE_LEGACY):
        effect = planning.knative_min_scale_effect(initial, zero_initial=False, template={key: "3"})
        assert "its new revision starts 3 pod(s) (its template's initial-scale)" in effect
    # A "0" the flag does not allow counts for nothing (Knative's GetInitialScale): the cluster's.
    effect = planning.knative_min_scale_effect(initial, zero_initial=False, template={INITIAL_SCALE: "0"})
    assert "starts 1 pod(s) (the cluster's initial-scale)" in effect
    # Not read (no Knative Service in the run, or a row from before): the method's own description.
    assert planning.knative_min_scale_effect(INITIAL_SCALE_UNKNOWN, zero_initial=False) == \
        planning.EFFECT[planning.M_KNATIVE_MIN_SCALE]


# --- allowed: one write, both "0", no pod; restore gives back exactly what the owner had --------
@pytest.mark.parametrize("owner_initial", [None, "2"])
def test_where_allowed_the_new_revision_starts_no_pod_and_restore_gives_back_the_owners(world, owner_initial):
    run = pruned(world, ksvc_with("kn", initial=owner_initial), ALLOWED)

    d = acted(run)
    assert run.status == "succeeded" and not run.errors
    # What an operator finds on the Service: both annotations "0" in its template…
    annotations = template(world, "kn")
    assert (annotations[MIN_SCALE], annotations[INITIAL_SCALE]) == ("0", "0")
    assert (d.restore_state, d.applied_state) == (
        {"templateAnnotations": {MIN_SCALE: "1", INITIAL_SCALE: owner_initial}},
        {"templateAnnotations": {MIN_SCALE: "0", INITIAL_SCALE: "0"}})
    # …and its new revision with no pod, while the idle one's pod goes once it is unrouted.
    world.control.advance(10)
    k8s.CustomObjectsApi(world.api).get_namespaced_custom_object(*KN, NS, "revisions", "kn-00002")   # it exists
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment("kn-00002-deployment", NS).spec.replicas == 0
    assert pods_of(world, "kn-00002") == []
    world.control.advance(120)
    assert pods_of(world, "kn-00001") == [] and pods_of(world, "kn-00002") == []
    # config-autoscaler was read once in the pass.
    assert world.gateway.calls[("get", "configmaps")] == 1
    # Said as done: the run, the decision and the Event on the Service.
    assert run.notes == [planning.knative_initial_scale_note(initial_scale_from_config(config=ALLOWED))]
    assert "also gets initial-scale \"0\" in the same write, so its new revision starts no pod" in run.notes[0]
    assert d.effect.startswith("set to min-scale 0 and initial-scale 0 (its new revision starts no pod: "
                               "knative-serving/config-autoscaler allows a zero initial scale")
    assert "set to min-scale 0 and initial-scale 0 (its new revision starts no pod" in \
        event_message(world, "kn", "GPUIdleScaledToZero")
    # The audit row of the write shows the initial-scale change.
    entry = AuditEntry.objects.get(app="pruning", action="workload_scale_to_zero", target=f"Service {NS}/kn")
    assert (entry.old, entry.new, entry.actor_label) == (d.restore_state, d.applied_state, "test")
    # A settle (a worker that died around the write) finds it applied, initial-scale included.
    assert actions.settle(world.gateway, kind="Service", namespace=NS, name="kn", method=d.method,
                          restore_state=d.restore_state, applied_state=d.applied_state, uid=d.owner_uid)[1] == \
        actions.APPLIED

    assert prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice",
                                  now=world.now()).restore == "restored"

    annotations = template(world, "kn")
    assert annotations[MIN_SCALE] == "1" and annotations.get(INITIAL_SCALE) == owner_initial
    if owner_initial is None:
        assert INITIAL_SCALE not in annotations     # absent, as the owner had it: not "" nor "1"
    restored = AuditEntry.objects.get(app="pruning", action="workload_restore", target=f"Service {NS}/kn")
    assert (restored.old, restored.new, restored.actor_label) == (d.applied_state, d.restore_state, "alice")
    # The owner's Service runs again at its own floor: its next revision has its pod.
    world.control.advance(30)
    assert len(pods_of(world, "kn-00003")) >= 1


def test_a_template_spelling_initial_scale_the_old_way_gets_the_zero_under_that_key(world):
    d = acted(pruned(world, ksvc_with("kn", initial="2", key=INITIAL_SCALE_LEGACY), ALLOWED))
    annotations = template(world, "kn")
    assert annotations[INITIAL_SCALE_LEGACY] == "0" and INITIAL_SCALE not in annotations   # one key, not two
    assert d.restore_state == {"templateAnnotations": {MIN_SCALE: "1", INITIAL_SCALE_LEGACY: "2"}}
    prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())
    annotations = template(world, "kn")
    assert (annotations[MIN_SCALE], annotations[INITIAL_SCALE_LEGACY]) == ("1", "2")
    assert INITIAL_SCALE not in annotations


def legacy_min_scale(name: str, value: str) -> dict:
    obj = ksvc_with(name)
    annotations = obj["spec"]["template"]["metadata"]["annotations"]
    annotations[MIN_SCALE_LEGACY] = annotations.pop(MIN_SCALE) if value == "keep" else value
    annotations.pop(MIN_SCALE, None)
    return obj


def test_a_template_spelling_min_scale_the_old_way_is_scaled_and_restored_under_that_key(world):
    # Knative refuses both spellings of a key on one object: the write goes to the owner's own.
    d = acted(pruned(world, legacy_min_scale("kn", "1"), ALLOWED))
    annotations = template(world, "kn")
    assert (annotations[MIN_SCALE_LEGACY], annotations[INITIAL_SCALE]) == ("0", "0") and MIN_SCALE not in annotations
    assert d.restore_state == {"templateAnnotations": {MIN_SCALE_LEGACY: "1", INITIAL_SCALE: None}}
    assert prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice",
                                  now=world.now()).restore == "restored"
    annotations = template(world, "kn")
    assert annotations[MIN_SCALE_LEGACY] == "1" and MIN_SCALE not in annotations and INITIAL_SCALE not in annotations


def test_restore_leaves_a_service_whose_initial_scale_changed_since_alone(world):
    d = acted(pruned(world, ksvc_with("kn"), ALLOWED))
    # The owner keeps min-scale "0" but wants one pod at each new revision again.
    k8s.CustomObjectsApi(world.api).patch_namespaced_custom_object(*KN, NS, "services", "kn", {
        "spec": {"template": {"metadata": {"annotations": {INITIAL_SCALE: "1"}}}}})

    d = prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())

    assert d.restore == "changed" and "not what the prune set" in d.error
    annotations = template(world, "kn")
    assert (annotations[MIN_SCALE], annotations[INITIAL_SCALE]) == ("0", "1")   # left as the owner made it
    assert not AuditEntry.objects.filter(action="workload_restore").exists()


# --- not allowed: min-scale only, and every message says a pod starts -------------------------
@pytest.mark.parametrize(("data", "why"), [
    (None, "no knative-serving/config-autoscaler (Knative's defaults)"),
    ({}, "knative-serving/config-autoscaler has no allow-zero-initial-scale"),
    ({"allow-zero-initial-scale": "false"}, "knative-serving/config-autoscaler sets allow-zero-initial-scale: "
                                            "'false'"),
])
def test_without_the_flag_only_min_scale_is_written_and_the_messages_say_a_pod_starts(world, data, why):
    run = pruned(world, ksvc_with("kn"), data)

    d = acted(run)
    assert run.status == "succeeded" and not run.errors
    annotations = template(world, "kn")
    assert annotations[MIN_SCALE] == "0" and INITIAL_SCALE not in annotations   # Knative would refuse a "0"
    assert (d.restore_state, d.applied_state) == ({"templateAnnotations": {MIN_SCALE: "1"}},
                                                  {"templateAnnotations": {MIN_SCALE: "0"}})
    assert run.notes[0].startswith(why + ": a Knative Service the pruner sets to min-scale 0 gets a new revision "
                                         "that starts its initial-scale pods (1, the cluster's")
    said = f"set to min-scale 0 (its new revision starts 1 pod(s) (the cluster's initial-scale) and goes to zero"
    assert d.effect.startswith(said) and d.effect.endswith(f": {why})")
    assert said in event_message(world, "kn", "GPUIdleScaledToZero")
    # As said: the new revision starts a pod.
    world.control.advance(10)
    assert len(pods_of(world, "kn-00002")) == 1
    entry = AuditEntry.objects.get(action="workload_scale_to_zero", target=f"Service {NS}/kn")
    assert (entry.old, entry.new) == ({"templateAnnotations": {MIN_SCALE: "1"}},
                                      {"templateAnnotations": {MIN_SCALE: "0"}})
    prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())
    assert template(world, "kn")[MIN_SCALE] == "1" and INITIAL_SCALE not in template(world, "kn")


# --- unreadable: reported, never fatal ---------------------------------------------------------
class ConfigMapRefused(KubeGateway):
    """A gateway without permission on config-autoscaler (or whose read goes unanswered)."""

    error: Exception = Forbidden("configmaps \"config-autoscaler\" is forbidden")

    def get(self, resource, name, **kwargs):
        if resource.name == "configmaps":
            raise self.error
        return super().get(resource, name, **kwargs)


@pytest.mark.parametrize("error", [
    Forbidden("configmaps \"config-autoscaler\" is forbidden: User \"pruner\" cannot get resource "
              "\"configmaps\" in the namespace \"knative-serving\""),
    Unavailable("no answer from the API server", code=0),
])
def test_an_unreadable_config_map_is_said_in_the_run_and_the_prune_goes_on_without_the_zero(world, error):
    world.create(ksvc_with("kn"))
    world.create(ksvc_with("kn2"))
    world.create(deployment("web", "team-a", util="0"))
    world.record_history(minutes=40)
    autoscaler_config(world, ALLOWED)   # allowed, but this worker cannot see it
    gateway = ConfigMapRefused.from_kubeconfig(world.kubeconfig)
    gateway.error = error
    try:
        run = scale_down(world, gateway)
    finally:
        gateway.close()

    assert run.status == "succeeded" and run.acted == 3 and not run.errors
    assert run.notes == [planning.knative_initial_scale_note(initial_scale_from_config(config=None,
                                                                                       error=str(error)))]
    assert f"knative-serving/config-autoscaler could not be read ({error})" in run.notes[0]
    for name in ("kn", "kn2"):
        d = acted(run, name)
        assert d.applied_state == {"templateAnnotations": {MIN_SCALE: "0"}}
        assert "starts the cluster's initial scale of pods (1 by default)" in d.effect
        assert f"could not be read ({error})" in d.effect
        assert INITIAL_SCALE not in template(world, name)
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment_scale("web", "team-a").spec.replicas == 0


def test_a_pass_without_a_knative_service_to_prune_reads_no_config_map(world):
    world.create(deployment("web", "team-a", util="0"))
    world.create(ksvc_with("kept"))
    world.record_history(minutes=40)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down", owner_kinds=("Deployment",)))
    assert run.acted == 1 and run.notes == []
    assert world.gateway.calls[("get", "configmaps")] == 0
    assert run.decisions.get(owner_name="web").effect == "scaled to zero"


# --- a run recorded before initial-scale was written restores as it always did ------------------
def test_a_run_recorded_before_restores_min_scale_alone(world):
    world.create(ksvc_with("kn", initial="2"))
    world.record_history(minutes=40)
    autoscaler_config(world, {})
    d = acted(scale_down(world))
    # The row as the pruner wrote it before: min-scale alone in both states, no effect kept.
    assert (d.restore_state, d.applied_state) == ({"templateAnnotations": {MIN_SCALE: "1"}},
                                                  {"templateAnnotations": {MIN_SCALE: "0"}})
    PruneDecision.objects.filter(pk=d.pk).update(effect="")
    PruneRun.objects.filter(pk=d.run_id).update(notes=[])
    d.refresh_from_db()
    # Since then the cluster allows a zero initial scale: the restore still touches min-scale only.
    autoscaler_config(world, ALLOWED)
    assert actions.settle(world.gateway, kind="Service", namespace=NS, name="kn", method=d.method,
                          restore_state=d.restore_state, applied_state=d.applied_state, uid=d.owner_uid)[1] == \
        actions.APPLIED

    d = prune_decision_restore(kube_gateway=world.gateway, decision=d, actor="alice", now=world.now())

    assert d.restore == "restored"
    annotations = template(world, "kn")
    assert (annotations[MIN_SCALE], annotations[INITIAL_SCALE]) == ("1", "2")   # the owner's, untouched
    entry = AuditEntry.objects.get(action="workload_restore", target=f"Service {NS}/kn")
    assert (entry.old, entry.new) == ({"templateAnnotations": {MIN_SCALE: "0"}},
                                      {"templateAnnotations": {MIN_SCALE: "1"}})


def test_an_acting_row_of_a_run_recorded_before_settles_from_min_scale_alone(world):
    run = pruned(world, ksvc_with("kn", initial="0"), ALLOWED)
    d = acted(run)
    # An old row left `acting` by a dead worker: min-scale alone recorded.
    PruneDecision.objects.filter(pk=d.pk).update(
        result="acting", effect="", restore_state={"templateAnnotations": {MIN_SCALE: "1"}},
        applied_state={"templateAnnotations": {MIN_SCALE: "0"}})
    d.refresh_from_db()
    assert decision_settle(world.gateway, d, run=run, now=world.now(), cause="re-checked")
    d.refresh_from_db()
    assert d.result == "succeeded"


# --- what the operator reads: the command and the panel -------------------------------------------
@pytest.mark.parametrize(("data", "line", "note"), [
    (ALLOWED, "would be set to min-scale 0 and initial-scale 0 (its new revision starts no pod: "
              "knative-serving/config-autoscaler allows a zero initial scale",
     "note: knative-serving/config-autoscaler allows a zero initial scale (allow-zero-initial-scale: 'true'): "
     "a Knative Service the pruner sets to min-scale 0 also gets initial-scale \"0\""),
    ({"allow-zero-initial-scale": "false"},
     "would be set to min-scale 0 (its new revision starts 1 pod(s) (the cluster's initial-scale)",
     "note: knative-serving/config-autoscaler sets allow-zero-initial-scale: 'false': a Knative Service the "
     "pruner sets to min-scale 0 gets a new revision that starts its initial-scale pods"),
])
def test_the_command_and_the_panel_say_whether_a_pod_starts(world, admin_client, data, line, note):
    world.create(ksvc_with("kn"))
    world.record_history(minutes=40)
    autoscaler_config(world, data)
    prom = world.prometheus()
    Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig, prometheus_url=prom.url)
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--at", world.now().isoformat(), stdout=out)
    text = out.getvalue()
    assert f"-> Service/kn: {line}" in text, text
    assert note in text, text
    assert template(world, "kn")[MIN_SCALE] == "1"   # a dry run writes nothing

    run = PruneRun.objects.get()
    page = admin_client.get(f"/admin/pruning/prunerun/{run.pk}/change/").content.decode()
    from django.utils.html import escape
    assert escape(note.removeprefix("note: ")) in page
    assert escape(line.removeprefix("would be ")) in page
