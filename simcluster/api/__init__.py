"""The Kubernetes REST API of the simulated cluster (a WSGI app on Werkzeug)."""
from .app import ApiServer

__all__ = ["ApiServer"]
