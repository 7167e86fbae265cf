"""A panel process that dies mid runbook action: run as a separate process by
test_runbook_durability.py.

`python tests/capacity/runbook_crash_worker.py ACTION MODEL_PK REVISION {before-write|after-write}`
runs one runbook action (redeploy, delete-old, delete-stuck) on the registry row
MODEL_PK and SIGKILLs its own process at its first Kubernetes write: before the write is
sent, or once it landed but before its outcome is recorded. Nothing is cleaned up: the
kill is real.
"""
from __future__ import annotations

import os
import signal
import sys

import django


def main(action: str, model_pk: str, revision: str, point: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from capacity.runbook import services
    from capacity.runbook.models import ServedModel
    from clusters.kube import KubeGateway

    def die_at_the_write(real):
        def write(*args, **kwargs):
            if point == "before-write":
                os.kill(os.getpid(), signal.SIGKILL)
            real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        return write

    KubeGateway.patch = die_at_the_write(KubeGateway.patch)
    KubeGateway.delete = die_at_the_write(KubeGateway.delete)
    model = ServedModel.objects.get(pk=int(model_pk))
    if action == "redeploy":
        services.model_redeploy(model=model, actor=None)
    elif action == "delete-old":
        services.revision_delete_old(model=model, revision=revision, actor=None)
    else:
        services.model_delete_stuck(model=model, actor=None)
    sys.exit("the process was meant to die at its write but finished")


if __name__ == "__main__":
    main(*sys.argv[1:5])
