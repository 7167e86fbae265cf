"""A process that dies in the middle of a return to service: run as a separate process by
test_return_to_service_kill.py.

`python tests/capacity/return_to_service_crash_worker.py JOB_PK ACTOR NOW {before-patch|after-patch}`
returns the node of defrag job JOB_PK to service, as the panel (ACTOR `user:<pk>`) or
the CLI (ACTOR `cli:<label>`) would, at NOW (ISO 8601, the simulated cluster's clock), and
SIGKILLs its own process at the uncordon: right before the patch is sent, or right after
it landed and before anything about it is committed. Nothing is cleaned up: the kill is
real.
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import nullcontext
from datetime import datetime

import django


def main(job_pk: str, actor: str, now: str, point: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
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
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(self, resource, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    KubeGateway.patch = patch
    job = DefragJob.objects.select_related("cluster").get(pk=int(job_pk))
    kind, _, who = actor.partition(":")
    user = get_user_model().objects.get(pk=int(who)) if kind == "user" else None
    with acting_as(actor) if kind == "cli" else nullcontext():
        node_return_to_service(cluster=job.cluster, node=job.node_name, actor=user, job=job,
                               now=datetime.fromisoformat(now), enqueue=False)
    sys.exit("the process was meant to die at its uncordon but finished")


if __name__ == "__main__":
    main(*sys.argv[1:5])
