"""A LIST whose continue token expires between two pages, as etcd compaction makes one
expire on a real cluster (every 5 minutes upstream; the API server then answers 410
Expired to the next page)."""
from __future__ import annotations

from clusters import kube


def compacting_between_pages(gateway, sim, monkeypatch, *, pod: str, namespace: str):
    """After the gateway's first page of pods, `pod` is changed and the server's history
    compacted past the list's version (etcd compaction, every 5 min upstream), so the next
    page's continue token has expired."""
    first_page = gateway.list_page

    def list_page(resource, **options):
        page = first_page(resource, **options)
        if resource is kube.PODS and options.get("continue_token") is None and options.get("limit"):
            monkeypatch.setattr(gateway, "list_page", first_page)   # once
            changed = gateway.patch(kube.PODS, pod, {"metadata": {"labels": {"seen": "late"}}}, namespace=namespace)
            sim.store.compact(int(changed["metadata"]["resourceVersion"]))
        return page

    monkeypatch.setattr(gateway, "list_page", list_page)
