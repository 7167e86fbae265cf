"""The cluster registry and the gateways to the outside systems of each cluster."""
