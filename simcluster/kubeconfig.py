"""A kubeconfig for the simulated cluster, accepted by the `kubernetes` client and kubectl.

The server speaks plain HTTP and asks for no credentials; the user entry carries a
token only because some clients expect one.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

NAME = "simcluster"


def kubeconfig(url: str, *, namespace: str = "default") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {"server": url}}],
        "users": [{"name": NAME, "user": {"token": "simcluster"}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}],
        "current-context": NAME,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, *, namespace: str = "default") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig(url, namespace=namespace), sort_keys=False))
    os.chmod(tmp, 0o600)   # kubectl warns about group/world-readable kubeconfigs
    tmp.replace(path)
    return path
