"""A defrag job on a real Celery worker (prefork, Redis broker, this test's PostgreSQL) whose
pool process is SIGKILLed mid-job: the message comes back (acks_late,
reject_on_worker_lost), takes its own lease back, and the job carries on within a lease;
then an operator's abort runs to the end with every side effect recorded once.

The simulated cluster's clock runs (speed 50), so the worker sees pods start on its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from capacity.defrag.services import LEASE_SECONDS, defrag_discover, defrag_job_abort, defrag_job_start
from audit.selectors import entries_of_subject
from capacity.defrag.models import DefragJob, JobState, OrphanState
from defrag_builders import make_node, make_pod
from defrag_cluster import NS, Kube, knative_service, scenario
from tests.celery_workers import CELERY, ROOT, broker_url, celery_processes, pool_children, wait_for  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def job_audit(job):
    """The job's entries in the audit trail, oldest first."""
    return entries_of_subject(subject_type="defrag_job", subject_id=job.pk, oldest_first=True)


def send(procs, job_id: int) -> None:
    """Queue a step task on the worker's broker, as the panel's on_commit hook would."""
    subprocess.run([str(CELERY), "-A", "config", "call", "capacity.tasks.defrag_job_run", f"--args=[{job_id}]"],
                   cwd=ROOT, env=procs.env, check=True, capture_output=True, timeout=60)


def test_a_killed_pool_process_loses_no_job_and_no_abort(sim_cluster_factory, celery_processes):
    handle = sim_cluster_factory(scenario(knative_service(min_scale=1, gpus=8), make_node("n2", gpus=8), nodes=1),
                                 name="sim", speed=50.0)
    kube = Kube(handle.kubeconfig_path)
    kube.core.create_namespaced_pod(NS, make_pod("hog", namespace=NS, node="n2", gpus=8))
    for _ in range(200):                     # wall time: the cluster's clock runs
        if kube.actual_scale() == 1:
            break
        time.sleep(0.05)
    plan = defrag_discover(cluster=handle.cluster, node_name="n1")
    job = defrag_job_start(cluster=handle.cluster, node_name="n1", plan=plan, poll_interval_seconds=0.5,
                           enqueue=False)

    procs = celery_processes
    procs.start("worker", "worker", "--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"defrag-test-{os.getpid()}@%h", "--loglevel=INFO")
    wait_for(lambda: "ready." in procs.log("worker"), "the worker is ready", procs)
    send(procs, job.pk)
    wait_for(lambda: DefragJob.objects.filter(pk=job.pk, state=JobState.WAITING).exclude(lease_owner="").exists(),
             "the worker orphans the pod and waits, holding the lease", procs)

    [child] = pool_children(procs.procs["worker"][0].pid)
    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    before = DefragJob.objects.get(pk=job.pk).heartbeat_at
    wait_for(lambda: DefragJob.objects.get(pk=job.pk).heartbeat_at > before, "a new pool process steps the job",
             procs, limit_s=LEASE_SECONDS)
    assert time.monotonic() - killed_at < LEASE_SECONDS
    assert "WorkerLostError" in procs.log("worker") or "exited by signal" in procs.log("worker")
    assert DefragJob.objects.get(pk=job.pk).state == JobState.WAITING and kube.node_cordoned("n1")

    # The operator aborts while the worker is stepping: the request is taken up, never overwritten.
    job = defrag_job_abort(job=DefragJob.objects.get(pk=job.pk), actor=None, orphans="delete", enqueue=False)
    send(procs, job.pk)
    wait_for(lambda: DefragJob.objects.get(pk=job.pk).state == JobState.ABORTED, "the abort ends the job", procs)
    job.refresh_from_db()
    assert not kube.node_cordoned("n1")
    [orphan] = job.orphans.all()
    assert orphan.state == OrphanState.GONE and not kube.pod_exists(NS, orphan.pod_name)
    actions = list(job_audit(job).values_list("action", flat=True))
    for action in ("node_cordon", "pod_orphan", "abort_request", "node_uncordon", "pod_delete", "job_abort"):
        assert actions.count(action) == 1, (action, actions)
