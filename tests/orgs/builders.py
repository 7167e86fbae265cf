"""Small builders of the Kubernetes objects scale to zero reads (plain dicts)."""
from __future__ import annotations

from orgs.planning import MIN_SCALE, OWNER_MIN_SCALE


def make_ksvc(name: str, *, ns: str = "acme", min_scale: str | None = None, pynode: bool = True,
              revisions: tuple[str, ...] = (), latest: str | None = None, owner: str | None = None,
              created: str | None = None) -> dict:
    """`owner`: the owner's min-scale the product recorded when it first set "0" ("" none);
    `created`: its creationTimestamp (RFC 3339), none when not given."""
    annotations = {MIN_SCALE: min_scale} if min_scale is not None else {}
    return {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"capacity.io/component": "pynode"} if pynode else {},
                     "annotations": {OWNER_MIN_SCALE: owner} if owner is not None else {},
                     **({"creationTimestamp": created} if created else {})},
        "spec": {"template": {"metadata": {"annotations": annotations}}},
        "status": {"latestReadyRevisionName": latest or (revisions[-1] if revisions else None),
                   "traffic": [{"revisionName": r, "percent": 100 // len(revisions)} for r in revisions]},
    }


def make_isvc(name: str, *, ns: str = "acme", min_replicas: int | None = None, mode: str | None = None) -> dict:
    predictor = {"model": {"modelFormat": {"name": "sklearn"}}}
    if min_replicas is not None:
        predictor["minReplicas"] = min_replicas
    annotations = {"serving.kserve.io/deploymentMode": mode} if mode else {}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {"predictor": predictor}}


def make_revision(name: str, *, ns: str = "acme", min_scale: str | None = None) -> dict:
    annotations = {MIN_SCALE: min_scale} if min_scale is not None else {}
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations}}


def make_pa(name: str, *, ns: str = "acme", min_scale: str | None = None) -> dict:
    annotations = {MIN_SCALE: min_scale} if min_scale is not None else {}
    return {"apiVersion": "autoscaling.internal.knative.dev/v1alpha1", "kind": "PodAutoscaler",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations}}
