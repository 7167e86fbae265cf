"""The simulated controllers. `default_controllers()` lists them in the order one
round runs them: owners before what they own, the scheduler and kubelet, then the
etcd compactor (which writes nothing)."""
from __future__ import annotations


def default_controllers() -> list:
    from .compactor import CompactorController
    from .daemonset import DaemonSetController
    from .deployment import DeploymentController
    from .disruption import DisruptionController
    from .garbagecollector import GarbageCollectorController
    from .install import InstallController
    from .kserve import InferenceServiceController
    from .knative import ConfigurationController, KPAController, RevisionController, ServiceController
    from .kubelet import KubeletController
    from .kthena import ModelServingController
    from .notebook import NotebookController
    from .replicaset import ReplicaSetController
    from .scheduler import SchedulerController
    from .statefulset import StatefulSetController
    serving = [InstallController(), InferenceServiceController(), ServiceController(),
               ConfigurationController(), RevisionController(), KPAController(), NotebookController(),
               ModelServingController()]
    workloads = [DeploymentController(), ReplicaSetController(), StatefulSetController(), DaemonSetController(),
                 GarbageCollectorController(), DisruptionController()]
    return serving + workloads + [SchedulerController(), KubeletController(), CompactorController()]
