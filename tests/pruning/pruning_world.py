"""A simulated GPU cluster, its DCGM history, and a Prometheus holding it — for prune tests.

Workloads are created through the official `kubernetes` client; the simulated clock is
advanced through the control endpoint; history comes from the simulated exporter's
`/metrics`, scraped once per simulated minute and backfilled into Prometheus.
"""
from __future__ import annotations

import contextlib
import urllib.request
from datetime import datetime

import kubernetes
from kubernetes import client as k8s
from tests.prometheus_fixtures import parse_exposition

from clusters.kube import KubeGateway
from clusters.prometheus import PrometheusGateway
from simcluster.control import SimControl
from simcluster.generate import inference_service as _isvc
from simcluster.generate import namespace, node, resources
from simcluster.sim import SimSettings
from simcluster.testing import running_cluster

GPU_MODEL = "NVIDIA-A10G"  # as GPU feature discovery labels nodes (no spaces in label values)
UTIL = "simcluster.io/gpu-utilization"
NAMESPACES = ("team-a", "team-b", "team-c", "no-prune", "held", "napping")  # kube-system exists already


def _template(name: str, gpus: int, util: str, labels: dict | None = None) -> dict:
    return {"metadata": {"labels": {"app": name, **(labels or {})}, "annotations": {UTIL: util}},
            "spec": {"containers": [{"name": "main", "image": "registry.example.com/model:1",
                                     "resources": resources(cpu="1", memory="1Gi", gpus=gpus)}]}}


def deployment(name, ns, *, replicas=1, gpus=1, util="0", annotations=None) -> dict:
    meta = {"name": name, "namespace": ns, "annotations": dict(annotations or {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": _template(name, gpus, util)}}


def replicaset(name, ns, *, replicas=1, gpus=1, util="0") -> dict:
    obj = deployment(name, ns, replicas=replicas, gpus=gpus, util=util)
    obj["kind"] = "ReplicaSet"
    return obj


def statefulset(name, ns, *, replicas=1, gpus=1, util="0") -> dict:
    obj = deployment(name, ns, replicas=replicas, gpus=gpus, util=util)
    obj["kind"] = "StatefulSet"
    obj["spec"]["serviceName"] = name
    return obj


def notebook(name, ns, *, gpus=1, util="0") -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": name, "namespace": ns},
            "spec": {"template": _template(name, gpus, util)}}


def inference_service(name, ns, *, gpus=1, util="0", min_replicas=1) -> dict:
    return _isvc(ns, name, product=GPU_MODEL, gpus=gpus, min_replicas=min_replicas, utilization=util)


_CUSTOM = {"Notebook": ("kubeflow.org", "v1", "notebooks"), "Service": ("serving.knative.dev", "v1", "services"),
           "InferenceService": ("serving.kserve.io", "v1beta1", "inferenceservices")}


class World:
    def __init__(self, server, tmp_path):
        self.server = server
        self.url = server.url
        self.kubeconfig = str(server.kubeconfig_path)
        self.tmp_path = tmp_path
        self.api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)
        self.gateway = KubeGateway.from_kubeconfig(self.kubeconfig)
        self.control = SimControl(self.url)
        self.history: dict = {}
        self.prometheus_factory = None

    @classmethod
    @contextlib.contextmanager
    def start(cls, tmp_path, *, kserve_version: str = "0.15", nodes: int = 4):
        docs = [node(f"gpu-{i}", pool="a10g", product=GPU_MODEL, gpus=8) for i in range(nodes)]
        docs += [namespace(ns) for ns in NAMESPACES]
        with running_cluster(docs, settings=SimSettings(kserve_version=kserve_version)) as server:
            world = cls(server, tmp_path)
            try:
                yield world
            finally:
                world.gateway.close()
                world.api.close()

    def fast_gateway(self) -> KubeGateway:
        """A gateway that gives up after two attempts without waiting (fault tests)."""
        return KubeGateway.from_kubeconfig(self.kubeconfig, retry_attempts=2, backoff=0.0)

    def now(self) -> datetime:
        return self.server.sim.clock.now()

    def create(self, obj: dict) -> None:
        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        if kind in _CUSTOM:
            group, version, plural = _CUSTOM[kind]
            k8s.CustomObjectsApi(self.api).create_namespaced_custom_object(group, version, ns, plural, obj)
        else:
            apps = k8s.AppsV1Api(self.api)
            create = {"Deployment": apps.create_namespaced_deployment, "ReplicaSet": apps.create_namespaced_replica_set,
                      "StatefulSet": apps.create_namespaced_stateful_set}[kind]
            create(ns, obj)
        self.control.advance(0)

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            return response.read().decode()

    def record_history(self, *, minutes: int, at_minute: dict | None = None, gaps: dict | None = None,
                       every_seconds: int = 60) -> None:
        """Scrape `/metrics` once per `every_seconds` of simulated time for `minutes`.

        `at_minute`: {minute: callable} run before that minute's scrape (e.g. create a
        workload halfway). `gaps`: {(namespace, pod name prefix): (from, to)} minutes
        whose samples of those pods are dropped, as when the exporter went missing."""
        self.control.advance(30)   # pods scheduled and started before history begins
        start = self.now()
        steps = minutes * 60 // every_seconds
        for i in range(steps + 1):
            minute = i * every_seconds // 60
            if at_minute and i * every_seconds % 60 == 0 and minute in at_minute:
                at_minute[minute]()
            parse_exposition(self.scrape(), self.now(), self.history)
            if i < steps:
                self.control.advance(every_seconds)
        for (ns, prefix), (frm, to) in (gaps or {}).items():
            for (_, labels), series in self.history.items():
                lab = dict(labels)
                if lab.get("namespace") == ns and lab.get("pod", "").startswith(prefix):
                    series.samples = [(t, v) for t, v in series.samples
                                      if not frm * 60 <= (t - start).total_seconds() < to * 60]

    def prometheus(self, *, transform=None) -> PrometheusGateway:
        series = [s for s in self.history.values() if s.samples]
        if transform:
            series = transform(series)
        return PrometheusGateway(self.prometheus_factory(series).url)


def knative_service(name, ns, *, gpus=1, util="0", min_scale="1") -> dict:
    """A GPU Knative Service (not through KServe); min-scale 1 keeps it up without traffic."""
    template = _template(name, gpus, util)
    del template["metadata"]["labels"]["app"]   # Knative sets app=<revision>
    template["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] = min_scale
    template["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": GPU_MODEL}
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"template": template}}
