"""Defrag job costs on the simulated cluster (prints figures; not a test).

    .venv/bin/python bench/defrag_calls.py [--scales 1,5] [--runs 5]

1. Per scale (16 model pods on the node at 1x, 80 at 5x), min/median/max of --runs:
   - discovery (`defrag_discover`), against its floor: the reads it cannot do without,
     GET of the node and one LIST of the pods on it (urllib + orjson, no client);
   - one check of a waiting job (step 5), against its floor: GET of the revision's
     PodAutoscaler and of its ReplicaSet, the two objects the check compares;
   - API calls per check: must stay flat as the pods grow (growth 1.00x).
2. Delay, on the simulated clock, between the safety condition becoming true and the job
   reporting it, when polling every P seconds (target: within one interval).
3. Wall-clock delay between a PodAutoscaler change and the worker's watch waking (target < 1 s).

Everything runs in a temporary folder (SQLite, kubeconfigs), removed at exit.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import orjson

import _django

_django.setup("defrag-bench", extra_paths=["tests/capacity"])

from _runs import Report, bench_arguments, scales_of, timed  # noqa: E402

from capacity.defrag.models import JobState  # noqa: E402
from capacity.defrag.planning import revision_satisfied  # noqa: E402
from capacity.defrag.services import defrag_discover, defrag_job_start, defrag_job_step, defrag_job_wait  # noqa: E402
from clusters.kube import NODES, PODAUTOSCALERS, KubeGateway  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from defrag_builders import make_model_pod, make_node  # noqa: E402
from simcluster.control import SimControl  # noqa: E402
from simcluster.kubeconfig import ADMIN_TOKEN  # noqa: E402
from simcluster.resources import PODS  # noqa: E402
from simcluster.store import copy  # noqa: E402
from simcluster.testing import ClusterServer  # noqa: E402

NS, REV, HASH = "org-a", "model-00001", "547cc9b97f"


def revision_objects(replicas: int, revision: str = REV) -> list[dict]:
    rs_name = f"{revision}-deployment-{HASH}"
    labels = {"serving.knative.dev/revision": revision, "pod-template-hash": HASH}
    return [
        {"apiVersion": "autoscaling.internal.knative.dev/v1alpha1", "kind": "PodAutoscaler",
         "metadata": {"name": revision, "namespace": NS},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{revision}-deployment"},
                  "protocolType": "http1"},
         "status": {"actualScale": replicas, "desiredScale": replicas}},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet",
         "metadata": {"name": rs_name, "namespace": NS, "uid": f"uid-{rs_name}", "labels": labels},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "m", "image": "m"}]}}},
         "status": {"replicas": replicas, "readyReplicas": replicas}},
    ]


def ready(pod: dict) -> dict:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def world(pods_on_node: int, tmp: Path, index: int):
    objects = [make_node("n1", gpus=pods_on_node), make_node("n2", gpus=pods_on_node),
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
    objects += [ready(make_model_pod(f"{REV}-p{i}", revision=REV, namespace=NS, node="n1", template_hash=HASH))
                for i in range(pods_on_node)]
    objects += revision_objects(pods_on_node)
    kubeconfig = tmp / f"kubeconfig-{index}"
    server = ClusterServer(objects, kubeconfig_out=str(kubeconfig))
    server.start()
    cluster = Cluster.objects.create(name=f"bench-{index}", kubeconfig_path=str(kubeconfig))
    gateway = KubeGateway.from_kubeconfig(str(kubeconfig), retry_attempts=3, backoff=0.0, sleep=lambda s: None)
    SimControl(server.url).advance(1)
    return server, cluster, gateway


def add_ready_replica(server) -> None:
    """What the ReplicaSet and kubelet do for the orphan: a labelled Ready pod elsewhere."""
    store = server.sim.store
    with store.lock:
        template = next(p for p in store.all(PODS, NS) if p["metadata"]["name"].startswith(REV))
        pod = copy(template)
        pod["metadata"] = {"name": f"{REV}-replacement-{store.resource_version}", "namespace": NS,
                           "labels": dict(template["metadata"]["labels"])}
        pod["spec"]["nodeName"] = "n2"
        store.create(PODS, ready(pod))


def raw_get(url: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request) as response:
        return orjson.loads(response.read())


BASE_PODS = 16


def check_costs(scale: int, runs: int, report: Report, tmp: Path) -> None:
    n = BASE_PODS * scale
    server, cluster, gateway = world(n, tmp, scale)
    try:
        now = server.sim.clock.now
        base = str(server.url)
        discovery_floor = timed(lambda: (raw_get(f"{base}/api/v1/nodes/n1"),
                                         raw_get(f"{base}/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")), runs)
        before = gateway.calls_total()
        plan = defrag_discover(cluster=cluster, node_name="n1", gateway=gateway)
        discovery_calls = gateway.calls_total() - before
        report.add(scale, "discovery", timed(lambda: defrag_discover(cluster=cluster, node_name="n1",
                                                                     gateway=gateway), runs),
                   floor="GET node + LIST its pods", floor_samples=discovery_floor,
                   note=f"{n} model pods, {discovery_calls} calls")
        job = defrag_job_start(cluster=cluster, node_name="n1", plan=plan, now=now(), enqueue=False,
                               poll_interval_seconds=1.0)
        job = defrag_job_step(job=job, gateway=gateway, now=now())            # record
        job = defrag_job_step(job=job, gateway=gateway, now=now())            # cordon
        job = defrag_job_step(job=job, gateway=gateway, now=now())            # orphan
        assert job.state == JobState.WAITING, job.state
        rs_name = f"{REV}-deployment-{HASH}"
        check_floor = timed(lambda: (
            raw_get(f"{base}/apis/autoscaling.internal.knative.dev/v1alpha1/namespaces/{NS}/podautoscalers/{REV}"),
            raw_get(f"{base}/apis/apps/v1/namespaces/{NS}/replicasets/{rs_name}")), runs)
        calls, checks = [], []
        for run in range(runs):
            # One poll interval later each time, so the check is due; the simulated clock
            # stands still, so the cluster's controllers do not make the node safe meanwhile.
            due = now() + timedelta(seconds=1.0 * (run + 1))
            before = gateway.calls_total()
            began = time.perf_counter()
            job = defrag_job_step(job=job, gateway=gateway, now=due)          # one check
            checks.append(time.perf_counter() - began)
            calls.append(gateway.calls_total() - before)
            assert job.state == JobState.WAITING, job.state
        report.add(scale, "one check (waiting job)", checks, floor="GET PodAutoscaler + ReplicaSet",
                   floor_samples=check_floor, note=f"{n} model pods")
        report.add(scale, "API calls per check", calls, unit="calls", note="must stay flat")
    finally:
        server.stop()


def poll_delay(tmp: Path) -> None:
    print("\n2. Delay between the condition turning true and the job reporting it (simulated clock)")
    print(f"{'poll s':>7} {'room at +s':>11} {'true at +s':>11} {'safe at +s':>11} {'delay s':>8}")
    for index, (poll, room_after) in enumerate(((1.0, 7.3), (5.0, 12.1), (10.0, 23.7), (30.0, 41.0))):
        server, cluster, gateway = world(3, tmp, 100 + index)
        control = SimControl(server.url)
        try:
            now = server.sim.clock.now
            # The simulated ReplicaSet controller, scheduler and kubelet make the replacement
            # themselves; n2 stays cordoned until `room_after`, so the condition turns true at
            # a time of the bench's choosing (plus the pod's start-up), not at once.
            gateway.patch(NODES, "n2", {"spec": {"unschedulable": True}}, patch_type="strategic")
            plan = defrag_discover(cluster=cluster, node_name="n1", gateway=gateway)
            job = defrag_job_start(cluster=cluster, node_name="n1", plan=plan, now=now(), enqueue=False,
                                   poll_interval_seconds=poll)
            for _ in range(4):
                job = defrag_job_step(job=job, gateway=gateway, now=now())
            assert job.state == JobState.WAITING, job.state
            start = now()
            true_at = None
            room = False
            while job.state != JobState.SAFE:
                control.advance(0.1)
                elapsed = (now() - start).total_seconds()
                if elapsed >= room_after and not room:
                    gateway.patch(NODES, "n2", {"spec": {"unschedulable": False}}, patch_type="strategic")
                    room = True
                    control.advance(0)
                if true_at is None:
                    pa = gateway.get(PODAUTOSCALERS, REV, namespace=NS)
                    scale = int(pa.get("status", {}).get("actualScale") or 0)
                    if revision_satisfied(current_kpa_scale=scale, current_replicas=3, initial_replicas=3,
                                          overprovision=1):
                        true_at = now()
                job = defrag_job_step(job=job, gateway=gateway, now=now())
            print(f"{poll:>7g} {room_after:>11.1f} {(true_at - start).total_seconds():>11.1f}"
                  f" {(job.safe_at - start).total_seconds():>11.1f} {(job.safe_at - true_at).total_seconds():>8.1f}")
        finally:
            server.stop()


def watch_delay(tmp: Path) -> None:
    print("\n3. Wall-clock delay from a PodAutoscaler change to the worker's watch waking")
    server, cluster, gateway = world(3, tmp, 200)
    control = SimControl(server.url)
    try:
        now = server.sim.clock.now
        plan = defrag_discover(cluster=cluster, node_name="n1", gateway=gateway)
        job = defrag_job_start(cluster=cluster, node_name="n1", plan=plan, now=now(), enqueue=False,
                               poll_interval_seconds=30.0)
        for _ in range(4):
            job = defrag_job_step(job=job, gateway=gateway, now=now())
        delays = []
        for _ in range(5):
            woke: dict = {}

            def wait():
                woke["changed"] = defrag_job_wait(job=job, gateway=gateway, timeout_seconds=30)
                woke["at"] = time.perf_counter()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.3)                      # the watch is open
            changed_at = time.perf_counter()
            add_ready_replica(server)
            control.advance(0)                   # the KPA recounts: actualScale changes
            thread.join(35)
            delays.append(woke["at"] - changed_at)
            assert woke["changed"], "the watch timed out instead of waking"
        print(f"woken by the change in {min(delays) * 1000:.0f}–{max(delays) * 1000:.0f} ms "
              f"(5 runs; includes the KPA's recount)")
    finally:
        server.stop()


def main() -> None:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args()
    report = Report("defrag_calls", runs=args.runs)
    with tempfile.TemporaryDirectory(prefix="defrag-bench-") as tmpdir:
        for scale in scales_of(args):
            check_costs(scale, args.runs, report, Path(tmpdir))
        report.print()
        poll_delay(Path(tmpdir))
        watch_delay(Path(tmpdir))


if __name__ == "__main__":
    main()
