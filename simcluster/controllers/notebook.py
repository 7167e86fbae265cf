"""Kubeflow Notebook (kubeflow.org/v1) -> StatefulSet `<name>`, as the notebook
controller does it: replicas 0 while `kubeflow-resource-stopped` is present, else 1."""
from __future__ import annotations

from ..resources import NOTEBOOKS, STATEFULSETS
from ..store import copy
from ._serving import contains, merge_conditions, write_status_subresource
from ._util import owner_ref

STOP_ANNOTATION = "kubeflow-resource-stopped"
NAME_LABEL = "notebook-name"


class NotebookController:
    name = "notebook"

    def reconcile(self, sim) -> None:
        store = sim.store
        for notebook in store.all(NOTEBOOKS):
            if notebook["metadata"].get("deletionTimestamp"):
                continue
            sts = self._statefulset(store, notebook)
            self._status(sim, notebook, sts)

    @staticmethod
    def _statefulset(store, notebook: dict) -> dict:
        meta = notebook["metadata"]
        template = ((notebook.get("spec") or {}).get("template")) or {}
        stopped = STOP_ANNOTATION in (meta.get("annotations") or {})
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update({"statefulset": meta["name"], NAME_LABEL: meta["name"]})
        pod_meta = {"labels": labels}
        if (template.get("metadata") or {}).get("annotations"):
            pod_meta["annotations"] = dict(template["metadata"]["annotations"])
        desired = {"replicas": 0 if stopped else 1,
                   "selector": {"matchLabels": {"statefulset": meta["name"]}},
                   "template": {"metadata": pod_meta, "spec": copy(template.get("spec") or {})}}
        existing = store.get(STATEFULSETS, meta["namespace"], meta["name"])
        if existing is None:
            return store.create(STATEFULSETS, {
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "labels": {NAME_LABEL: meta["name"]},
                             "ownerReferences": [owner_ref(notebook)]},
                "spec": {"serviceName": meta["name"], "podManagementPolicy": "OrderedReady", **desired}})
        if not contains(existing.get("spec") or {}, desired):
            new = copy(existing)
            new["spec"].update(desired)
            return store.put(STATEFULSETS, new)
        return existing

    @staticmethod
    def _status(sim, notebook: dict, sts: dict) -> None:
        ready = int(((sts.get("status") or {}).get("readyReplicas")) or 0)
        stopped = STOP_ANNOTATION in (notebook["metadata"].get("annotations") or {})
        status = {"readyReplicas": ready, "containerState": {"running": {}} if ready else {}}
        if stopped:
            conds = [{"type": "Ready", "status": "False", "reason": "Stopped"}]
        else:
            conds = [{"type": "Ready", "status": "True" if ready else "False",
                      "reason": None if ready else "Starting"}]
        status["conditions"] = merge_conditions((notebook.get("status") or {}).get("conditions"),
                                                conds, sim.clock.now())
        write_status_subresource(sim.store, NOTEBOOKS, notebook, status)
