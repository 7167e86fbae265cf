"""A small HTTPS client for bring-up: readiness probes, discovery and creating objects.

The tool stays outside the product's import graph and off the `kubernetes` client (only
`clusters/kube.py` may use that); the standard library suffices for these few calls.
"""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Response:
    status: int
    body: dict | str | None


class Api:
    def __init__(self, server: str, *, token: str | None = None, ca_cert: Path | None = None,
                 timeout: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else ssl._create_unverified_context()
        self._resources: dict[tuple[str, str], tuple[str, bool]] | None = None

    def request(self, method: str, path: str, body: dict | None = None, *,
                content_type: str = "application/json") -> Response:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as answer:
                return Response(answer.status, _decode(answer.read()))
        except urllib.error.HTTPError as exc:
            return Response(exc.code, _decode(exc.read()))

    def answers(self, path: str) -> bool:
        """True when GET `path` answers 200 (a readiness probe); False on any failure."""
        try:
            return self.request("GET", path).status == 200
        except (OSError, urllib.error.URLError):
            return False

    def resources(self, *, refresh: bool = False) -> dict[tuple[str, str], tuple[str, bool]]:
        """(apiVersion, kind) -> (collection path prefix, namespaced) for every served kind."""
        if self._resources is not None and not refresh:
            return self._resources
        found: dict[tuple[str, str], tuple[str, bool]] = {}
        versions = [("v1", "/api/v1")]
        groups = self.request("GET", "/apis").body or {}
        for group in groups.get("groups", []):
            for version in group.get("versions", []):
                versions.append((version["groupVersion"], f"/apis/{version['groupVersion']}"))
        for api_version, prefix in versions:
            listing = self.request("GET", prefix)
            if listing.status != 200:
                continue
            for resource in listing.body.get("resources", []):
                if "/" in resource["name"]:
                    continue   # subresources
                found[(api_version, resource["kind"])] = (f"{prefix}|{resource['name']}", resource["namespaced"])
        self._resources = found
        return found

    def collection_path(self, api_version: str, kind: str, namespace: str | None) -> str | None:
        entry = self.resources().get((api_version, kind))
        if entry is None:
            return None
        prefix_name, namespaced = entry
        prefix, name = prefix_name.split("|")
        if namespaced:
            return f"{prefix}/namespaces/{namespace or 'default'}/{name}"
        return f"{prefix}/{name}"

    def namespaced(self, api_version: str, kind: str) -> bool:
        return self.resources()[(api_version, kind)][1]


def _decode(raw: bytes):
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
