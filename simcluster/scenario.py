"""Scenarios: what the simulated cluster holds when it starts.

A scenario is a multi-document YAML of ordinary manifests, or a `kubectl get -o json`
dump (a `v1 List`), plus at most one `simcluster.io/v1alpha1 Simulation` document whose
`spec` sets `SimSettings` fields. Objects keep the metadata and status they are given,
so a replayed dump (pods born hours ago, bound to nodes, Running) is faithful.
Anything malformed is a `ScenarioError` naming the file, the document and the field.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from . import errors
from .resources import NAMESPACES, NODES, by_kind
from .sim import SimSettings, Simulation

SIMULATION_API_VERSION = "simcluster.io/v1alpha1"


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message says where and why."""


@dataclass
class Scenario:
    source: str
    settings: SimSettings = field(default_factory=SimSettings)
    # (where, manifest): `where` is "document 3" or "document 1 item 7", for errors.
    objects: list[tuple[str, dict]] = field(default_factory=list)
    # The manifests were parsed here and nothing else holds them: the first `apply`
    # stores them as they are instead of copying each (half the memory at load).
    owned: bool = False


def _read(source) -> tuple[str, list]:
    """(name for errors, documents)."""
    if isinstance(source, (list, tuple)):
        return "<objects>", list(source)
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and (os.path.exists(source) or source.endswith((".yaml", ".yml", ".json")))):
        path = Path(source)
        try:
            # Bytes: orjson parses them directly, without a decoded copy of the file.
            text = path.read_bytes()
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read the scenario: {exc.strerror}") from None
        name = str(path)
    elif isinstance(source, str):
        text, name = source, "<scenario text>"
    else:
        raise ScenarioError(f"a scenario is a path, YAML text or a list of objects, not {type(source).__name__}")
    if text[:4096].lstrip()[:1] in ("{", "[", b"{", b"["):
        # A `kubectl get -o json` dump: JSON is YAML, but a pure-Python YAML parse of a
        # 10,000-pod dump takes a minute and a GiB; orjson takes a fraction of a second.
        try:
            doc = orjson.loads(text)
            return name, doc if isinstance(doc, list) else [doc]
        except orjson.JSONDecodeError:
            pass   # not JSON after all (a YAML flow mapping): the YAML parser says why
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise ScenarioError(f"{name}: not UTF-8 text: {exc}") from None
    try:
        # libyaml's loader when PyYAML has it: same documents, several times faster.
        return name, [doc for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))]
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{name}: not valid YAML: {exc}") from None


# Seconds and concurrencies in a Simulation document: a billion is ~32 years, beyond
# which date arithmetic on the simulated clock overflows.
_MAX_SETTING = 1e9


def _settings(name: str, where: str, doc: dict) -> SimSettings:
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        raise ScenarioError(f"{name}: {where} (Simulation): spec must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(SimSettings)}
    values = {}
    for key, value in spec.items():
        if key not in fields:
            raise ScenarioError(f"{name}: {where} (Simulation): unknown field spec.{key}; "
                                f"known: {', '.join(sorted(fields))}")
        default = fields[key].default if fields[key].default is not dataclasses.MISSING else \
            fields[key].default_factory()
        if isinstance(default, float) and not isinstance(value, bool) and isinstance(value, (int, float)):
            value = float(value)
        if type(value) is not type(default):
            raise ScenarioError(f"{name}: {where} (Simulation): spec.{key} must be a "
                                f"{type(default).__name__}, got {value!r}")
        if isinstance(value, float) and not (math.isfinite(value) and 0 <= value <= _MAX_SETTING):
            raise ScenarioError(f"{name}: {where} (Simulation): spec.{key} must be a number from 0 to "
                                f"{_MAX_SETTING:g}, got {value!r}")
        values[key] = value
    if values.get("placement", "spread") not in ("spread", "most-allocated"):
        raise ScenarioError(f"{name}: {where} (Simulation): spec.placement must be spread or most-allocated, "
                            f"got {values['placement']!r}")
    if values.get("anonymous_access", "admin") not in ("admin", "rbac", "reject"):
        raise ScenarioError(f"{name}: {where} (Simulation): spec.anonymous_access must be admin, rbac or reject, "
                            f"got {values['anonymous_access']!r}")
    return SimSettings(**values)


def load(source) -> Scenario:
    name, documents = _read(source)
    scenario = Scenario(source=name, owned=not isinstance(source, (list, tuple)))
    seen_settings = False
    for index, doc in enumerate(documents, start=1):
        where = f"document {index}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ScenarioError(f"{name}: {where}: a manifest must be a mapping, got {type(doc).__name__}")
        if doc.get("apiVersion") == SIMULATION_API_VERSION and doc.get("kind") == "Simulation":
            if seen_settings:
                raise ScenarioError(f"{name}: {where}: a second Simulation document; at most one is allowed")
            scenario.settings, seen_settings = _settings(name, where, doc), True
        elif doc.get("kind") == "List" or (isinstance(doc.get("kind"), str) and doc["kind"].endswith("List")
                                           and "items" in doc):
            items = doc.get("items")
            if not isinstance(items, list):
                raise ScenarioError(f"{name}: {where} (List): items must be a list")
            for item_index, item in enumerate(items, start=1):
                scenario.objects.append((f"{where} item {item_index}", item))
        else:
            scenario.objects.append((where, doc))
    return scenario


def _describe(doc: dict) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name") or meta.get("generateName") or "<no name>"
    if meta.get("namespace"):
        name = f"{meta['namespace']}/{name}"
    return f"{doc.get('kind', '<no kind>')} {name}"


def apply(sim: Simulation, scenario: Scenario) -> int:
    """Create the scenario's objects in `sim`'s store: nodes and namespaces first,
    then namespaces referenced but not declared, then the rest in document order."""
    typed = []
    for where, doc in scenario.objects:
        if not isinstance(doc, dict):
            raise ScenarioError(f"{scenario.source}: {where}: a manifest must be a mapping, got {type(doc).__name__}")
        for required in ("apiVersion", "kind"):
            if not doc.get(required):
                raise ScenarioError(f"{scenario.source}: {where} ({_describe(doc)}): {required}: Required value")
        if not isinstance(doc.get("metadata"), dict):
            raise ScenarioError(f"{scenario.source}: {where} ({_describe(doc)}): metadata: Required value "
                                "(a mapping with a name)")
        rtype = by_kind(doc["apiVersion"], doc["kind"])
        if rtype is not None and rtype.group in sim.settings.unserved_groups:
            raise ScenarioError(f"{scenario.source}: {where}: {doc['kind']} is in API group {rtype.group!r}, "
                                "which this scenario's Simulation says is not served (spec.unserved_groups)")
        if rtype is None:
            raise ScenarioError(f"{scenario.source}: {where}: unknown kind {doc['kind']!r} in apiVersion "
                                f"{doc['apiVersion']!r}: the simulated cluster does not serve it")
        typed.append((where, rtype, doc))
    order = {NAMESPACES.key: 0, NODES.key: 1}
    typed.sort(key=lambda entry: order.get(entry[1].key, 2))   # stable: document order otherwise
    store = sim.store
    created = 0
    declared: set[str] = set()
    owned, scenario.owned = scenario.owned, False   # handed over once; a second apply copies
    with store.lock:
        for where, rtype, doc in typed:
            namespace = doc["metadata"].get("namespace") if rtype.namespaced else None
            if rtype.namespaced and not namespace:
                doc = {**doc, "metadata": {**doc["metadata"], "namespace": "default"}}
                namespace = "default"
            if namespace and store.get(NAMESPACES, None, namespace) is None:
                ensure_namespace(sim, namespace)
            name = doc["metadata"].get("name")
            if rtype is NAMESPACES and name not in declared and store.get(NAMESPACES, None, name) is not None:
                # A namespace every cluster has (`default`, as any `kubectl get ns -o json`
                # dump holds it): the declared one, labels and all, replaces the built-in.
                store.remove(NAMESPACES, None, name)
            if rtype is NAMESPACES:
                declared.add(name)
            try:
                store.create(rtype, doc, keep_metadata=True, owned=owned)
            except errors.ApiError as exc:
                raise ScenarioError(f"{scenario.source}: {where} ({_describe(doc)}): {exc.message}") from None
            created += 1
    return created


def ensure_namespace(sim: Simulation, name: str) -> None:
    if sim.store.get(NAMESPACES, None, name) is None:
        sim.store.create(NAMESPACES, {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
                                      "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
