"""How long the store keeps its history of writes (the versions a watch or a paged LIST
at an older resourceVersion reads), and that versions sharing unchanged parts read
exactly as they were written."""
from __future__ import annotations

import time

import orjson
import pytest

from simcluster import errors
from simcluster.generate import generate
from simcluster.resources import NOTEBOOKS, PODS
from simcluster.server import build_simulation
from simcluster.sim import SimSettings
from simcluster.store import ExpiredView, copy

DOCS = [d for d in generate(nodes=2, pods=12, seed=5) if d.get("kind") != "Simulation"]


class FakeMonotonic:
    """Real time as the store reads it, moved on by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def _store(history_seconds: float = 300.0):
    sim = build_simulation(copy(DOCS), settings=SimSettings(history_seconds=history_seconds))
    clock = FakeMonotonic()
    sim.store.monotonic = clock
    return sim.store, clock


def _annotate(store, pod: dict, value: str) -> dict:
    new = copy(store.get(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"]))
    new["metadata"].setdefault("annotations", {})["controller.kubernetes.io/pod-deletion-cost"] = value
    return store.update(PODS, new)


def _cost(pod: dict) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost")


def test_a_paged_list_reads_its_first_pages_version_within_the_history_window():
    store, clock = _store()
    first = store.list_page(PODS, limit=4)
    later = store.list(PODS)[0][-1]
    _annotate(store, later, "7")
    clock.now += 299
    _annotate(store, store.list(PODS)[0][0], "8")
    rest = store.list_page(PODS, after=first.last_key, at_rv=first.rv)
    assert _cost(rest.items[-1]) is None          # as it stood when the first page was read
    assert _cost(store.get(PODS, later["metadata"]["namespace"], later["metadata"]["name"])) == "7"
    assert len(first.items) + len(rest.items) == 12


def test_writes_older_than_the_history_window_answer_410():
    store, clock = _store()
    first = store.list_page(PODS, limit=4)
    _annotate(store, store.list(PODS)[0][-1], "7")
    recent_rv = store.resource_version
    clock.now += 301
    _annotate(store, store.list(PODS)[0][0], "8")   # a write after the window moves the horizon
    with pytest.raises(ExpiredView):
        store.list_page(PODS, after=first.last_key, at_rv=first.rv)
    with pytest.raises(errors.ApiError) as gone:
        store.events_since(first.rv)
    assert gone.value.code == 410
    # A version inside the window is still readable, with the write after it.
    assert [e.type for e in store.events_since(recent_rv)] == ["MODIFIED"]
    assert len(store.list_page(PODS, at_rv=recent_rv).items) == 12


def test_without_a_window_only_the_length_of_the_history_bounds_it():
    store, clock = _store(history_seconds=0)
    first = store.list_page(PODS, limit=4)
    _annotate(store, store.list(PODS)[0][-1], "7")
    clock.now += 10_000
    _annotate(store, store.list(PODS)[0][0], "8")
    rest = store.list_page(PODS, after=first.last_key, at_rv=first.rv)
    assert len(first.items) + len(rest.items) == 12
    assert [e.type for e in store.events_since(first.rv)] == ["MODIFIED", "MODIFIED"]


def test_a_new_version_reads_exactly_as_written_and_the_old_one_as_it_was():
    store, _ = _store()
    notebook = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                "metadata": {"name": "nb", "namespace": "default"},
                "spec": {"replicas": 1, "ratio": 0.0, "flags": [1, 0], "template": {"a": "x", "b": "y"}}}
    created = store.create(NOTEBOOKS, notebook)
    before_rv = store.resource_version
    changed = copy(created)
    # Equal in Python but not the same JSON: true is not 1, -0.0 is not 0.0, key order shows.
    changed["spec"] = {"replicas": True, "ratio": -0.0, "flags": [True, False], "template": {"b": "y", "a": "x"}}
    store.update(NOTEBOOKS, changed)
    now = orjson.loads(orjson.dumps(store.get(NOTEBOOKS, "default", "nb")))
    assert orjson.dumps(now["spec"]) == b'{"replicas":true,"ratio":-0.0,"flags":[true,false],"template":{"b":"y","a":"x"}}'
    old = store.list_page(NOTEBOOKS, "default", at_rv=before_rv).items[0]
    assert orjson.dumps(old["spec"]) == b'{"replicas":1,"ratio":0.0,"flags":[1,0],"template":{"a":"x","b":"y"}}'
    # And what the LIST serves (the per-version JSON) is the same bytes.
    served = store.encode_items(NOTEBOOKS, store.list(NOTEBOOKS, "default")[0])
    assert orjson.loads(served[0])["spec"] == now["spec"]
    assert orjson.dumps(orjson.loads(served[0])["spec"]) == orjson.dumps(now["spec"])
