"""The power-draw threshold (both DCGM label schemes; no power data is never idle) and the
owner-kind filter, end to end: simulated cluster, real Prometheus, database, the CLI."""
from __future__ import annotations

import io
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client as k8s
from tests.prometheus_fixtures import Series, to_exported_scheme

from clusters.models import Cluster
from pruning.models import PruneRun
from pruning.services import PruneParamError, PruneParams, prune_run_execute

from pruning_world import World, deployment, statefulset

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus]

# Watts each pod's GPU drew throughout the window, as the DCGM exporter reports it
# (DCGM_FI_DEV_POWER_USAGE carries the same labels as the utilization series of its GPU).
DRAW = {"hot": 240.0, "cool": 62.0, "db": 58.0}


def with_power(series: list[Series]) -> list[Series]:
    out = list(series)
    for s in series:
        if s.metric != "DCGM_FI_DEV_GPU_UTIL":
            continue
        prefix = next((p for p in DRAW if s.labels.get("pod", "").startswith(p + "-")), None)
        if prefix:   # "nopower-…" pods get no power series: an exporter without the field
            out.append(Series("DCGM_FI_DEV_POWER_USAGE", dict(s.labels), [(t, DRAW[prefix]) for t, _ in s.samples]))
    return out


@pytest.fixture
def world(tmp_path, prometheus_factory):
    with World.start(tmp_path) as w:
        w.prometheus_factory = prometheus_factory
        w.create(deployment("hot", "team-a", util="0"))       # 0 % utilization, yet drawing 240 W
        w.create(deployment("cool", "team-a", util="0"))      # idle by both
        w.create(deployment("nopower", "team-b", util="0"))   # idle, but no power data
        w.create(statefulset("db", "team-b", util="0"))
        w.record_history(minutes=40)
        yield w


def decisions(run: PruneRun) -> dict[str, tuple[str, str]]:
    return {d.owner_name or d.pod.rsplit("-", 2)[0]: (d.decision, d.reason) for d in run.decisions.all()}


@pytest.mark.parametrize("scheme", ["pod", "exported"])
def test_a_gpu_drawing_power_is_not_idle_and_one_without_power_data_is_skipped(world, scheme):
    transform = with_power if scheme == "pod" else (lambda s: to_exported_scheme(with_power(s)))
    prom = world.prometheus(transform=transform)
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=prom, now=world.now(),
                            params=PruneParams(run_mode="scale-down", power_threshold_watts=100,
                                               label_scheme=scheme))
    got = decisions(run)
    assert got == {"cool": ("prune", "idle"), "db": ("prune", "idle"),
                   "nopower": ("skip", "missing-power-data")}
    assert (run.pods_seen, run.busy_pods) == (4, 1)   # "hot" counted busy by its draw
    apps = k8s.AppsV1Api(world.api)
    assert apps.read_namespaced_deployment_scale("hot", "team-a").spec.replicas == 1
    assert apps.read_namespaced_deployment_scale("nopower", "team-b").spec.replicas == 1
    assert apps.read_namespaced_deployment_scale("cool", "team-a").spec.replicas == 0


def test_pods_drawing_power_or_without_power_data_are_not_looked_up():
    from datetime import datetime, timezone

    from pruning.planning import ClusterView, PruneSettings, plan_prune, pods_to_look_up
    from pruning.query import GpuSeries

    def gpu(pod, gpu, watts, util=0.0):
        return GpuSeries("a", pod, gpu, "A10G", "n1", util, True, watts)

    series = [gpu("two", "G1", 60.0), gpu("two", "G2", 180.0),   # one GPU of two drawing: busy
              gpu("dark", "G3", None), gpu("idle", "G4", 99.9), gpu("edge", "G5", 100.0)]
    s = PruneSettings(power_threshold_watts=100.0)
    assert pods_to_look_up(series, s) == {("a", "idle"), ("a", "edge")}   # more than the threshold is busy
    plan = plan_prune(series=series, view=ClusterView({}, {}), settings=s, now=datetime.now(timezone.utc),
                      pods_seen=9)
    assert {(d.pod, d.reason) for d in plan.decisions} == {("dark", "missing-power-data"), ("idle", "pod-not-found"),
                                                          ("edge", "pod-not-found")}
    assert (plan.pods_seen, plan.busy) == (9, 6)   # 5 never came back from Prometheus, "two" drew power


def test_without_a_threshold_power_is_not_looked_at(world):
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=with_power),
                            now=world.now(), params=PruneParams())
    assert {k: v[0] for k, v in decisions(run).items()} == {"hot": "prune", "cool": "prune", "nopower": "prune",
                                                           "db": "prune"}
    assert "DCGM_FI_DEV_POWER_USAGE" not in run.query


def test_the_owner_kind_filter_acts_on_the_kinds_named_and_says_why_it_left_the_rest(world):
    run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(), now=world.now(),
                            params=PruneParams(run_mode="scale-down", owner_kinds=("statefulset",)))
    got = decisions(run)
    assert got["db"] == ("prune", "idle")
    assert {got[n] for n in ("hot", "cool", "nopower")} == {("skip", "owner-kind-not-selected")}
    run.refresh_from_db()
    assert run.parameters["owner_kinds"] == ["StatefulSet"]
    assert k8s.AppsV1Api(world.api).read_namespaced_stateful_set("db", "team-b").spec.replicas == 0
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment_scale("cool", "team-a").spec.replicas == 1


def test_the_cli_takes_the_power_threshold_and_the_owner_kinds(world):
    prom = world.prometheus(transform=with_power)
    Cluster.objects.create(name="sim", kubeconfig_path=world.kubeconfig, prometheus_url=prom.url)
    out = io.StringIO()
    call_command("prune", "--cluster", "sim", "--power-threshold", "100", "--owner-kinds", "Deployment",
                 "--at", world.now().isoformat(), stdout=out)
    text = out.getvalue()
    assert "team-a/cool" in text and "would scale to zero (idle)" in text
    assert "skip (missing-power-data)" in text and "skip (owner-kind-not-selected)" in text
    assert "team-a/hot" not in text
    run = PruneRun.objects.get()
    assert run.parameters["power_threshold_watts"] == 100.0 and run.parameters["owner_kinds"] == ["Deployment"]


@pytest.mark.parametrize("args,message", [
    (["--power-threshold", "nan"], "--power-threshold: the power threshold is a number of watts in (0, 10000], got nan"),
    (["--power-threshold", "inf"], "--power-threshold: the power threshold is a number of watts"),
    (["--power-threshold", "-5"], "--power-threshold: the power threshold is a number of watts"),
    (["--power-threshold", "0"], "--power-threshold: the power threshold is a number of watts"),
    (["--power-threshold", "1e9"], "--power-threshold: the power threshold is a number of watts"),
    (["--owner-kinds", "Pod"], "--owner-kinds: unknown owner kind 'Pod'; the pruner acts on Deployment"),
    (["--owner-kinds", " , "], "--owner-kinds: unknown owner kind ''"),
    (["--owner-kinds", ""], "--owner-kinds: is empty"),
    (["--prometheus-ca-file", ""], "--prometheus-ca-file: is empty"),
    (["--prometheus-ca-file", "/nonexistent/ca.pem"],
     "--prometheus-ca-file: Prometheus CA file '/nonexistent/ca.pem' does not exist or is not a file"),
    (["--prometheus-ca-file", "/etc/hostname"], "--prometheus-ca-file: Prometheus CA file '/etc/hostname' holds no"),
    (["--prometheus-ca-file", "/etc/hostname", "--insecure-skip-tls-verify"], "exclude each other"),
])
def test_bad_new_flags_are_named_and_nothing_starts(args, message):
    Cluster.objects.create(name="sim", kubeconfig_path="/nonexistent/kubeconfig",
                           prometheus_url="https://127.0.0.1:9")
    with pytest.raises(CommandError) as caught:
        call_command("prune", "--cluster", "sim", "-r", "scale-down", *args)
    assert message in str(caught.value)
    assert not PruneRun.objects.exists()


@pytest.mark.parametrize("setting,value,message", [
    ("PRUNER_POWER_THRESHOLD_WATTS", float("nan"), "PRUNER_POWER_THRESHOLD_WATTS: the power threshold"),
    ("PRUNER_POWER_THRESHOLD_WATTS", float("inf"), "PRUNER_POWER_THRESHOLD_WATTS: the power threshold"),
    ("PRUNER_POWER_THRESHOLD_WATTS", -1.0, "PRUNER_POWER_THRESHOLD_WATTS: the power threshold"),
    ("PRUNER_OWNER_KINDS", ["Deployment", "CronJob"], "PRUNER_OWNER_KINDS: unknown owner kind 'CronJob'"),
])
def test_bad_new_settings_name_the_setting(settings, setting, value, message):
    setattr(settings, setting, value)
    with pytest.raises(PruneParamError, match=message):
        PruneParams.from_settings()


def test_settings_set_the_power_threshold_and_owner_kinds(settings):
    settings.PRUNER_POWER_THRESHOLD_WATTS = 90.0
    settings.PRUNER_OWNER_KINDS = ["inferenceservice", "ksvc"]
    params = PruneParams.from_settings()
    assert params.power_threshold_watts == 90.0 and params.owner_kinds == ("InferenceService", "KnativeService")


@contextmanager
def late_and_steady(tmp_path, prometheus_factory):
    """Two idle one-pod Deployments, "late" and "steady", in team-a, with 40 minutes of history."""
    with World.start(tmp_path) as world:
        world.prometheus_factory = prometheus_factory
        world.create(deployment("late", "team-a", util="0"))
        world.create(deployment("steady", "team-a", util="0"))
        world.record_history(minutes=40)
        yield world


def test_power_data_that_does_not_cover_the_window_is_missing_power_data(tmp_path, prometheus_factory):
    # "late" has power samples for the last 12 s of the window only: a low reading there says
    # nothing of the 30 minutes before. "steady" has them throughout.
    with late_and_steady(tmp_path, prometheus_factory) as world:
        end = world.now()

        def power(series):
            out = list(series)
            for s in series:
                pod = s.labels.get("pod", "")
                if s.metric == "DCGM_FI_DEV_GPU_UTIL" and pod.startswith(("late-", "steady-")):
                    samples = [(t, 40.0) for t, _ in s.samples]
                    if pod.startswith("late-"):
                        samples = [(end - timedelta(seconds=12), 40.0), (end, 40.0)]
                    out.append(Series("DCGM_FI_DEV_POWER_USAGE", dict(s.labels), samples))
            return out

        run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=power),
                                now=end, params=PruneParams(run_mode="scale-down", power_threshold_watts=100))
        assert decisions(run) == {"late": ("skip", "missing-power-data"), "steady": ("prune", "idle")}
        apps = k8s.AppsV1Api(world.api)
        assert apps.read_namespaced_deployment_scale("late", "team-a").spec.replicas == 1
        assert apps.read_namespaced_deployment_scale("steady", "team-a").spec.replicas == 0


def test_a_gpu_whose_power_data_has_a_gap_is_never_idle_but_one_drawing_is_busy():
    from datetime import datetime, timezone

    from pruning.planning import ClusterView, PruneSettings, plan_prune, pods_to_look_up
    from pruning.query import GpuSeries

    series = [GpuSeries("a", "gappy", "G1", "A10G", "n1", 0.0, True, 40.0, False),
              GpuSeries("a", "hot", "G2", "A10G", "n1", 0.0, True, 250.0, False)]   # a draw seen: busy anyway
    s = PruneSettings(power_threshold_watts=100.0)
    assert pods_to_look_up(series, s) == set()
    plan = plan_prune(series=series, view=ClusterView({}, {}), settings=s, now=datetime.now(timezone.utc))
    assert [(d.pod, d.reason) for d in plan.decisions] == [("gappy", "missing-power-data")] and plan.busy == 1


def test_utilization_data_for_the_last_seconds_only_is_a_gap(tmp_path, prometheus_factory):
    # The same hole on the utilization side: samples only after the window's last whole
    # step were no slot at all, and so no gap.
    with late_and_steady(tmp_path, prometheus_factory) as world:
        end = world.now()

        def late_data(series):
            return [Series(s.metric, s.labels, [(end - timedelta(seconds=12), 0.0), (end, 0.0)])
                    if s.labels.get("pod", "").startswith("late-") else s for s in series]

        run = prune_run_execute(kube_gateway=world.gateway, prometheus=world.prometheus(transform=late_data),
                                now=end, params=PruneParams())
        assert decisions(run) == {"late": ("skip", "gap-in-data"), "steady": ("prune", "idle")}
