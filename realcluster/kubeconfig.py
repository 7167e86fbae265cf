"""Kubeconfigs: one per component inside the namespace, one for clients on the host."""
from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

NAME = "realcluster"


def kubeconfig(server: str, *, ca_cert: Path, token: str, namespace: str = "default") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_cert.read_bytes()).decode()}}],
        "users": [{"name": NAME, "user": {"token": token}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}],
        "current-context": NAME,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, server: str, *, ca_cert: Path, token: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig(server, ca_cert=ca_cert, token=token), sort_keys=False))
    os.chmod(tmp, 0o600)   # kubectl warns about group/world-readable kubeconfigs
    tmp.replace(path)
    return path
