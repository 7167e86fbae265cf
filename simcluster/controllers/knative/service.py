"""Knative Service: owns a Configuration of the same name and routes 100% of the
traffic to its latest ready Revision (the route and labeler controllers folded in)."""
from __future__ import annotations

from ...resources import CONFIGURATIONS, KSERVICES, REVISIONS
from ...store import copy
from .._serving import is_true, merge_conditions, write_status_subresource
from .._util import by_controller, owner_ref
from . import labels as L

DOMAIN = "example.com"   # Knative's default config-domain


class ServiceController:
    name = "knative-service"

    def reconcile(self, sim) -> None:
        store = sim.store
        services = store.all(KSERVICES)
        if not services:
            return
        revisions_by_config = by_controller(store.all(REVISIONS))
        for ksvc in services:
            if ksvc["metadata"].get("deletionTimestamp"):
                continue
            config = self._configuration(store, ksvc)
            self._label_routing(store, config, revisions_by_config.get(config["metadata"]["uid"], ()))
            self._status(sim, ksvc, config)

    def _configuration(self, store, ksvc: dict) -> dict:
        meta = ksvc["metadata"]
        labels = dict(meta.get("labels") or {})
        labels[L.SERVICE] = meta["name"]
        desired_spec = {"template": ksvc.get("spec", {}).get("template") or {}}
        config = store.get(CONFIGURATIONS, meta["namespace"], meta["name"])
        if config is None:
            return store.create(CONFIGURATIONS, {
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels,
                             "annotations": dict(meta.get("annotations") or {}),
                             "ownerReferences": [owner_ref(ksvc)]},
                "spec": desired_spec})
        if config.get("spec") != desired_spec or (config["metadata"].get("labels") or {}) != labels:
            new = copy(config)
            new["spec"] = desired_spec
            new["metadata"]["labels"] = labels
            return store.put(CONFIGURATIONS, new)
        return config

    @staticmethod
    def _label_routing(store, config: dict, revisions) -> None:
        """The labeler: the revision taking traffic is `active`, the others `reserve`
        (the KPA lets unreachable revisions scale to zero whatever their min-scale)."""
        routed = (config.get("status") or {}).get("latestReadyRevisionName")
        for rev in revisions:
            state = "active" if rev["metadata"]["name"] == routed else \
                ("pending" if not routed else "reserve")
            if (rev["metadata"].get("labels") or {}).get(L.ROUTING_STATE) != state:
                new = copy(rev)
                new["metadata"].setdefault("labels", {})[L.ROUTING_STATE] = state
                store.put(REVISIONS, new)

    @staticmethod
    def _status(sim, ksvc: dict, config: dict) -> None:
        meta = ksvc["metadata"]
        cstatus = config.get("status") or {}
        ready_rev = cstatus.get("latestReadyRevisionName")
        config_ready = is_true(config, "Ready")
        url = f"http://{meta['name']}.{meta['namespace']}.{DOMAIN}"
        status = {"observedGeneration": meta.get("generation", 1)}
        if cstatus.get("latestCreatedRevisionName"):
            status["latestCreatedRevisionName"] = cstatus["latestCreatedRevisionName"]
        if ready_rev:
            status["latestReadyRevisionName"] = ready_rev
            status["traffic"] = [{"revisionName": ready_rev, "latestRevision": True, "percent": 100}]
            status["url"] = url
            status["address"] = {"url": f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local"}
        cfg_cond = next((c for c in cstatus.get("conditions") or () if c["type"] == "Ready"), None)
        cfg_state = "True" if config_ready else (cfg_cond or {}).get("status", "Unknown")
        reason = None if config_ready else (cfg_cond or {}).get("reason")
        message = None if config_ready else (cfg_cond or {}).get("message")
        routes = "True" if ready_rev else "Unknown"
        ready = "True" if cfg_state == "True" and routes == "True" else \
            ("False" if cfg_state == "False" else "Unknown")
        status["conditions"] = merge_conditions((ksvc.get("status") or {}).get("conditions"), [
            {"type": "ConfigurationsReady", "status": cfg_state, "reason": reason, "message": message},
            {"type": "Ready", "status": ready, "reason": reason, "message": message},
            {"type": "RoutesReady", "status": routes,
             "reason": None if ready_rev else "TrafficNotAssigned"},
        ], sim.clock.now())
        write_status_subresource(sim.store, KSERVICES, ksvc, status)
