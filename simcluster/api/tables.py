"""Server-side printing: the meta.k8s.io/v1 Table `kubectl get` asks for.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...`; the columns
follow kube-apiserver's printers (pkg/printers/internalversion/printers.go) for pods,
nodes, events, namespaces, Deployments, ReplicaSets, StatefulSets and PDBs; other kinds
(custom resources among them) get Name and Age.
"""
from __future__ import annotations

from datetime import datetime

from werkzeug.wrappers import Request

from ..clock import parse_time
from ..resources import ResourceType
from .subresources import selector_string


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


def _since(stamp, now: datetime) -> str:
    """translateTimestampSince: "<unknown>" for a missing time."""
    moment = parse_time(stamp) if stamp else None
    return human_duration((now - moment).total_seconds()) if moment else "<unknown>"


def _age(obj: dict, now: datetime) -> str:
    return _since(obj["metadata"].get("creationTimestamp"), now)


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def _spec(obj: dict) -> dict:
    return obj.get("spec") or {}


def _status(obj: dict) -> dict:
    return obj.get("status") or {}


# ---- pods (printPod) ----------------------------------------------------------------------
def _pod_status(pod: dict) -> tuple[str, int, int, int]:
    """(STATUS, ready containers, containers, restarts) as printPod computes them:
    the phase, overridden by the pod's reason, a container's waiting or terminated
    reason, "Terminating" while it is being deleted."""
    status = _status(pod)
    containers = _spec(pod).get("containers") or []
    reason = status.get("reason") or status.get("phase") or "Pending"
    ready = restarts = 0
    has_running = False
    for cs in reversed(status.get("containerStatuses") or []):
        restarts += int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None:
            if terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated.get("signal"):
                reason = f"Signal:{terminated['signal']}"
            else:
                reason = f"ExitCode:{terminated.get('exitCode', 0)}"
        elif "running" in state and cs.get("ready"):
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        reason = "Running"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason, ready, len(containers), restarts


def _pod_row(pod: dict, now: datetime) -> list:
    reason, ready, total, restarts = _pod_status(pod)
    status, spec = _status(pod), _spec(pod)
    gates = spec.get("readinessGates") or []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    gates_text = f"{sum(1 for g in gates if conditions.get(g.get('conditionType')) == 'True')}/{len(gates)}" \
        if gates else "<none>"
    return [f"{ready}/{total}", reason, str(restarts), _age(pod, now), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", gates_text]


# ---- nodes (printNode) --------------------------------------------------------------------
def _node_row(node: dict, now: datetime) -> list:
    status = _status(node)
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready == "True" else "NotReady")
    if _spec(node).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and k.split("/", 1)[1]}
    if labels.get("kubernetes.io/role"):
        roles.add(labels["kubernetes.io/role"])
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a.get("address") for a in addresses if a.get("type") == kind), "<none>")

    return [state, ",".join(sorted(roles)) or "<none>", _age(node, now), info.get("kubeletVersion", ""),
            address("InternalIP"), address("ExternalIP"), info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>", info.get("containerRuntimeVersion") or "<unknown>"]


# ---- events (printEvent) ------------------------------------------------------------------
def _event_row(event: dict, now: datetime) -> list:
    """core/v1 and events.k8s.io/v1 Events alike: the API server prints both from one
    internal type (regarding = involvedObject, note = message, deprecated* = the old fields)."""
    involved = event.get("involvedObject") or event.get("regarding") or {}
    first_stamp = event.get("firstTimestamp") or event.get("deprecatedFirstTimestamp")
    first = _since(first_stamp or event.get("eventTime"), now)
    last_stamp = event.get("lastTimestamp") or event.get("deprecatedLastTimestamp")
    last = _since(last_stamp, now) if last_stamp else first
    count = event.get("count") or event.get("deprecatedCount") or 0
    series = event.get("series")
    if series:
        last = _since(series.get("lastObservedTime"), now)
        count = series.get("count") or 0
    elif not count:
        count = 1   # singleton events of the new API carry no count
    kind = (involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = event.get("source") or event.get("deprecatedSource") or {}
    component = source.get("component") or event.get("reportingComponent") or event.get("reportingController") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    source_text = f"{component}, {host}" if host else component
    return [last, event.get("type") or "", event.get("reason") or "", target, involved.get("fieldPath") or "",
            source_text, (event.get("message") or event.get("note") or "").strip(), first, int(count),
            event["metadata"]["name"]]


# ---- workloads ------------------------------------------------------------------------------
def _containers_images_selector(obj: dict) -> list:
    containers = ((_spec(obj).get("template") or {}).get("spec") or {}).get("containers") or []
    return [",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers),
            selector_string(_spec(obj).get("selector")) or "<none>"]


def _deployment_row(obj: dict, now: datetime) -> list:
    spec, status = _spec(obj), _status(obj)
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}", status.get("updatedReplicas", 0),
            status.get("availableReplicas", 0), _age(obj, now), *_containers_images_selector(obj)]


def _replicaset_row(obj: dict, now: datetime) -> list:
    spec, status = _spec(obj), _status(obj)
    return [spec.get("replicas", 1), status.get("replicas", 0), status.get("readyReplicas", 0), _age(obj, now),
            *_containers_images_selector(obj)]


def _statefulset_row(obj: dict, now: datetime) -> list:
    spec, status = _spec(obj), _status(obj)
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}", _age(obj, now),
            *_containers_images_selector(obj)[:2]]


def _pdb_row(obj: dict, now: datetime) -> list:
    spec = _spec(obj)
    return [str(spec["minAvailable"]) if spec.get("minAvailable") is not None else "N/A",
            str(spec["maxUnavailable"]) if spec.get("maxUnavailable") is not None else "N/A",
            _status(obj).get("disruptionsAllowed", 0), _age(obj, now)]


def _namespace_row(obj: dict, now: datetime) -> list:
    phase = "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"
    return [_status(obj).get("phase", phase), _age(obj, now)]


def _default_row(obj: dict, now: datetime) -> list:
    return [_age(obj, now)]


_NAME = _column("Name", fmt="name")
# (columns, row builder) per kind, after pkg/printers/internalversion/printers.go. The
# server prints every column; kubectl shows priority 0 ones unless `-o wide`.
_PRINTERS = {
    ("", "pods"): ([_NAME, _column("Ready"), _column("Status"), _column("Restarts"), _column("Age"),
                    _column("IP", priority=1), _column("Node", priority=1), _column("Nominated Node", priority=1),
                    _column("Readiness Gates", priority=1)], _pod_row),
    ("", "nodes"): ([_NAME, _column("Status"), _column("Roles"), _column("Age"), _column("Version"),
                     _column("Internal-IP", priority=1), _column("External-IP", priority=1),
                     _column("OS-Image", priority=1), _column("Kernel-Version", priority=1),
                     _column("Container-Runtime", priority=1)], _node_row),
    ("", "events"): ([_column("Last Seen"), _column("Type"), _column("Reason"), _column("Object"),
                      _column("Subobject", priority=1), _column("Source", priority=1), _column("Message"),
                      _column("First Seen", priority=1), _column("Count", priority=1),
                      _column("Name", priority=1, fmt="name")], _event_row),
    ("", "namespaces"): ([_NAME, _column("Status"), _column("Age")], _namespace_row),
    ("apps", "deployments"): ([_NAME, _column("Ready"), _column("Up-to-date", "integer"),
                               _column("Available", "integer"), _column("Age"), _column("Containers", priority=1),
                               _column("Images", priority=1), _column("Selector", priority=1)], _deployment_row),
    ("apps", "replicasets"): ([_NAME, _column("Desired", "integer"), _column("Current", "integer"),
                               _column("Ready", "integer"), _column("Age"), _column("Containers", priority=1),
                               _column("Images", priority=1), _column("Selector", priority=1)], _replicaset_row),
    ("apps", "statefulsets"): ([_NAME, _column("Ready"), _column("Age"), _column("Containers", priority=1),
                                _column("Images", priority=1)], _statefulset_row),
    ("policy", "poddisruptionbudgets"): ([_NAME, _column("Min Available"), _column("Max Unavailable"),
                                          _column("Allowed Disruptions", "integer"), _column("Age")], _pdb_row),
}
_PRINTERS[("events.k8s.io", "events")] = _PRINTERS[("", "events")]


def table(rtype: ResourceType, items: list[dict], rv: int, now: datetime, request: Request,
          list_meta: dict | None = None) -> dict:
    include = request.args.get("includeObject", "Metadata")
    columns, row_of = _PRINTERS.get((rtype.group, rtype.plural), ([_NAME, _column("Age")], _default_row))
    named = columns[0] is _NAME
    rows = []
    for obj in items:
        cells = row_of(obj, now)
        row: dict = {"cells": [obj["metadata"]["name"], *cells] if named else cells}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {"resourceVersion": str(rv)},
            "columnDefinitions": columns, "rows": rows}
