"""Loading a simcluster scenario into the real control plane.

The file is parsed by simcluster's own loader, so both tiers accept exactly the same
scenarios and reject the same mistakes. What changes on the way in:
- every Node becomes a KWOK node (annotation `kwok.x-k8s.io/node: fake`), keeping its
  labels and its capacity and allocatable (`nvidia.com/gpu` included); KWOK then plays
  its kubelet (conditions, heartbeats, pod status);
- server-set metadata of a dump (uid, resourceVersion, creationTimestamp, managedFields)
  is dropped, and so are ownerReferences: their uids named the dump's owners, which do
  not exist here, and the garbage collector would delete the orphans; the controllers
  adopt them again by label instead;
- objects whose kind the apiserver does not serve (Knative, KServe, Kubeflow… until their
  CRDs are installed) are skipped, and named in a warning.
"""
from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from simcluster.scenario import Scenario, load
from simcluster.sim import SimSettings

from .client import Api

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_VALUE = "fake"
SERVER_SET_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation",
                       "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences")


class LoadError(RuntimeError):
    """The apiserver refused a scenario object; the message names it and says why."""


@dataclass
class LoadResult:
    created: int = 0
    skipped: Counter = field(default_factory=Counter)   # "apiVersion Kind" -> count
    settings_not_applied: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        lines = []
        if self.skipped:
            kinds = ", ".join(f"{kind} ({count})" for kind, count in sorted(self.skipped.items()))
            lines.append(f"skipped {sum(self.skipped.values())} objects whose kinds this cluster does not serve "
                         f"(their CRDs are not installed): {kinds}")
        if self.settings_not_applied:
            lines.append("Simulation settings with no effect on the real tier: "
                         + ", ".join(self.settings_not_applied))
        return lines


def scenario_read(path) -> Scenario:
    return load(path)


def placement(scenario: Scenario) -> str:
    return scenario.settings.placement


def _settings_not_applied(settings: SimSettings) -> list[str]:
    defaults = SimSettings()
    ignored = []
    for spec_field in dataclasses.fields(SimSettings):
        if spec_field.name == "placement":
            continue   # the scheduler's scoring strategy (see cluster.scheduler_config)
        if getattr(settings, spec_field.name) != getattr(defaults, spec_field.name):
            note = {"knative_version": " (with --with knative this tier runs Knative Serving 1.15)",
                    "kserve_version": " (with --with kserve this tier runs KServe 0.14.1)",
                    "tokens": " (honoured: they are in the apiserver's token file)"}.get(spec_field.name, "")
            if spec_field.name != "tokens":
                ignored.append(f"spec.{spec_field.name}{note}")
    return ignored


def _describe(doc: dict) -> str:
    meta = doc.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<no name>"
    if meta.get("namespace"):
        name = f"{meta['namespace']}/{name}"
    return f"{doc.get('kind')} {name}"


def manifest_for_real(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    meta = doc.setdefault("metadata", {})
    for key in SERVER_SET_METADATA:
        meta.pop(key, None)
    if doc.get("kind") == "Node" and doc.get("apiVersion") == "v1":
        meta.setdefault("annotations", {})[KWOK_ANNOTATION] = KWOK_VALUE
        meta.setdefault("labels", {})["type"] = "kwok"
        status = doc.get("status") or {}
        # KWOK writes conditions, addresses and daemon endpoints as its kubelet would;
        # capacity and allocatable (the GPUs) are what the scenario says.
        doc["status"] = {key: status[key] for key in ("capacity", "allocatable", "nodeInfo") if key in status}
    elif doc.get("kind") == "Pod":
        doc.pop("status", None)
    return doc


def scenario_apply(api: Api, scenario: Scenario) -> LoadResult:
    """Create the scenario's objects: namespaces and nodes first, then the rest in order."""
    result = LoadResult(settings_not_applied=_settings_not_applied(scenario.settings))
    order = {"Namespace": 0, "Node": 1}
    objects = sorted(scenario.objects, key=lambda entry: order.get(entry[1].get("kind"), 2))
    namespaces = {"default", "kube-system", "kube-public", "kube-node-lease"}
    for where, doc in objects:
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        if (api_version, kind) not in api.resources():
            result.skipped[f"{api_version} {kind}"] += 1
            continue
        manifest = manifest_for_real(doc)
        namespace = None
        if api.namespaced(api_version, kind):
            namespace = manifest["metadata"].setdefault("namespace", "default")
            if namespace not in namespaces:
                _create(api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": namespace}}, scenario, where,
                        exists_ok=True)
                namespaces.add(namespace)
        if kind == "Namespace":
            namespaces.add(manifest["metadata"]["name"])
        path = api.collection_path(api_version, kind, namespace)
        result.created += _create(api, path, manifest, scenario, where, exists_ok=kind == "Namespace")
    return result


def _create(api: Api, path: str, manifest: dict, scenario: Scenario, where: str, *, exists_ok: bool) -> int:
    answer = api.request("POST", path, manifest)
    if answer.status in (200, 201):
        return 1
    if answer.status == 409 and exists_ok:
        return 0
    message = answer.body.get("message") if isinstance(answer.body, dict) else answer.body
    raise LoadError(f"{scenario.source}: {where} ({_describe(manifest)}): the apiserver answered "
                    f"{answer.status}: {message}")
