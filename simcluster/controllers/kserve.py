"""KServe InferenceService (serving.kserve.io/v1beta1), predictor component only.

Serverless (`Knative`/`Serverless`, the default) mode owns a Knative Service
`<isvc>-predictor` whose template carries the scale annotations built from the
predictor's min/max replicas, and reverts any manual edit of that template. Raw
(`Standard`/`RawDeployment`) mode owns a Deployment `<isvc>-predictor` (no scale to
zero). From KServe 0.15, `serving.kserve.io/stop: "true"` deletes the predictor
workload and marks the InferenceService Stopped.
"""
from __future__ import annotations

from ..resources import DEPLOYMENTS, INFERENCESERVICES, KSERVICES
from ..store import copy
from ._serving import contains, kserve_version, merge_conditions, write_status_subresource
from ._util import condition, owner_ref
from .knative import labels as KL

MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
STOP_ANNOTATION = "serving.kserve.io/stop"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
RAW_MODES = ("Standard", "RawDeployment")
SERVERLESS_MODES = ("Knative", "Serverless")
# InferenceService annotations that are KServe's own and not passed to the predictor.
_OWN_ANNOTATIONS = (MODE_ANNOTATION, STOP_ANNOTATION, "kubectl.kubernetes.io/last-applied-configuration")
# PodSpec fields an InferenceService predictor may carry inline.
_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "serviceAccountName", "volumes",
               "imagePullSecrets", "priorityClassName", "schedulerName", "runtimeClassName",
               "securityContext", "hostIPC", "initContainers")
DOMAIN = "example.com"


def predictor_name(isvc_name: str) -> str:
    return f"{isvc_name}-predictor"


class InferenceServiceController:
    name = "kserve"

    def reconcile(self, sim) -> None:
        store = sim.store
        isvcs = store.all(INFERENCESERVICES)
        if not isvcs:
            return
        honours_stop = kserve_version(sim) >= (0, 15)
        for isvc in isvcs:
            meta = isvc["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            annotations = meta.get("annotations") or {}
            mode = annotations.get(MODE_ANNOTATION, "Serverless")
            stopped = honours_stop and str(annotations.get(STOP_ANNOTATION, "")).lower() == "true"
            if mode not in RAW_MODES + SERVERLESS_MODES:
                self._status(sim, isvc, None, None, invalid=f"unknown {MODE_ANNOTATION} {mode!r}: "
                             f"expected one of {', '.join(SERVERLESS_MODES + RAW_MODES)}")
                continue
            raw = mode in RAW_MODES
            name = predictor_name(meta["name"])
            # A mode change or a stop removes the workload of the other kind.
            for rtype, keep in ((KSERVICES, not raw and not stopped), (DEPLOYMENTS, raw and not stopped)):
                existing = store.get(rtype, meta["namespace"], name)
                if existing is not None and not keep and _owned_by(existing, isvc):
                    store.delete(rtype, meta["namespace"], name)
            if stopped:
                self._status(sim, isvc, None, None, stopped=True)
            elif raw:
                self._status(sim, isvc, None, self._deployment(store, isvc))
            else:
                self._status(sim, isvc, self._knative_service(store, isvc), None)

    # ---- the predictor ------------------------------------------------------------------
    @staticmethod
    def _pod_labels(isvc: dict) -> dict:
        meta = isvc["metadata"]
        labels = dict(meta.get("labels") or {})
        labels.update((((isvc.get("spec") or {}).get("predictor") or {}).get("labels")) or {})
        labels[ISVC_LABEL] = meta["name"]
        labels["component"] = "predictor"
        return labels

    @staticmethod
    def _pod_spec(isvc: dict) -> dict:
        predictor = (isvc.get("spec") or {}).get("predictor") or {}
        model = predictor.get("model")
        containers = [copy(c) for c in predictor.get("containers") or ()]
        if model:
            fmt = (model.get("modelFormat") or {}).get("name", "custom")
            main = {"name": "kserve-container",
                    "image": model.get("image") or f"kserve/{fmt}server:latest",
                    "args": [f"--model_name={isvc['metadata']['name']}",
                             f"--storage_uri={model.get('storageUri', '')}"],
                    "resources": copy(model.get("resources") or {})}
            if model.get("env"):
                main["env"] = copy(model["env"])
            containers = [main] + containers
        elif containers:
            containers[0]["name"] = containers[0].get("name") or "kserve-container"
        else:
            containers = [{"name": "kserve-container", "image": "kserve/custom:latest"}]
        spec = {"containers": containers}
        for field in _POD_FIELDS:
            if field in predictor:
                spec[field] = copy(predictor[field])
        return spec

    def _knative_service(self, store, isvc: dict) -> dict:
        meta = isvc["metadata"]
        predictor = (isvc.get("spec") or {}).get("predictor") or {}
        min_replicas = predictor.get("minReplicas")
        min_replicas = 1 if min_replicas is None else int(min_replicas)
        scaling = {KL.AUTOSCALING_PREFIX + "class": "kpa.autoscaling.knative.dev",
                   KL.AUTOSCALING_PREFIX + "min-scale": str(min_replicas)}
        if int(predictor.get("maxReplicas") or 0) > 0:
            scaling[KL.AUTOSCALING_PREFIX + "max-scale"] = str(int(predictor["maxReplicas"]))
        if predictor.get("scaleTarget") is not None:
            scaling[KL.AUTOSCALING_PREFIX + "target"] = str(predictor["scaleTarget"])
        if predictor.get("scaleMetric"):
            scaling[KL.AUTOSCALING_PREFIX + "metric"] = str(predictor["scaleMetric"])
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k not in _OWN_ANNOTATIONS}
        annotations.update(scaling)
        template_spec = self._pod_spec(isvc)
        if predictor.get("containerConcurrency") is not None:
            template_spec["containerConcurrency"] = int(predictor["containerConcurrency"])
        if predictor.get("timeout") is not None:
            template_spec["timeoutSeconds"] = int(predictor["timeout"])
        labels = self._pod_labels(isvc)
        template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": template_spec}
        name = predictor_name(meta["name"])
        existing = store.get(KSERVICES, meta["namespace"], name)
        if existing is None:
            return store.create(KSERVICES, {
                "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                             "annotations": annotations, "ownerReferences": [owner_ref(isvc)]},
                "spec": {"template": template}})
        # KServe owns the template: a manual edit (a min-scale changed by hand) is reverted.
        if (existing.get("spec") or {}).get("template") != template:
            new = copy(existing)
            new.setdefault("spec", {})["template"] = template
            return store.put(KSERVICES, new)
        return existing

    def _deployment(self, store, isvc: dict) -> dict:
        meta = isvc["metadata"]
        predictor = (isvc.get("spec") or {}).get("predictor") or {}
        name = predictor_name(meta["name"])
        labels = self._pod_labels(isvc)
        labels["app"] = f"isvc.{name}"
        # Raw mode cannot scale to zero: minReplicas 0 still runs one replica.
        replicas = max(int(predictor.get("minReplicas") or 1), 1)
        # The InferenceService's own annotations reach the pods in raw mode too (KServe
        # builds both modes' pod metadata from the same component metadata).
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _OWN_ANNOTATIONS}
        template_meta = {"labels": labels, **({"annotations": annotations} if annotations else {})}
        desired = {"replicas": replicas, "selector": {"matchLabels": {"app": f"isvc.{name}"}},
                   "template": {"metadata": template_meta, "spec": self._pod_spec(isvc)}}
        existing = store.get(DEPLOYMENTS, meta["namespace"], name)
        if existing is None:
            return store.create(DEPLOYMENTS, {
                "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                             "ownerReferences": [owner_ref(isvc)]},
                "spec": desired})
        if not contains(existing.get("spec") or {}, desired):
            new = copy(existing)
            new["spec"].update(desired)
            return store.put(DEPLOYMENTS, new)
        return existing

    # ---- status -------------------------------------------------------------------------
    @staticmethod
    def _status(sim, isvc: dict, ksvc: dict | None, deployment: dict | None, *,
                stopped: bool = False, invalid: str | None = None) -> None:
        meta = isvc["metadata"]
        old = isvc.get("status") or {}
        url = f"http://{meta['name']}.{meta['namespace']}.{DOMAIN}"
        status: dict = {"observedGeneration": meta.get("generation", 1)}
        if invalid:
            conds = [{"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": invalid}]
        elif stopped:
            conds = [{"type": "PredictorReady", "status": "False", "reason": "Stopped",
                      "message": "The InferenceService is stopped"},
                     {"type": "Ready", "status": "False", "reason": "Stopped",
                      "message": "The InferenceService is stopped"},
                     {"type": "Stopped", "status": "True"}]
        elif ksvc is not None:
            kstatus = ksvc.get("status") or {}
            predictor = {}
            if kstatus.get("latestCreatedRevisionName"):
                predictor["latestCreatedRevision"] = kstatus["latestCreatedRevisionName"]
            if kstatus.get("latestReadyRevisionName"):
                predictor["latestReadyRevision"] = kstatus["latestReadyRevisionName"]
                predictor["latestRolledoutRevision"] = kstatus["latestReadyRevisionName"]
                predictor["traffic"] = kstatus.get("traffic", [])
            if kstatus.get("url"):
                predictor["url"] = kstatus["url"]
            status["components"] = {"predictor": predictor}
            kready = condition(ksvc, "Ready") or {}
            state = kready.get("status", "Unknown")
            conds = [{"type": "PredictorReady", "status": state, "reason": kready.get("reason"),
                      "message": kready.get("message")},
                     {"type": "IngressReady", "status": "True" if state == "True" else "Unknown"},
                     {"type": "Ready", "status": state, "reason": kready.get("reason"),
                      "message": kready.get("message")},
                     {"type": "Stopped", "status": "False"}]
        else:
            dstatus = (deployment or {}).get("status") or {}
            up = int(dstatus.get("availableReplicas") or 0) > 0
            status["components"] = {"predictor": {"url": f"http://{predictor_name(meta['name'])}."
                                                         f"{meta['namespace']}.svc.cluster.local"}}
            state = "True" if up else "Unknown"
            conds = [{"type": "PredictorReady", "status": state,
                      "reason": None if up else "MinimumReplicasUnavailable"},
                     {"type": "IngressReady", "status": "True"},
                     {"type": "Ready", "status": state,
                      "reason": None if up else "MinimumReplicasUnavailable"},
                     {"type": "Stopped", "status": "False"}]
        if not stopped and not invalid and any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            status["url"] = url
            status["address"] = {"url": f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local"}
        status["conditions"] = merge_conditions(old.get("conditions"), conds, sim.clock.now())
        write_status_subresource(sim.store, INFERENCESERVICES, isvc, status)


def _owned_by(obj: dict, owner: dict) -> bool:
    return any(ref.get("uid") == owner["metadata"]["uid"] for ref in obj["metadata"].get("ownerReferences") or ())
