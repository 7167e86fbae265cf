"""Knative Serving, as far as the product depends on it: Service -> Configuration ->
Revision -> Deployment + PodAutoscaler, and the KPA that scales the Deployment."""
from .configuration import ConfigurationController
from .kpa import KPAController
from .revision import RevisionController
from .service import ServiceController

__all__ = ["ServiceController", "ConfigurationController", "RevisionController", "KPAController"]
