from __future__ import annotations

import pytest

from clusters import kube as kube_gateway
from defrag_cluster import Kube


class DefragWorld:
    """A running simulated cluster (the root `sim_cluster_factory`), its Cluster row, a
    gateway whose retries do not wait, and the official client for the user's view."""

    def __init__(self, handle):
        self.handle = handle
        self.control = handle.control
        self.cluster = handle.cluster
        self.cluster.name = "sim"
        self.cluster.save(update_fields=["name"])
        # Retries without waiting: 5xx faults must not slow the suite (the policy is what is tested).
        self.gateway = kube_gateway.KubeGateway.from_kubeconfig(handle.kubeconfig_path, name="sim",
                                                                retry_attempts=3, backoff=0.0, sleep=lambda s: None)
        self.kube = Kube(handle.kubeconfig_path)

    def now(self):
        return self.handle.sim.clock.now()

    def advance(self, seconds: float):
        self.control.advance(seconds)
        return self.now()


@pytest.fixture
def defrag_world(sim_cluster_factory):
    """`start(scenario_objects) -> DefragWorld`, settled (pods Running and Ready)."""

    def start(objects, settle: float = 60.0) -> DefragWorld:
        world = DefragWorld(sim_cluster_factory(objects))
        world.advance(settle)
        return world

    return start
