"""Knative Revision: a Deployment `<rev>-deployment` and a PodAutoscaler `<rev>`.

- The Deployment starts at the revision's initial scale (its `initial-scale` annotation,
  else config-autoscaler's; MakeDeployment in resources/deploy.go) and the KPA owns its
  replicas after that.
- Its pod template carries the Revision's annotations, so changing any Revision
  annotation (min-scale included) changes the template and rolls the pods: a new
  ReplicaSet (checkAndUpdateDeployment in cruds.go). Measured on Knative 1.15.
- The PA is made from the Revision's annotations when it is created (MakePA). Up to
  Knative 1.20 (measured on 1.15) they are never copied again: the PA does not follow
  a Revision annotation patch, and a direct PA patch stays. From 1.21 on (as read in
  the sources, not run) the Revision's `autoscaling.knative.dev/*` annotations are
  copied onto the PA on every reconcile, so a direct PA patch is reverted.
"""
from __future__ import annotations

from ...resources import DEPLOYMENTS, PODAUTOSCALERS, PODS, REVISIONS
from ...store import copy
from .._serving import contains, knative_version, merge_conditions, pod_serving, write_status_subresource
from .._util import condition, owner_ref
from . import labels as L
from .autoscaler_config import autoscaler_config, initial_scale

# Annotations on the Revision that are not copied to its pods (they are Knative's own).
_NOT_FOR_PODS = ("serving.knative.dev/creator", "serving.knative.dev/lastModifier",
                 "serving.knative.dev/routes", "serving.knative.dev/routingStateModified")
PA_CLASS = "kpa.autoscaling.knative.dev"


def deployment_name(revision_name: str) -> str:
    return f"{revision_name}-deployment"


class RevisionController:
    name = "knative-revision"

    def reconcile(self, sim) -> None:
        store = sim.store
        revisions = store.all(REVISIONS)
        if not revisions:
            return
        pods_by_rev = _pods_by_revision(store)
        copy_annotations = knative_version(sim) >= (1, 21)
        config = autoscaler_config(sim)
        for rev in revisions:
            if rev["metadata"].get("deletionTimestamp"):
                continue
            deployment = self._deployment(store, rev, initial_scale(config, rev["metadata"].get("annotations")))
            pa = self._pa(store, rev, copy_annotations)
            self._status(sim, rev, deployment, pa,
                         pods_by_rev.get((rev["metadata"]["namespace"], rev["metadata"]["name"]), []))

    # ---- owned objects -----------------------------------------------------------------
    @staticmethod
    def _pod_labels(rev: dict) -> dict:
        meta = rev["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != L.ROUTING_STATE}
        labels[L.REVISION] = meta["name"]
        labels[L.REVISION_UID] = meta["uid"]
        labels.setdefault("app", meta["name"])
        return labels

    def _deployment(self, store, rev: dict, initial: int) -> dict:
        meta = rev["metadata"]
        spec = rev.get("spec") or {}
        pod_spec = {k: v for k, v in spec.items() if k not in ("containerConcurrency", "timeoutSeconds")}
        pod_spec.setdefault("terminationGracePeriodSeconds", spec.get("timeoutSeconds", 300))
        pod_spec["containers"] = _named_containers(pod_spec.get("containers") or [])
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_FOR_PODS}
        labels = self._pod_labels(rev)
        desired = {
            "selector": {"matchLabels": {L.REVISION_UID: meta["uid"]}},
            "template": {"metadata": {"labels": labels, "annotations": annotations},
                         "spec": pod_spec},
        }
        name = deployment_name(meta["name"])
        existing = store.get(DEPLOYMENTS, meta["namespace"], name)
        if existing is None:
            return store.create(DEPLOYMENTS, {
                "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                             "annotations": annotations, "ownerReferences": [owner_ref(rev)]},
                "spec": {"replicas": initial,
                         "progressDeadlineSeconds": 600,
                         "strategy": {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                         **desired}})
        spec = _as_rendered_here(existing.get("spec") or {}, pod_spec["containers"])
        # Template labels are compared as a whole: a removed label must come back.
        if not contains(spec, desired) or \
                (spec.get("template", {}).get("metadata", {}).get("labels") or {}) != labels:
            new = copy(existing)
            new["spec"].update(desired)
            return store.put(DEPLOYMENTS, new)
        return existing

    def _pa(self, store, rev: dict, copy_annotations: bool) -> dict:
        meta = rev["metadata"]
        spec = rev.get("spec") or {}
        rev_scaling = L.autoscaling_annotations(meta.get("annotations"))
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != L.ROUTING_STATE}
        labels[L.REVISION] = meta["name"]
        labels[L.REVISION_UID] = meta["uid"]
        routing = (meta.get("labels") or {}).get(L.ROUTING_STATE)
        desired_spec = {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": deployment_name(meta["name"])},
            "reachability": {"active": "Reachable", "reserve": "Unreachable"}.get(routing, "Unknown"),
            "containerConcurrency": int(spec.get("containerConcurrency") or 0),
            "protocolType": "http1",
        }
        existing = store.get(PODAUTOSCALERS, meta["namespace"], meta["name"])
        if existing is None:
            # pa.go MakePA: every Revision annotation but kubectl's last-applied copy.
            annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k != "kubectl.kubernetes.io/last-applied-configuration"}
            annotations.setdefault(L.AUTOSCALING_PREFIX + "class", PA_CLASS)
            annotations.setdefault(L.AUTOSCALING_PREFIX + "metric", "concurrency")
            return store.create(PODAUTOSCALERS, {
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels,
                             "annotations": annotations, "ownerReferences": [owner_ref(rev)]},
                "spec": desired_spec})
        new = copy(existing)
        new["spec"] = desired_spec
        if copy_annotations:
            # Knative >= 1.21: the Revision's autoscaling annotations win over the PA's.
            kept = {k: v for k, v in (existing["metadata"].get("annotations") or {}).items()
                    if not k.startswith(L.AUTOSCALING_PREFIX)}
            kept.update(rev_scaling)
            kept.setdefault(L.AUTOSCALING_PREFIX + "class", PA_CLASS)
            kept.setdefault(L.AUTOSCALING_PREFIX + "metric", "concurrency")
            new["metadata"]["annotations"] = kept
        if new["spec"] != existing.get("spec") or \
                new["metadata"].get("annotations") != existing["metadata"].get("annotations"):
            return store.put(PODAUTOSCALERS, new)
        return existing

    # ---- status ------------------------------------------------------------------------
    @staticmethod
    def _status(sim, rev: dict, deployment: dict, pa: dict, pods: list[dict]) -> None:
        old = rev.get("status") or {}
        was_available = (condition(rev, "ResourcesAvailable") or {}).get("status") == "True"
        ready_pods = sum(1 for p in pods if pod_serving(p))
        pa_status = pa.get("status") or {}
        unschedulable = None
        for pod in pods:
            for cond in (pod.get("status") or {}).get("conditions") or ():
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    unschedulable = cond
        # PropagateAutoscalerStatus: a PA whose scale target is initialized (its first pods
        # were ready, or its initial scale is 0) makes the resources available. Once up, a
        # revision stays Ready when it scales to zero (Active says so).
        initialized = (condition(pa, "ScaleTargetInitialized") or {}).get("status") == "True"
        if ready_pods or was_available or initialized:
            resources = {"type": "ResourcesAvailable", "status": "True"}
        elif unschedulable:
            resources = {"type": "ResourcesAvailable", "status": "False",
                         "reason": unschedulable.get("reason") or "Unschedulable",
                         "message": unschedulable.get("message") or "the pod cannot be scheduled"}
        else:
            resources = {"type": "ResourcesAvailable", "status": "Unknown", "reason": "Deploying"}
        healthy = {"type": "ContainerHealthy", "status": "True"} if ready_pods or was_available or initialized else \
            {"type": "ContainerHealthy", "status": "Unknown", "reason": "Deploying"}
        ready = {"type": "Ready", "status": resources["status"], "reason": resources.get("reason"),
                 "message": resources.get("message")}
        if resources["status"] == "True" and healthy["status"] == "True":
            ready = {"type": "Ready", "status": "True"}
        pa_active = condition(pa, "Active") or {}
        active = {"type": "Active", "status": pa_active.get("status", "Unknown"),
                  "reason": pa_active.get("reason"), "message": pa_active.get("message")}
        status = {
            "observedGeneration": rev["metadata"].get("generation", 1),
            "actualReplicas": int(pa_status.get("actualScale", ready_pods)),
            "desiredReplicas": int(pa_status.get("desiredScale", deployment.get("spec", {}).get("replicas", 0))),
            "conditions": merge_conditions(old.get("conditions"), [active, healthy, ready, resources],
                                           sim.clock.now()),
        }
        containers = (rev.get("spec") or {}).get("containers") or []
        status["containerStatuses"] = [{"name": c.get("name", "user-container"),
                                        "imageDigest": c.get("image", "")} for c in containers]
        write_status_subresource(sim.store, REVISIONS, rev, status)


def _pods_by_revision(store) -> dict[tuple[str, str], list[dict]]:
    index: dict[tuple[str, str], list[dict]] = {}
    for pod in store.all(PODS):
        rev = (pod["metadata"].get("labels") or {}).get(L.REVISION)
        if rev:
            index.setdefault((pod["metadata"]["namespace"], rev), []).append(pod)
    return index


# The sidecar real Knative adds to every revision's pods (MakeDeployment appends the queue
# container, resources/deploy.go), which this simulation does not run.
QUEUE_PROXY = "queue-proxy"


def _as_rendered_here(spec: dict, desired_containers: list[dict]) -> dict:
    """A Deployment's spec as this simulation would have rendered it. One real Knative made
    (a dump of a real cluster loaded as a scenario) carries the queue-proxy container, and
    its user containers have no readinessProbe: Knative moves the user's probe into the
    queue-proxy (rewriteUserProbe, resources/deploy.go). Neither may read as a changed
    template, which would roll the revision's pods onto a new ReplicaSet."""
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not any(c.get("name") == QUEUE_PROXY for c in containers):
        return spec
    probes = {c.get("name"): c["readinessProbe"] for c in desired_containers if c.get("readinessProbe")}
    spec = copy(spec)
    kept = []
    for container in spec["template"]["spec"]["containers"]:
        if container.get("name") == QUEUE_PROXY:
            continue
        if "readinessProbe" not in container and container.get("name") in probes:
            container["readinessProbe"] = probes[container["name"]]
        kept.append(container)
    spec["template"]["spec"]["containers"] = kept
    return spec


def _named_containers(containers: list[dict]) -> list[dict]:
    """Knative's defaulting (applyDefaultContainerNames): an unnamed container is
    `user-container`, or `user-container-<n>` when there are several; the API server
    refuses a pod whose container has no name."""
    taken = {c.get("name") for c in containers if c.get("name")}
    named, suffix = [], 0
    for container in containers:
        if not container.get("name"):
            name = "user-container"
            if len(containers) > 1 or name in taken:
                while f"user-container-{suffix}" in taken:
                    suffix += 1
                name = f"user-container-{suffix}"
                suffix += 1
            taken.add(name)
            container = {**container, "name": name}
        named.append(container)
    return named
