"""A worker that dies mid binpack write run: run as a separate process by
test_binpack_durability.py.

`python tests/capacity/binpack_crash_worker.py CLUSTER_PK USER_PK N` runs one binpack
write run on cluster CLUSTER_PK as the panel user USER_PK (an admin action) and SIGKILLs
its own process as soon as its Nth pod patch has returned: N costs are on pods, the
rest never sent, nothing recorded after. Nothing is cleaned up: the kill is real.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

import django


def main(cluster_pk: str, user_pk: str, after: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.contrib.auth.models import User

    from capacity.binpack.models import BinpackRun
    from capacity.binpack.services import pod_deletion_costs_apply
    from clusters import kube
    from clusters.models import Cluster

    real = kube.KubeGateway.patch
    lock, done = threading.Lock(), [0]

    def patch_then_die(self, resource, *args, **kwargs):
        answer = real(self, resource, *args, **kwargs)
        if resource is kube.PODS:
            with lock:
                done[0] += 1
                if done[0] >= int(after):
                    os.kill(os.getpid(), signal.SIGKILL)
        return answer

    kube.KubeGateway.patch = patch_then_die
    pod_deletion_costs_apply(cluster=Cluster.objects.get(pk=int(cluster_pk)), actor=User.objects.get(pk=int(user_pk)),
                             trigger=BinpackRun.Trigger.ADMIN)
    sys.exit("the process was meant to die after its write but finished")


if __name__ == "__main__":
    main(*sys.argv[1:4])
