"""A simulated GPU serving cluster that answers the Kubernetes REST API over HTTP.

No Django and no product code here: the control plane talks to it exactly as it
talks to a real cluster, through the official `kubernetes` client.
"""
