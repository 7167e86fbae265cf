"""The namespaces real Knative and KServe installs create, with the version labels the
product reads to learn which behaviour to expect (e.g. the 1.21 PA annotation rule), and
Knative's `config-autoscaler` ConfigMap (empty: every default), which a scenario or an
operator may fill in (`allow-zero-initial-scale`, `scale-to-zero-pod-retention-period`...)."""
from __future__ import annotations

from ..resources import CONFIGMAPS, NAMESPACES
from ._serving import KNATIVE_NAMESPACE, KSERVE_NAMESPACE, VERSION_LABEL

AUTOSCALER_CONFIG = "config-autoscaler"


class InstallController:
    """Creates `knative-serving` and `kserve` when the scenario does not declare them.
    A declared namespace is left alone: its version label wins over the settings."""
    name = "install"

    def reconcile(self, sim) -> None:
        wanted = {
            KNATIVE_NAMESPACE: ("knative-serving", f"{_major_minor(sim.settings.knative_version)}.0"),
            KSERVE_NAMESPACE: ("kserve", f"v{_major_minor(sim.settings.kserve_version)}.0"),
        }
        for namespace, (app, version) in wanted.items():
            if sim.store.get(NAMESPACES, None, namespace) is None:
                sim.store.create(NAMESPACES, {"metadata": {"name": namespace, "labels": {
                    "app.kubernetes.io/name": app, VERSION_LABEL: version,
                    "kubernetes.io/metadata.name": namespace}},
                    "status": {"phase": "Active"}})
        if sim.store.get(NAMESPACES, None, KNATIVE_NAMESPACE) is not None and \
                sim.store.get(CONFIGMAPS, KNATIVE_NAMESPACE, AUTOSCALER_CONFIG) is None:
            sim.store.create(CONFIGMAPS, {"metadata": {
                "name": AUTOSCALER_CONFIG, "namespace": KNATIVE_NAMESPACE,
                "labels": {"app.kubernetes.io/name": "knative-serving",
                           "app.kubernetes.io/component": "autoscaler"}}, "data": {}})


def _major_minor(version: str) -> str:
    return ".".join(str(version).lstrip("v").split(".")[:2])
