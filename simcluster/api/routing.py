"""Kubernetes REST paths, parsed into what a request is about.

/api/v1[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]
/apis/{group}/{version}[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import errors
from ..resources import RESOURCE_TYPES, ResourceType, by_path

SERVED_GROUP_VERSIONS: set[tuple[str, str]] = {(r.group, r.version) for r in RESOURCE_TYPES}


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    rtype: ResourceType | None = None      # None: the group version's discovery document
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @property
    def is_collection(self) -> bool:
        return self.rtype is not None and self.name is None


def parse(path: str) -> Route:
    """The route for a Kubernetes API path; 404 when nothing is served there."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise errors.resource_not_found()
    if (group, version) not in SERVED_GROUP_VERSIONS:
        raise errors.resource_not_found()
    if not rest:
        return Route(group, version)

    namespace = None
    # "namespaces/{ns}/{plural}..." is a namespaced path unless {plural} is not a
    # namespaced resource: then it is the Namespace object itself (e.g. ns/x/status).
    if rest[0] == "namespaces" and len(rest) >= 3:
        inner = by_path(group, version, rest[2])
        if inner is not None and inner.namespaced:
            namespace, rest = rest[1], rest[2:]

    rtype = by_path(group, version, rest[0])
    if rtype is None or len(rest) > 3:
        raise errors.resource_not_found()
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    if namespace is None and rtype.namespaced and name is not None:
        # /api/v1/pods/x: namespaced kinds are only listed cluster-wide.
        raise errors.resource_not_found()
    if subresource is not None and subresource not in rtype.subresources:
        raise errors.resource_not_found()
    return Route(group, version, rtype, namespace, name, subresource)
