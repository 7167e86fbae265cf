"""Builders for binpack scenarios on the simulated cluster: GPU node sets, Kthena
ModelServings whose groups are placed on chosen nodes (bound through the `binding`
subresource, as a scheduler does), scale-down, and counting freed GPU nodes.

Each scenario comes in two copies on disjoint node sets, in one cluster: "with" (the
binpack service costs its pods) and "without" (its ModelServings opt out with
`capacity.io/binpack: "false"`, so they keep Kthena's default index order)."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import kubernetes

from simcluster.generate import namespace as namespace_doc
from simcluster.generate import node as node_doc

GROUP, VERSION, PLURAL = "workload.serving.volcano.sh", "v1alpha1", "modelservings"
POOL = "capacity.io/pool"
# The scenario's pods name a scheduler of their own, so the cluster's default scheduler
# leaves them Pending and `World.place` binds each where the scenario says (what a
# second scheduler does, through the same `binding` subresource).
PLACER = "binpack-scenario-placer"


@dataclass
class Scenario:
    """`placement[w]` = the node index of each of workload w's groups; `shrink[w]` =
    how many groups w loses."""
    nodes: int
    placement: dict[str, list[int]]
    shrink: dict[str, int]

    def freed(self, deleted: dict[str, set[int]]) -> int:
        used = {n for w, nodes in self.placement.items() for g, n in enumerate(nodes) if g not in deleted[w]}
        return self.nodes - len(used)

    def optimum(self) -> int:
        """The most nodes any choice of deletions frees (exhaustive search)."""
        choices = [[set(c) for c in itertools.combinations(range(len(self.placement[w])), self.shrink[w])]
                   for w in self.placement]
        return max(self.freed(dict(zip(self.placement, combo))) for combo in itertools.product(*choices))

    def default_order(self) -> int:
        """Kthena with no costs: the highest group indexes go."""
        return self.freed({w: set(range(len(g) - self.shrink[w], len(g))) for w, g in self.placement.items()})


def random_scenario(rng: random.Random, *, workloads: tuple[int, int], shrink_one: bool) -> Scenario:
    nodes = rng.randint(3, 4)
    names = [f"w{i}" for i in range(rng.randint(*workloads))]
    placement = {w: [] for w in names}
    for _ in range(rng.randint(4, 8)):
        placement[rng.choice(names)].append(rng.randrange(nodes))
    placement = {w: g for w, g in placement.items() if g}
    first = next(iter(placement))
    shrink = {w: (rng.randint(1, len(g)) if (w == first or not shrink_one) else 0) for w, g in placement.items()}
    return Scenario(nodes, placement, shrink)


def node_name(tag: str, index: int) -> str:
    return f"{tag}-n{index}"


def cluster_docs(tags_nodes: dict[str, int]) -> list[dict]:
    docs = []
    for tag, count in tags_nodes.items():
        for i in range(count):
            doc = node_doc(node_name(tag, i), pool=tag, product="NVIDIA-H100-80GB-HBM3", gpus=8, cpu="192",
                           memory="2000Gi")
            docs.append(doc)
        docs.append(namespace_doc(tag))
    return docs


def modelserving(tag: str, name: str, groups: int, *, opt_out: bool) -> dict:
    annotations = {"capacity.io/binpack": "false"} if opt_out else {}
    template = {"spec": {"schedulerName": PLACER, "nodeSelector": {POOL: tag}, "containers": [{
        "name": "serve", "image": "vllm/vllm-openai:v0.6",
        "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelServing",
            "metadata": {"name": name, "namespace": tag, "annotations": annotations},
            "spec": {"replicas": groups, "template": {"roles": [
                {"name": "serve", "replicas": 1, "entryTemplate": template, "workerReplicas": 0}]}}}


class World:
    """Kubernetes clients on one simulated cluster, and the scenario copies in it."""

    def __init__(self, handle):
        self.handle = handle
        self.api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
        self.crd = kubernetes.client.CustomObjectsApi(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)

    def close(self):
        self.api.close()

    def deploy(self, tag: str, scenario: Scenario, *, opt_out: bool) -> None:
        for w, groups in scenario.placement.items():
            self.crd.create_namespaced_custom_object(GROUP, VERSION, tag, PLURAL,
                                                     modelserving(tag, w, len(groups), opt_out=opt_out))

    def place(self, tag: str, scenario: Scenario) -> None:
        """Bind each group's pod to its node (pods already bound stay where they are)."""
        for pod in self.core.list_namespaced_pod(tag).items:
            if pod.spec.node_name:
                continue
            labels = pod.metadata.labels
            w = labels["modelserving.volcano.sh/name"]
            group = int(labels["modelserving.volcano.sh/group-name"].rsplit("-", 1)[1])
            target = node_name(tag, scenario.placement[w][group])
            body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.metadata.name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": target}}
            # The client cannot read back a Binding (its model wants fields the answer
            # lacks), so the answer is taken raw.
            self.core.create_namespaced_pod_binding(pod.metadata.name, tag, body, _preload_content=False)

    def shrink(self, tag: str, scenario: Scenario) -> None:
        for w, groups in scenario.placement.items():
            if scenario.shrink[w]:
                self.crd.patch_namespaced_custom_object(GROUP, VERSION, tag, PLURAL, w, {
                    "spec": {"replicas": len(groups) - scenario.shrink[w]}})

    def freed(self, tag: str, nodes: int) -> int:
        used = {p.spec.node_name for p in self.core.list_namespaced_pod(tag).items
                if p.spec.node_name and not p.metadata.deletion_timestamp}
        return sum(1 for i in range(nodes) if node_name(tag, i) not in used)
