"""Server-side printing: the meta.k8s.io/v1 Table `kubectl get` asks for.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...`; the columns
follow kube-apiserver's printers for pods and nodes, Name and Age for the rest.
"""
from __future__ import annotations

from datetime import datetime

from werkzeug.wrappers import Request

from ..clock import parse_time
from ..resources import NAMESPACES, NODES, PODS, ResourceType


def wants_table(request: Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration, near enough."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def _age(obj: dict, now: datetime) -> str:
    created = parse_time(obj["metadata"].get("creationTimestamp"))
    return human_duration((now - created).total_seconds()) if created else "<unknown>"


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def _pod_cells(pod: dict) -> list:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    containers = (pod.get("spec") or {}).get("containers") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    phase = "Terminating" if pod["metadata"].get("deletionTimestamp") else status.get("phase", "Pending")
    return [f"{ready}/{len(containers)}", phase, restarts]


def _node_cells(node: dict) -> list:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), "Unknown")
    state = "Ready" if ready == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))) or "<none>"
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [state, roles, version]


def table(rtype: ResourceType, items: list[dict], rv: int, now: datetime, request: Request) -> dict:
    include = request.args.get("includeObject", "Metadata")
    columns = [_column("Name", fmt="name")]
    if rtype is PODS:
        columns += [_column("Ready"), _column("Status"), _column("Restarts", "integer"), _column("Age"),
                    _column("IP", priority=1), _column("Node", priority=1)]
    elif rtype is NODES:
        columns += [_column("Status"), _column("Roles"), _column("Age"), _column("Version")]
    elif rtype is NAMESPACES:
        columns += [_column("Status"), _column("Age")]
    else:
        columns.append(_column("Age"))
    rows = []
    for obj in items:
        age = _age(obj, now)
        cells = [obj["metadata"]["name"]]
        if rtype is PODS:
            cells += _pod_cells(obj) + [age, (obj.get("status") or {}).get("podIP") or "<none>",
                                        (obj.get("spec") or {}).get("nodeName") or "<none>"]
        elif rtype is NODES:
            state, roles, version = _node_cells(obj)
            cells += [state, roles, age, version]
        elif rtype is NAMESPACES:
            phase = "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"
            cells += [(obj.get("status") or {}).get("phase", phase), age]
        else:
            cells.append(age)
        row: dict = {"cells": cells}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": columns, "rows": rows}
