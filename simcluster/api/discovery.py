"""Legacy (unaggregated) discovery documents: enough for kubectl and the dynamic client.

kubectl 1.32 asks for aggregated discovery first; an `application/json` answer with
the legacy shape makes it fall back to these documents, as it does with older servers.
"""
from __future__ import annotations

from ..resources import RESOURCE_TYPES, ResourceType

GIT_VERSION = "v1.32.0-simcluster"

# Subresource kinds other than the parent's own.
_SUBRESOURCE_KINDS = {
    "scale": ("autoscaling", "v1", "Scale", ["get", "patch", "update"]),
    "eviction": ("policy", "v1", "Eviction", ["create"]),
    "binding": ("", "v1", "Binding", ["create"]),
}


def version() -> dict:
    return {"major": "1", "minor": "32", "gitVersion": GIT_VERSION, "gitCommit": "simcluster",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23",
            "compiler": "gc", "platform": "linux/amd64"}


def api_versions(server_address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for rtype in RESOURCE_TYPES:
        if rtype.group:
            versions = groups.setdefault(rtype.group, [])
            if rtype.version not in versions:
                versions.append(rtype.version)
    return groups


def api_group_list() -> dict:
    groups = []
    for name, versions in _groups().items():
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        groups.append({"name": name, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(group: str) -> dict | None:
    versions = _groups().get(group)
    if not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def _resource(rtype: ResourceType) -> dict:
    entry = {"name": rtype.plural, "singularName": rtype.singular, "namespaced": rtype.namespaced,
             "kind": rtype.kind, "verbs": list(rtype.verbs)}
    if rtype.short_names:
        entry["shortNames"] = list(rtype.short_names)
    if rtype.group not in ("", "apps", "policy", "events.k8s.io", "rbac.authorization.k8s.io"):
        entry["categories"] = ["all"] if rtype.group != "autoscaling.internal.knative.dev" else []
    elif rtype.plural in ("pods", "services", "deployments", "replicasets", "statefulsets", "daemonsets"):
        entry["categories"] = ["all"]
    return entry


def _subresource(rtype: ResourceType, sub: str) -> dict:
    group, version, kind, verbs = _SUBRESOURCE_KINDS.get(sub, (None, None, rtype.kind, ["get", "patch", "update"]))
    entry = {"name": f"{rtype.plural}/{sub}", "singularName": "", "namespaced": rtype.namespaced,
             "kind": kind, "verbs": verbs}
    if group is not None:
        entry["group"], entry["version"] = group, version
    return entry


def api_resource_list(group: str, version: str) -> dict:
    resources = []
    for rtype in RESOURCE_TYPES:
        if rtype.group == group and rtype.version == version:
            resources.append(_resource(rtype))
            resources += [_subresource(rtype, sub) for sub in rtype.subresources]
    group_version = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}
