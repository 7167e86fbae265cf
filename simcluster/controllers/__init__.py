"""The simulated controllers. `default_controllers()` lists them in the order one
round runs them: owners before what they own, the scheduler and kubelet last."""
from __future__ import annotations


def default_controllers() -> list:
    from .install import InstallController
    from .kserve import InferenceServiceController
    from .knative import ConfigurationController, KPAController, RevisionController, ServiceController
    from .kthena import ModelServingController
    from .notebook import NotebookController
    serving = [InstallController(), InferenceServiceController(), ServiceController(),
               ConfigurationController(), RevisionController(), KPAController(), NotebookController(),
               ModelServingController()]
    return serving + []
