"""Knative Configuration: one Revision per generation of the template.

As upstream (pkg/reconciler/configuration), the revision for a generation is found by
the `configurationGeneration` label, so any template change — an annotation included —
makes a new Revision `<cfg>-<generation:05d>` unless the template names it.
"""
from __future__ import annotations

from ...resources import CONFIGURATIONS, REVISIONS
from ...store import copy
from .._serving import is_true, merge_conditions, write_status_subresource
from .._util import by_controller, condition, owner_ref
from . import labels as L


class ConfigurationController:
    name = "knative-configuration"

    def reconcile(self, sim) -> None:
        store = sim.store
        configs = store.all(CONFIGURATIONS)
        if not configs:
            return
        revisions_by_config = by_controller(store.all(REVISIONS))
        for config in configs:
            if config["metadata"].get("deletionTimestamp"):
                continue
            revisions = revisions_by_config.get(config["metadata"]["uid"], [])
            latest = self._latest_revision(store, config, revisions)
            if latest is None:
                continue
            self._status(sim, config, latest, revisions)

    def _latest_revision(self, store, config: dict, revisions: list[dict]) -> dict | None:
        meta = config["metadata"]
        generation = str(meta.get("generation", 1))
        for rev in revisions:
            if (rev["metadata"].get("labels") or {}).get(L.CONFIGURATION_GENERATION) == generation:
                return rev
        template = (config.get("spec") or {}).get("template") or {}
        tmeta = template.get("metadata") or {}
        name = tmeta.get("name") or f"{meta['name']}-{int(generation):05d}"
        if store.get(REVISIONS, meta["namespace"], name) is not None:
            # A named template whose revision exists already but for another generation:
            # Knative refuses to reuse a name; leave the configuration as it is.
            return None
        labels = dict(tmeta.get("labels") or {})
        labels.update({
            L.CONFIGURATION: meta["name"],
            L.CONFIGURATION_UID: meta["uid"],
            L.CONFIGURATION_GENERATION: generation,
            L.ROUTING_STATE: "pending",
        })
        service = (meta.get("labels") or {}).get(L.SERVICE)
        if service:
            labels[L.SERVICE] = service
        return store.create(REVISIONS, {
            "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                         "annotations": dict(tmeta.get("annotations") or {}),
                         "ownerReferences": [owner_ref(config)]},
            "spec": copy(template.get("spec") or {})})

    @staticmethod
    def _status(sim, config: dict, latest: dict, revisions: list[dict]) -> None:
        old = config.get("status") or {}
        status = {"observedGeneration": config["metadata"].get("generation", 1),
                  "latestCreatedRevisionName": latest["metadata"]["name"]}
        ready_name = old.get("latestReadyRevisionName")
        if is_true(latest, "Ready"):
            ready_name = latest["metadata"]["name"]
        elif ready_name and not any(r["metadata"]["name"] == ready_name for r in revisions):
            ready_name = None
        if ready_name:
            status["latestReadyRevisionName"] = ready_name
        latest_cond = condition(latest, "Ready") or {}
        if is_true(latest, "Ready"):
            ready = {"type": "Ready", "status": "True"}
        elif latest_cond.get("status") == "False":
            ready = {"type": "Ready", "status": "False", "reason": "RevisionFailed",
                     "message": f"Revision {latest['metadata']['name']!r} failed with message: "
                                f"{latest_cond.get('message', '')}."}
        else:
            ready = {"type": "Ready", "status": "Unknown"}
        status["conditions"] = merge_conditions(old.get("conditions"), [ready], sim.clock.now())
        write_status_subresource(sim.store, CONFIGURATIONS, config, status)
