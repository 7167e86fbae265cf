"""Binpack's savings, as an operator sees them: a run marks the emptiest node of each
workload, a scale-down then empties one (the ReplicaSet controller deletes the pod with the
lowest cost) and another is drained and removed, the periodic check records them, and the
savings page and its CSV show their GPU-hours and money under binpack, with totals equal
to the sum of the rows. A node refilled stops counting; hours a defrag job held a node
drained count under defrag/drain only. Simulated cluster through the real client."""
from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import kubernetes
import pytest

from audit.models import AuditEntry
from capacity.binpack.models import BinpackNodeFreed, BinpackRun
from capacity.binpack.tasks import binpack_cluster, binpack_freed_check_cluster
from capacity.defrag.models import DefragJob, JobState
from config import clock
from savings.models import GpuPrice
from simcluster.generate import namespace as namespace_doc
from simcluster.generate import node as node_doc
from tests.capacity.test_binpack_services import NS, pod_doc, rs_doc

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"
PAGE, CSV = "/savings/clusters/bp/", "/savings/clusters/bp/savings.csv"


def scenario() -> list[dict]:
    """a: a-0, a-1 on n1, a-2 alone on n2 (a's emptiest node); b: b-0 alone on n3, b-1, b-2
    on n4 (n3 is b's emptiest); c: c-0, its only pod, on n5."""
    a, b, c = rs_doc("a", replicas=3), rs_doc("b", replicas=3), rs_doc("c", replicas=1)
    nodes = [node_doc(f"n{i}", pool="h100", product=H100, gpus=8) for i in range(1, 6)]
    return nodes + [namespace_doc(NS), a, b, c,
                    pod_doc("a-0", a, "n1"), pod_doc("a-1", a, "n1"), pod_doc("a-2", a, "n2"),
                    pod_doc("b-0", b, "n3"), pod_doc("b-1", b, "n4"), pod_doc("b-2", b, "n4"),
                    pod_doc("c-0", c, "n5")]


class Clock:
    """The product's clock, moved forward by writing its offset file (as the workers read it)."""

    def __init__(self, settings, path):
        self.path, self.seconds = path, 0.0
        settings.CLOCK_OFFSET_FILE = str(path)
        path.write_text("0")

    def ahead(self, seconds: float):
        self.seconds += seconds
        self.path.write_text(str(self.seconds))
        return clock.now()


@pytest.fixture
def world(sim_cluster_factory, settings, tmp_path):
    handle = sim_cluster_factory(scenario(), name="bp")
    handle.advance(0)
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    yield handle, kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api), Clock(settings, tmp_path / "offset")
    api.close()


def pods_on(core, node: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(NS).items
            if p.spec.node_name == node and not p.metadata.deletion_timestamp}


def shown(html: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_nodes_binpack_emptied_are_counted_on_the_savings_page_once(world, client, django_user_model):
    handle, core, apps, product_clock = world
    pk = handle.cluster.pk
    binpack_cluster(pk)
    run = BinpackRun.objects.get()
    assert {m["node"]: m["gpus"] for m in run.marked} == {"n2": 8, "n3": 8}   # not n5: c's only node
    assert binpack_freed_check_cluster(pk)["waiting"] == 2     # both still hold their pods
    assert not BinpackNodeFreed.objects.exists()

    # a and b scale down by one: each ReplicaSet deletes its pod with the lowest cost.
    apps.patch_namespaced_replica_set_scale("a", NS, {"spec": {"replicas": 2}})
    apps.patch_namespaced_replica_set_scale("b", NS, {"spec": {"replicas": 2}})
    handle.advance(60)
    assert pods_on(core, "n2") == pods_on(core, "n3") == set()
    assert pods_on(core, "n1") == {"a-0", "a-1"} and pods_on(core, "n4") == {"b-1", "b-2"}

    seen = product_clock.ahead(60)
    result = binpack_freed_check_cluster(pk)
    assert sorted(result["freed"]) == ["n2", "n3"]
    rows = {r.node: r for r in BinpackNodeFreed.objects.all()}
    assert {n: (r.run_id, r.gpus, r.gpu_model, r.ended_at) for n, r in rows.items()} == {
        "n2": (run.pk, 8, H100, None), "n3": (run.pk, 8, H100, None)}
    assert all(abs((r.freed_at - seen).total_seconds()) < 5 for r in rows.values())
    audited = AuditEntry.objects.filter(app="binpack", action="binpack_node_freed")
    assert {e.target for e in audited} == {"Node/n2", "Node/n3"}
    assert all(f"binpack run #{run.pk} marked it" in e.cause and e.actor is None for e in audited)

    # A rerun (a worker killed after its commit, the task delivered again) adds nothing.
    binpack_freed_check_cluster(pk)
    assert BinpackNodeFreed.objects.count() == 2 and audited.count() == 2

    # n3 is drained by a defrag job half an hour in, then removed by the cluster autoscaler.
    freed_at = rows["n3"].freed_at
    DefragJob.objects.create(cluster=handle.cluster, node_name="n3", state=JobState.DRAINED,
                             created_at=freed_at + timedelta(minutes=20), finished_at=freed_at + timedelta(minutes=30),
                             report={"pods": [{"namespace": NS, "name": "x", "gpus": 8}]})
    core.delete_node("n3")
    handle.advance(0)
    product_clock.ahead(3600)
    binpack_freed_check_cluster(pk)
    assert BinpackNodeFreed.objects.get(node="n3").removed_at is not None
    last_free = product_clock.ahead(3600)
    binpack_freed_check_cluster(pk)

    # n2 takes a GPU pod again: its count stops at the last check that saw it free.
    d = rs_doc("d", replicas=1)
    apps.create_namespaced_replica_set(NS, d)
    core.create_namespaced_pod(NS, pod_doc("d-0", d, "n2"))
    handle.advance(0)
    product_clock.ahead(120)
    binpack_freed_check_cluster(pk)
    n2 = BinpackNodeFreed.objects.get(node="n2")
    assert n2.ended_at is not None and abs((n2.ended_at - last_free).total_seconds()) < 5
    assert n2.end_reason.startswith("held GPU pods again")
    assert AuditEntry.objects.filter(app="binpack", action="binpack_node_freed_ended", target="Node/n2").count() == 1
    assert BinpackNodeFreed.objects.get(node="n3").ended_at is None     # still gone: still free

    # What the page should show: n2 8 GPUs × 2 h; n3 8 GPUs × its first 30 min (the rest, drained, is defrag's).
    n2_hours = 8 * (n2.ended_at - n2.freed_at).total_seconds() / 3600
    assert n2_hours == pytest.approx(16.0, abs=0.1)
    GpuPrice.objects.create(gpu_model=H100, price_per_gpu_hour=Decimal("2.5"), updated_at=clock.now())
    client.force_login(django_user_model.objects.create_superuser("op", "op@example.com", "pw"))
    html = client.get(PAGE, {"days": "7"}).content.decode()
    assert "not measured" not in html
    mechanisms = {r[0]: r for r in shown(html, "savings-mechanisms")}
    binpack_hours, binpack_money = Decimal(mechanisms["binpack"][1]), Decimal(mechanisms["binpack"][2])
    assert binpack_hours == pytest.approx(Decimal(n2_hours) + 4, abs=Decimal("0.05"))
    assert mechanisms["binpack"][3] == "0.00"                      # every binpack GPU-hour has a price
    assert Decimal(mechanisms["defrag/drain"][1]) > 0
    nodes = {r[0]: r for r in shown(html, "savings-binpack-nodes")}
    assert set(nodes) == {f"node n2 (binpack run #{run.pk})", f"node n3 (binpack run #{run.pk})"}
    assert nodes[f"node n3 (binpack run #{run.pk})"][-1] == "removed from the cluster"
    assert re.search(r'id="binpack-nodes"><strong>2</strong> node\(s\).*?<strong>0</strong> still counted under binpack now', html)

    rows = list(csv.DictReader(io.StringIO(client.get(CSV, {"days": "7"}).content.decode())))
    binpack_rows = [r for r in rows if r["mechanism"] == "binpack"]
    assert binpack_rows and all(r["org"] == "(whole nodes)" and r["gpu_model"] == H100 for r in binpack_rows)
    assert sum(Decimal(r["gpu_hours"]) for r in binpack_rows) == binpack_hours
    assert sum(Decimal(r["money"]) for r in binpack_rows) == binpack_money
    for r in binpack_rows:
        assert Decimal(r["money"]) == (Decimal(r["gpu_hours"]) * Decimal("2.5")).quantize(Decimal("0.01"))
    headline = Decimal(re.search(r'id="savings-total">([^<]*)<', html).group(1))
    assert headline == sum(Decimal(r["gpu_hours"]) for r in rows) == sum(Decimal(m[1]) for m in mechanisms.values())
