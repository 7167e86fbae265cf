"""Kubeflow Notebook -> StatefulSet, stopped and started by `kubeflow-resource-stopped`."""
from __future__ import annotations

from simcluster.controllers import default_controllers
from simcluster.resources import NAMESPACES, NOTEBOOKS, STATEFULSETS
from simcluster.sim import Simulation
from simcluster.store import copy

NS = "org-acme"


def test_notebook_stop_and_start():
    sim = Simulation(controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    sim.store.create(NOTEBOOKS, {"metadata": {"name": "scratch", "namespace": NS}, "spec": {"template": {"spec": {
        "containers": [{"name": "scratch", "image": "jupyter:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    sim.run_to_rest()
    sts = sim.store.get(STATEFULSETS, NS, "scratch")
    assert sts["spec"]["replicas"] == 1
    assert sts["metadata"]["ownerReferences"][0]["kind"] == "Notebook"
    assert sts["spec"]["template"]["metadata"]["labels"]["notebook-name"] == "scratch"
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    stopped = copy(sim.store.get(NOTEBOOKS, NS, "scratch"))
    stopped["metadata"]["annotations"] = {"kubeflow-resource-stopped": "2026-11-23T02:00:00Z"}
    sim.store.put(NOTEBOOKS, stopped)
    sim.run_to_rest()
    assert sim.store.get(STATEFULSETS, NS, "scratch")["spec"]["replicas"] == 0

    started = copy(sim.store.get(NOTEBOOKS, NS, "scratch"))
    started["metadata"]["annotations"].pop("kubeflow-resource-stopped")
    sim.store.put(NOTEBOOKS, started)
    sim.run_to_rest()
    assert sim.store.get(STATEFULSETS, NS, "scratch")["spec"]["replicas"] == 1


def test_the_notebook_controller_reverts_a_direct_scale_of_its_statefulset():
    sim = Simulation(controllers=default_controllers())
    sim.store.create(NAMESPACES, {"metadata": {"name": NS}})
    sim.store.create(NOTEBOOKS, {"metadata": {"name": "nb", "namespace": NS},
                                 "spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "j"}]}}}})
    sim.run_to_rest()
    scaled = copy(sim.store.get(STATEFULSETS, NS, "nb"))
    scaled["spec"]["replicas"] = 0
    sim.store.put(STATEFULSETS, scaled)
    sim.run_to_rest()
    assert sim.store.get(STATEFULSETS, NS, "nb")["spec"]["replicas"] == 1
