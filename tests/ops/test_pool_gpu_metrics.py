"""/metrics: GPUs per node pool from the reading the dashboard keeps, never a read of the
cluster at scrape time, and nothing for a cluster with no kept reading."""
from __future__ import annotations

from django.contrib.auth.models import Permission

from clusters import kube
from tests.ops.helpers import value

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"


def _scenario() -> list[dict]:
    def node(name, product, pool, gpus):
        labels = {"nvidia.com/gpu.product": product, **({"karpenter.sh/nodepool": pool} if pool else {})}
        capacity = {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "status": {"capacity": capacity, "allocatable": capacity}}

    def pod(name, node_name, gpus):
        limits = {"nvidia.com/gpu": str(gpus)}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"},
                "spec": {"nodeName": node_name, "containers": [
                    {"name": "m", "image": "registry.example.com/m:1",
                     "resources": {"limits": limits, "requests": limits}}]}}

    return [node("h1", H100, "h100", 8), node("h2", H100, "h100", 8), node("a1", A100, None, 4),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
            pod("big", "h1", 3), pod("small", "h2", 2), pod("cpu", "a1", 0)]


def _pool_samples(samples: dict, cluster: str) -> dict:
    return {(name, dict(labels).get("pool"), dict(labels).get("state"), dict(labels).get("node")): v
            for (name, labels), v in samples.items()
            if name in ("gpu_capacity_pool_gpus", "gpu_capacity_node_pool_info")
            and dict(labels).get("cluster") == cluster}


def test_pool_gpus_come_from_the_kept_reading_and_a_scrape_reads_no_cluster(
        sim_cluster_factory, scrape, client, django_user_model, settings):
    settings.CAPACITY_MAP_CACHE_SECONDS = 15
    sim = sim_cluster_factory(_scenario(), name="pools-sim")
    sim.advance(10)
    gateway = kube.gateway_for(sim.cluster)
    # No reading kept yet: no series for the cluster (not a 0 the product does not know).
    calls = sum(gateway.calls.values())
    assert _pool_samples(scrape(), "pools-sim") == {}
    assert sum(gateway.calls.values()) == calls

    operator = django_user_model.objects.create_user("oncall", "o@example.com", "pw", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_cluster_contents"))
    client.force_login(operator)
    assert client.get("/capacity/clusters/pools-sim/").status_code == 200   # the dashboard keeps a reading

    calls = sum(gateway.calls.values())
    samples = scrape()
    assert sum(gateway.calls.values()) == calls
    assert _pool_samples(samples, "pools-sim") == {
        ("gpu_capacity_pool_gpus", "h100", "allocatable", None): 16,
        ("gpu_capacity_pool_gpus", "h100", "allocated", None): 5,
        # a node without a pool label is in the pool named after its GPU product
        ("gpu_capacity_pool_gpus", A100, "allocatable", None): 4,
        ("gpu_capacity_pool_gpus", A100, "allocated", None): 0,
        ("gpu_capacity_node_pool_info", "h100", None, "h1"): 1,
        ("gpu_capacity_node_pool_info", "h100", None, "h2"): 1,
        ("gpu_capacity_node_pool_info", A100, None, "a1"): 1,
    }
    assert value(samples, "gpu_capacity_pool_gpus", cluster="pools-sim", pool="h100", gpu_product=H100,
                 state="allocated") == 5
    assert value(samples, "gpu_capacity_gpu_reading_timestamp_seconds", cluster="pools-sim") > 0

    # A pod gone from the cluster shows at the next reading, not at a scrape.
    sim.gateway.delete(kube.PODS, "big", namespace="team")
    sim.advance(60)
    assert _pool_samples(scrape(), "pools-sim")[("gpu_capacity_pool_gpus", "h100", "allocated", None)] == 5


def test_the_schedule_keeps_a_reading_when_no_page_asks(sim_cluster_factory, scrape, settings):
    from capacity.gpumap.selectors import readings_forget
    from capacity.gpumap.tasks import gpu_reading_keep
    from config.schedule import SCHEDULES

    settings.CAPACITY_MAP_CACHE_SECONDS = 15
    sim = sim_cluster_factory(_scenario(), name="kept-sim")
    sim.advance(10)
    gateway = kube.gateway_for(sim.cluster)
    assert _pool_samples(scrape(), "kept-sim") == {}
    keep = next(p for p in SCHEDULES if p.task == "capacity.gpumap.tasks.gpu_readings_keep")
    assert keep.every_seconds <= 60      # no step of the history (5 min at its finest) without a reading

    # No page viewed the cluster: the scheduled keep reads it, and /metrics exports its pools.
    assert gpu_reading_keep(sim.cluster.pk) is True
    assert _pool_samples(scrape(), "kept-sim")[("gpu_capacity_pool_gpus", "h100", "allocated", None)] == 5
    # A reading younger than CAPACITY_MAP_CACHE_SECONDS is not drawn again.
    calls = sum(gateway.calls.values())
    assert gpu_reading_keep(sim.cluster.pk) is True
    assert sum(gateway.calls.values()) == calls
    # Once the kept reading is gone (expired), the next keep reads the cluster as it is now.
    sim.gateway.delete(kube.PODS, "big", namespace="team")
    sim.advance(60)
    readings_forget(cluster=sim.cluster)
    assert gpu_reading_keep(sim.cluster.pk) is True
    assert _pool_samples(scrape(), "kept-sim")[("gpu_capacity_pool_gpus", "h100", "allocated", None)] == 2
