"""Processes that die in the middle of a defrag write to the cluster: run as separate
processes (`crash`) by test_return_to_service_kill.py and test_defrag_orphan_end_kill.py.

`python tests/capacity/defrag_crash_worker.py return-to-service JOB_PK ACTOR NOW {before-patch|after-patch}`
returns the node of defrag job JOB_PK to service, as the panel (ACTOR `user:<pk>`) or the
CLI (ACTOR `cli:<label>`) would, at NOW (ISO 8601, the simulated cluster's clock), and
SIGKILLs its own process at the uncordon: right before the patch is sent, or right after it
landed and before anything about it is committed.

`python tests/capacity/defrag_crash_worker.py step JOB_PK NOW {before|after}-{evict|delete}`
runs the step task of defrag job JOB_PK (`defrag_job_run`: its lease, its heartbeat, its
steps) as a worker does, on a clock stopped at NOW, and SIGKILLs its own process at the
job's first eviction (or pod DELETE): right before it is sent, or once its answer came back
and before anything about it is recorded. The job's lease stays with the dead worker.

Imported by a real Celery worker (`celery -A config worker -I tests.capacity.defrag_crash_worker`)
with DEFRAG_CRASH_POINT=`{before|after}-{evict|delete}` and DEFRAG_CRASH_ONCE=<a file path>
in its environment, it makes the first pool process that sends a pod eviction (or DELETE)
SIGKILL itself at that point; the file marks it done, so the pool process that takes the
re-queued message over lives.

Nothing is cleaned up: the kill is real.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def crash(*args: str) -> None:
    """Run this module with `args` in a process of its own, against the calling test's
    PostgreSQL database, and check that it died by SIGKILL at its write."""
    from tests.celery_workers import database_url

    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT), "KUBE_RETRY_BACKOFF": "0.05"}
    env.pop("KUBECONFIG", None)
    env.pop("CLOCK_OFFSET_FILE", None)
    done = subprocess.run([sys.executable, str(Path(__file__)), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_at_pod_end(point: str, *, once: str | None = None) -> None:
    """Make this process die at its first pod eviction or DELETE (`point`:
    `{before|after}-{evict|delete}`); with `once`, only if that file does not exist yet."""
    from clusters.kube import PODS, KubeGateway

    when, _, verb = point.partition("-")

    def first() -> bool:
        if once is None:
            return True
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def dying(real):
        def request(self, *args, **kwargs):
            if verb == "delete" and args[0] is not PODS:
                return real(self, *args, **kwargs)
            if when == "before" and first():
                _die()
            result = real(self, *args, **kwargs)
            if when == "after" and first():
                _die()
            return result
        return request

    name = "evict" if verb == "evict" else "delete"
    setattr(KubeGateway, name, dying(getattr(KubeGateway, name)))


def return_to_service(job_pk: str, actor: str, now: str, point: str) -> None:
    from django.contrib.auth import get_user_model

    from capacity.defrag.models import DefragJob
    from capacity.defrag.services import node_return_to_service
    from clusters.kube import NODES, KubeGateway
    from config.actors import acting_as

    real = KubeGateway.patch

    def patch(self, resource, *args, **kwargs):
        if resource is not NODES:
            return real(self, resource, *args, **kwargs)
        if point == "before-patch":
            _die()
        result = real(self, resource, *args, **kwargs)
        _die()
        return result

    KubeGateway.patch = patch
    job = DefragJob.objects.select_related("cluster").get(pk=int(job_pk))
    kind, _, who = actor.partition(":")
    user = get_user_model().objects.get(pk=int(who)) if kind == "user" else None
    with acting_as(actor) if kind == "cli" else nullcontext():
        node_return_to_service(cluster=job.cluster, node=job.node_name, actor=user, job=job,
                               now=datetime.fromisoformat(now), enqueue=False)


def step(job_pk: str, now: str, point: str) -> None:
    from capacity.defrag import tasks
    from config import clock

    at = datetime.fromisoformat(now)
    clock.now = lambda: at   # the product's one clock: the simulated cluster's, stopped
    _die_at_pod_end(point)
    tasks.defrag_job_run.apply(args=(int(job_pk),))


if os.environ.get("DEFRAG_CRASH_POINT") and os.environ.get("DEFRAG_CRASH_ONCE"):
    _die_at_pod_end(os.environ["DEFRAG_CRASH_POINT"], once=os.environ["DEFRAG_CRASH_ONCE"])


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    {"return-to-service": return_to_service, "step": step}[sys.argv[1]](*sys.argv[2:])
    sys.exit("the process was meant to die at its write but finished")
