"""Builders and assertions shared by the simulated cluster's API tests."""
from __future__ import annotations

import json

from kubernetes.client import ApiException


def pod(name: str, *, labels: dict | None = None, annotations: dict | None = None, node: str | None = None,
        namespace: str = "team-a") -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "vllm:latest"}]}
    if node:
        spec["nodeName"] = node
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def status_of(exc: ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["code"] == exc.status
    return body
