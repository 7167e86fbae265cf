"""The resource types the simulated cluster serves, as discovery describes them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    group: str            # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()   # "status", "scale", "eviction", "binding"
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list",
                              "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key: one store per group and plural, whatever the version."""
        return f"{self.group}/{self.plural}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()


def _core(kind, plural, namespaced=True, short=(), sub=()):
    return ResourceType("", "v1", kind, plural, namespaced, tuple(short), tuple(sub))


RESOURCE_TYPES: tuple[ResourceType, ...] = (
    _core("Namespace", "namespaces", namespaced=False, short=("ns",), sub=("status",)),
    _core("Node", "nodes", namespaced=False, short=("no",), sub=("status",)),
    _core("Pod", "pods", short=("po",), sub=("status", "eviction", "binding")),
    _core("Service", "services", short=("svc",), sub=("status",)),
    _core("Event", "events", short=("ev",)),
    _core("ConfigMap", "configmaps", short=("cm",)),
    ResourceType("events.k8s.io", "v1", "Event", "events", True, ("ev",)),
    ResourceType("apps", "v1", "Deployment", "deployments", True, ("deploy",), ("status", "scale")),
    ResourceType("apps", "v1", "ReplicaSet", "replicasets", True, ("rs",), ("status", "scale")),
    ResourceType("apps", "v1", "StatefulSet", "statefulsets", True, ("sts",), ("status", "scale")),
    ResourceType("apps", "v1", "DaemonSet", "daemonsets", True, ("ds",), ("status",)),
    ResourceType("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, ("pdb",), ("status",)),
    ResourceType("serving.knative.dev", "v1", "Service", "services", True, ("kservice", "ksvc"), ("status",)),
    ResourceType("serving.knative.dev", "v1", "Configuration", "configurations", True, ("config", "cfg"), ("status",)),
    ResourceType("serving.knative.dev", "v1", "Revision", "revisions", True, ("rev",), ("status",)),
    ResourceType("autoscaling.internal.knative.dev", "v1alpha1", "PodAutoscaler", "podautoscalers", True,
                 ("kpa", "pa"), ("status",)),
    ResourceType("serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices", True,
                 ("isvc",), ("status",)),
    ResourceType("kubeflow.org", "v1", "Notebook", "notebooks", True, (), ("status",)),
    ResourceType("workload.serving.volcano.sh", "v1alpha1", "ModelServing", "modelservings", True,
                 (), ("status",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _core("ServiceAccount", "serviceaccounts", short=("sa",)),
)

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCE_TYPES}
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCE_TYPES}


def by_path(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return _BY_KIND.get((api_version, kind))


def kind_of(group: str, plural: str) -> ResourceType:
    """The resource type of a storage key's parts, for code that knows no version."""
    for r in RESOURCE_TYPES:
        if r.group == group and r.plural == plural:
            return r
    raise KeyError(f"{group}/{plural}")


# Short names for code inside the simulated cluster.
NAMESPACES = by_path("", "v1", "namespaces")
NODES = by_path("", "v1", "nodes")
PODS = by_path("", "v1", "pods")
SERVICES = by_path("", "v1", "services")
EVENTS = by_path("", "v1", "events")
CONFIGMAPS = by_path("", "v1", "configmaps")
DEPLOYMENTS = by_path("apps", "v1", "deployments")
REPLICASETS = by_path("apps", "v1", "replicasets")
STATEFULSETS = by_path("apps", "v1", "statefulsets")
DAEMONSETS = by_path("apps", "v1", "daemonsets")
PDBS = by_path("policy", "v1", "poddisruptionbudgets")
KSERVICES = by_path("serving.knative.dev", "v1", "services")
CONFIGURATIONS = by_path("serving.knative.dev", "v1", "configurations")
REVISIONS = by_path("serving.knative.dev", "v1", "revisions")
PODAUTOSCALERS = by_path("autoscaling.internal.knative.dev", "v1alpha1", "podautoscalers")
INFERENCESERVICES = by_path("serving.kserve.io", "v1beta1", "inferenceservices")
NOTEBOOKS = by_path("kubeflow.org", "v1", "notebooks")
MODELSERVINGS = by_path("workload.serving.volcano.sh", "v1alpha1", "modelservings")
