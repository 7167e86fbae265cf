"""Fixtures for the simulated cluster's API tests: a running server (manual clock), the
official `kubernetes` client pointed at it, and `kubectl` with its kubeconfig."""
from __future__ import annotations

import json
import shutil
import subprocess

import kubernetes
import pytest

from simcluster.control import SimControl
from simcluster.server import ClusterServer

NODES_AND_NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {capacity.io/org: team-a}}
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-1
  labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
status:
  capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
  allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8", pods: "110"}
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-2
  labels: {nvidia.com/gpu.product: NVIDIA-A10G}
status:
  capacity: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "1", pods: "110"}
  allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "1", pods: "110"}
  conditions: [{type: Ready, status: "True"}]
"""


class Kube:
    """The official client's APIs on one running simulated cluster."""

    def __init__(self, server: ClusterServer):
        self.server = server
        self.url = server.url
        self.kubeconfig = str(server.kubeconfig_path)
        self.api_client = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.apps = kubernetes.client.AppsV1Api(self.api_client)
        self.policy = kubernetes.client.PolicyV1Api(self.api_client)
        self.custom = kubernetes.client.CustomObjectsApi(self.api_client)
        self.control = SimControl(self.url)

    @property
    def sim(self):
        return self.server.sim

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run([KUBECTL, "--kubeconfig", self.kubeconfig, *args], capture_output=True,
                                text=True, timeout=60, input=input)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


KUBECTL = shutil.which("kubectl") or "kubectl"


@pytest.fixture
def kube_factory(tmp_path):
    """`make(scenario=NODES_AND_NAMESPACE, **ClusterServer options)` → Kube; stopped after the test."""
    started: list[Kube] = []

    def make(scenario=NODES_AND_NAMESPACE, **options) -> Kube:
        server = ClusterServer(scenario, kubeconfig_out=tmp_path / f"kubeconfig-{len(started)}", **options)
        server.start()
        kube = Kube(server)
        started.append(kube)
        return kube

    yield make
    for kube in started:
        kube.api_client.close()
        kube.server.stop()


@pytest.fixture
def kube(kube_factory) -> Kube:
    """A simulated cluster with namespace team-a and two GPU nodes, and clients for it."""
    return kube_factory()
