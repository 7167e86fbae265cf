"""The runbook's unblock and delete-stuck end to end on both backends: simcluster, and the
real control plane (upstream controllers, Knative Serving 1.15, KServe 0.14.1's
controller turning each InferenceService into its predictor Knative Service).

Unblock: a 1-GPU model on a node with one GPU is redeployed; the new revision's pod
cannot be placed while the old one holds the GPU. The operator deletes the old revision;
the product also stops its pods, and the new revision's pod gets the GPU.
Delete-stuck: a model asking for a GPU product no node has never becomes Ready; the
product deletes it and what KServe and Knative made for it, and refuses a Ready model.
The product is driven through its services as the admin actions drive them.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from capacity.runbook import services
from capacity.runbook.models import RunbookAction, ServedModel

from .pool import SERVING, GpuPool, ready

KSERVE = ("serving.kserve.io", "v1beta1")
MODEL = "llm"
SECONDS = 60   # simulated on simcluster, wall time on the real tier


@pytest.fixture
def runbook(tier_cluster):
    cluster, backend = tier_cluster
    pool = GpuPool(backend, "runbook")
    pool.node_add("n1", gpus=1)
    operator = User.objects.create_user("operator", is_staff=True)
    yield cluster, backend, pool, operator
    pool.close()


def model_create(pool: GpuPool, name: str, *, product: str | None = None) -> None:
    pinning = pool.pinning()
    if product:
        pinning["nodeSelector"] = {**pinning["nodeSelector"], "nvidia.com/gpu.product": product}
    pool.custom.create_namespaced_custom_object(*KSERVE, pool.ns, "inferenceservices", {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name},
        "spec": {"predictor": {
            "minReplicas": 1, "maxReplicas": 1, **pinning,
            "containers": [{"name": "kserve-container", "image": "dev.local/model:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}})


def isvc_ready(pool: GpuPool, name: str) -> bool:
    isvc = pool.custom.get_namespaced_custom_object(*KSERVE, pool.ns, "inferenceservices", name)
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (isvc.get("status") or {}).get("conditions") or [])


def names(pool: GpuPool, group_version: tuple[str, str], plural: str, prefix: str) -> list[str]:
    items = pool.custom.list_namespaced_custom_object(*group_version, pool.ns, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(prefix))


def model_pods(pool: GpuPool, name: str) -> dict[str, str]:
    """revision -> phase of each live pod of the model."""
    return {p.metadata.labels["serving.knative.dev/revision"]: p.status.phase
            for p in pool.core.list_namespaced_pod(pool.ns, label_selector=f"serving.kserve.io/inferenceservice={name}").items
            if p.metadata.deletion_timestamp is None}


def synced(cluster, pool: GpuPool, name: str) -> ServedModel:
    services.registry_sync(cluster=cluster)
    return ServedModel.objects.get(name=name, namespace=pool.ns)


def test_deleting_the_old_revision_unblocks_a_redeploy_waiting_for_its_gpu(runbook):
    cluster, backend, pool, operator = runbook
    model_create(pool, MODEL)
    backend.settle(lambda: isvc_ready(pool, MODEL) and pool.model_ready(f"{MODEL}-predictor-00001", 1),
                   what=f"{MODEL} Ready on its GPU", seconds=SECONDS)
    model = synced(cluster, pool, MODEL)
    assert model.ready and model.gpus_held == 1 and model.blocked == []

    services.model_redeploy(model=model, actor=operator)
    # KServe copies the InferenceService's annotations onto its Knative template: a new
    # revision, whose pod waits for the GPU the old one holds.
    backend.settle(lambda: model_pods(pool, MODEL) == {f"{MODEL}-predictor-00001": "Running",
                                                      f"{MODEL}-predictor-00002": "Pending"}
                   and synced(cluster, pool, MODEL).blocked,
                   what="the new revision Pending and reported blocked", seconds=SECONDS)
    model = synced(cluster, pool, MODEL)
    (blocked,) = model.blocked
    assert (blocked["old_revision"], blocked["pending_revision"]) == (f"{MODEL}-predictor-00001",
                                                                      f"{MODEL}-predictor-00002")

    services.revision_delete_old(model=model, revision=f"{MODEL}-predictor-00001", actor=operator)

    assert names(pool, SERVING, "revisions", MODEL) == [f"{MODEL}-predictor-00002"]
    backend.settle(lambda: model_pods(pool, MODEL) == {f"{MODEL}-predictor-00002": "Running"}
                   and all(ready(p) for p in pool.pods(revision=f"{MODEL}-predictor-00002")),
                   what="the new revision's pod Running on the freed GPU", seconds=SECONDS)
    audit = list(RunbookAction.objects.order_by("at", "id").values_list("action", "actor__username", "target"))
    assert audit == [("model_redeploy", "operator", f"{pool.ns}/{MODEL}"),
                     ("revision_delete_old", "operator", f"{pool.ns}/{MODEL}-predictor-00001")]
    # The old revision's one pod is stopped by the action, unless the garbage collector
    # deleting the revision's Deployment got there first (on the real tier KWOK then removes
    # the pod at once, and the action's own delete finds nothing): it lists only what it
    # stopped, and never a pod of another revision.
    stopped = RunbookAction.objects.get(action="revision_delete_old").new["pods_stopped"]
    assert len(stopped) <= 1
    assert all(name.startswith(f"{MODEL}-predictor-00001-deployment-") for name in stopped), stopped


def test_a_model_stuck_deploying_is_deleted_with_what_it_left_and_a_ready_one_is_refused(runbook):
    cluster, backend, pool, operator = runbook
    model_create(pool, MODEL)
    model_create(pool, "stuck", product="NVIDIA-B200")                   # no such GPU here: never Ready
    backend.settle(lambda: isvc_ready(pool, MODEL) and names(pool, SERVING, "revisions", "stuck-"),
                   what="the ready model Ready and the stuck one's revision made", seconds=SECONDS)
    stuck, good = synced(cluster, pool, "stuck"), synced(cluster, pool, MODEL)
    assert not stuck.ready and good.ready

    with pytest.raises(services.RunbookRefused, match="is Ready"):
        services.model_delete_stuck(model=good, actor=operator)
    deleted = services.model_delete_stuck(model=stuck, actor=operator)

    assert "InferenceService/stuck" in deleted
    backend.settle(lambda: not names(pool, KSERVE, "inferenceservices", "stuck")
                   and not names(pool, SERVING, "services", "stuck-")
                   and not names(pool, SERVING, "revisions", "stuck-") and not model_pods(pool, "stuck"),
                   what="the stuck model and what it left gone", seconds=SECONDS)
    assert names(pool, KSERVE, "inferenceservices", "") == [MODEL] and isvc_ready(pool, MODEL)
    audit = RunbookAction.objects.get()
    assert (audit.action, audit.actor, audit.target) == ("model_delete_stuck", operator, f"{pool.ns}/stuck")
