"""A prune worker that dies mid-prune: run as a separate process by test_durability.py.

`python tests/pruning/crash_worker.py CLUSTER AT_ISO {after-write|before-write}` runs one
scale-down prune run of the cluster row and SIGKILLs its own process at the given point
of the first Kubernetes write: after the write landed but before its outcome is
recorded, or before the write was sent. Nothing is cleaned up: the kill is real.
"""
from __future__ import annotations

import os
import signal
import sys
from datetime import datetime

import django


def main(cluster_name: str, at: str, point: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from clusters.kube import gateway_for
    from clusters.models import Cluster
    from pruning import actions, services

    real_write = actions.write

    def write_then_die(*args, **kwargs):
        if point == "before-write":
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    actions.write = write_then_die
    cluster = Cluster.objects.get(name=cluster_name)
    services.prune_run_execute(kube_gateway=gateway_for(cluster), prometheus=services.prometheus_for(cluster=cluster),
                               params=services.PruneParams(run_mode="scale-down"),
                               now=datetime.fromisoformat(at), cluster=cluster, actor="worker")
    sys.exit("the worker was meant to die mid-prune but finished")


if __name__ == "__main__":
    main(*sys.argv[1:4])
