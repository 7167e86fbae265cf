"""A kubeconfig for the simulated cluster, accepted by the `kubernetes` client and kubectl.

The server speaks plain HTTP. Its token is the simulator's admin token (group
system:masters, full access; see api/auth.py); `token=` writes one for another identity,
a ServiceAccount's say, to run a client with that identity's RBAC permissions.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

NAME = "simcluster"
ADMIN_TOKEN = "simcluster"   # api/auth.py: simcluster-admin, group system:masters


def kubeconfig(url: str, *, namespace: str = "default", token: str = ADMIN_TOKEN) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {"server": url}}],
        "users": [{"name": NAME, "user": {"token": token}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}],
        "current-context": NAME,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, *, namespace: str = "default",
                     token: str = ADMIN_TOKEN) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig(url, namespace=namespace, token=token), sort_keys=False))
    os.chmod(tmp, 0o600)   # kubectl warns about group/world-readable kubeconfigs
    tmp.replace(path)
    return path
