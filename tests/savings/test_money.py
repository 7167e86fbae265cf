"""Savings in money: a price per GPU-hour per GPU model (set in the panel, audited), and the
savings page and CSV showing money beside GPU-hours per mechanism, org and day; a GPU model
without a price, or a row whose GPU model is unknown, is said so and counts no money."""
from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from capacity.defrag.models import DefragJob, JobState
from config import clock
from orgs.models import Org
from pruning.models import PruneDecision, PruneRun
from savings.models import GpuPrice

pytestmark = pytest.mark.django_db

PAGE, CSV = "/savings/clusters/sim/", "/savings/clusters/sim/savings.csv"
ADD, LIST = "/admin/savings/gpuprice/add/", "/admin/savings/gpuprice/"
H100, A100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"


def node(name: str, product: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {"unschedulable": True},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"},
                       "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"}}}


@pytest.fixture
def mixed(sim_cluster_factory):
    """Three GPU models: an A100 node (8 GPUs) drained 2 h ago, an L4 node (4 GPUs) drained
    1 h ago, and beta's 2-GPU pod pruned 3 h ago, whose GPU model cannot be known (no pod of
    its namespace runs now, and the cluster has several models)."""
    handle = sim_cluster_factory([node("h100-1", H100, 8), node("a100-1", A100, 8), node("l4-1", L4, 4),
                                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-b"}}],
                                 name="sim")
    handle.advance(60)
    now = clock.now()
    cluster = handle.cluster
    Org.objects.create(slug="beta", cluster=cluster, namespace="org-b", last_activity_at=now)
    run = PruneRun.objects.create(cluster=cluster, mode=PruneRun.Mode.SCALE_DOWN, status="succeeded",
                                  evaluated_at=now - timedelta(hours=3))
    PruneDecision.objects.create(run=run, namespace="org-b", pod="idle-1", owner_kind="Deployment",
                                 owner_name="idle", gpus=["GPU-1", "GPU-2"], decision="prune", reason="idle",
                                 method="scale", result="succeeded", acted_at=now - timedelta(hours=3))
    for name, hours in (("a100-1", 2), ("l4-1", 1)):
        DefragJob.objects.create(cluster=cluster, node_name=name, state=JobState.DRAINED,
                                 created_at=now - timedelta(hours=hours, minutes=5),
                                 finished_at=now - timedelta(hours=hours), report={"pods": []})
    GpuPrice.objects.create(gpu_model=A100, price_per_gpu_hour=Decimal("1.25"), updated_at=now)
    GpuPrice.objects.create(gpu_model=H100, price_per_gpu_hour=Decimal("2.50"), updated_at=now)
    return handle


def _superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")


def _table(html: str, table_id: str) -> list[list[str]]:
    """The text of each body row's cells of the table `table_id`."""
    body = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def _csv(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_money_totals_add_up_across_the_mechanism_org_and_day_tables_and_the_csv(mixed, client, django_user_model):
    client.force_login(_superuser(django_user_model))
    html = client.get(PAGE, {"days": "7"}).content.decode()
    headline = Decimal(re.search(r'id="savings-money-total">In money: <strong>([0-9.]+) USD</strong>', html).group(1))
    # The A100 node's 8 GPUs × 2 h × 1.25 USD; the L4 has no price, beta's pod no known model.
    assert headline == pytest.approx(Decimal("20.00"), abs=Decimal("0.02"))
    mechanisms = {r[0]: r for r in _table(html, "savings-mechanisms")}
    assert mechanisms["defrag/drain"][2] == f"{headline}"
    # beta's pod, of unknown model, counts no money: its GPU-hours are shown as without money, not as 0
    assert mechanisms["pruning"][2] == "0.00" and mechanisms["pruning"][3] == mechanisms["pruning"][1] != "0.00"
    assert mechanisms["binpack"][1:4] == ["0.00", "0.00", "0.00"]     # no node binpack marked was seen free
    assert sum(Decimal(r[2]) for r in mechanisms.values()) == headline
    orgs = _table(html, "savings-orgs")   # org, 4 mechanisms, total, money, GPU-hours without money
    assert sum(Decimal(r[-2]) for r in orgs) == headline
    assert {r[0]: (r[-2], r[-1]) for r in orgs}["beta"] == ("0.00", mechanisms["pruning"][1])
    days = _table(html, "savings-days")
    assert len(days) == 7 and sum(Decimal(r[2]) for r in days) == headline
    hours = Decimal(re.search(r'id="savings-total">([^<]*)<', html).group(1))
    assert sum(Decimal(r[1]) for r in days) == hours
    without = sum(Decimal(r[3]) for r in days)
    assert without == sum(Decimal(r[3]) for r in mechanisms.values()) == \
        sum(Decimal(r[-1]) for r in orgs)
    assert without == pytest.approx(Decimal("10.00"), abs=Decimal("0.03"))   # L4 4 × 1 h + beta's 2 × 3 h

    rows = _csv(client.get(CSV, {"days": "7"}))
    assert sum(Decimal(r["money"]) for r in rows if r["money"]) == headline
    assert {(r["mechanism"], r["gpu_model"], r["money_note"]) for r in rows} == {
        ("defrag/drain", A100, ""), ("defrag/drain", L4, "no price"), ("pruning", "unknown", "GPU model unknown")}
    assert all(r["currency"] == "USD" for r in rows)
    for r in rows:   # each row's money is its shown hours × its price, rounded to cents once
        if r["gpu_model"] == A100:
            assert Decimal(r["money"]) == (Decimal(r["gpu_hours"]) * Decimal("1.25")).quantize(Decimal("0.01"))
        else:
            assert r["money"] == ""   # never 0


def test_a_model_without_a_price_and_an_unknown_model_are_named_not_counted_as_zero(mixed, client,
                                                                                    django_user_model):
    client.force_login(_superuser(django_user_model))
    html = client.get(PAGE, {"days": "7"}).content.decode()
    missing = re.search(r'<ul id="savings-money-missing">(.*?)</ul>', html, re.S).group(1)
    assert re.search(rf"{L4}: no price \(([0-9.]+) GPU-hours not counted in money\)", missing)
    assert Decimal(re.search(rf"{L4}: no price \(([0-9.]+) ", missing).group(1)) == \
        pytest.approx(Decimal("4.00"), abs=Decimal("0.02"))
    assert re.search(r"GPU model unknown: \d+ row\(s\), [0-9.]+ GPU-hours not counted in money", missing)
    assert "counting only GPU-hours of a GPU model with a price" in html
    assert f"{A100} 1.2500" in html and f"{H100} 2.5000" in html


def test_a_price_set_and_changed_in_the_panel_is_audited_and_moves_the_money(mixed, client, django_user_model):
    client.force_login(_superuser(django_user_model))
    response = client.post(ADD, {"gpu_model": L4, "price_per_gpu_hour": "0.80"})
    assert response.status_code == 302, response.content.decode()[:2000]
    price = GpuPrice.objects.get(gpu_model=L4)
    assert price.price_per_gpu_hour == Decimal("0.8000")
    response = client.post(f"{LIST}{price.pk}/change/", {"price_per_gpu_hour": "1.00"})
    assert response.status_code == 302, response.content.decode()[:2000]
    entries = list(AuditEntry.objects.filter(app="savings", action="gpu_price_set").order_by("id"))
    assert [(e.old["price_per_gpu_hour"], e.new["price_per_gpu_hour"]) for e in entries] == [
        ("no price", "0.8000"), ("0.8000", "1.0000")]
    assert all(e.actor.username == "root" and e.target == f"GpuPrice/{L4}" for e in entries)
    html = client.get(PAGE, {"days": "7"}).content.decode()
    assert f"{L4}: no price" not in html
    rows = _csv(client.get(CSV, {"days": "7"}))
    l4 = [r for r in rows if r["gpu_model"] == L4]
    assert l4 and all(Decimal(r["money"]) == Decimal(r["gpu_hours"]).quantize(Decimal("0.01")) for r in l4)

    response = client.post(f"{LIST}{price.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    gone = AuditEntry.objects.get(app="savings", action="gpu_price_deleted")
    assert gone.old["price_per_gpu_hour"] == "1.0000" and gone.new["price_per_gpu_hour"] == "no price"
    assert f"{L4}: no price" in client.get(PAGE, {"days": "7"}).content.decode()


@pytest.mark.parametrize(("price", "says"), [
    ("-1", "price per GPU-hour must be 0 or more, got -1"),
    ("NaN", "price per GPU-hour must be a finite number, got &#x27;NaN&#x27;"),
    ("inf", "price per GPU-hour must be a finite number, got &#x27;inf&#x27;"),
    ("", "price per GPU-hour is empty"),
    ("2,50", "price per GPU-hour must be a number such as 2.50, got &#x27;2,50&#x27;"),
    ("0.00001", "price per GPU-hour has at most 4 decimals"),
])
def test_a_bad_price_is_refused_naming_what_is_wrong_and_changes_nothing(mixed, client, django_user_model,
                                                                         price, says):
    client.force_login(_superuser(django_user_model))
    before = list(GpuPrice.objects.values_list("gpu_model", "price_per_gpu_hour"))
    audited = AuditEntry.objects.count()
    response = client.post(ADD, {"gpu_model": L4, "price_per_gpu_hour": price})
    assert response.status_code == 200 and says in response.content.decode()
    a100 = GpuPrice.objects.get(gpu_model=A100)
    response = client.post(f"{LIST}{a100.pk}/change/", {"price_per_gpu_hour": price})
    assert response.status_code == 200 and says in response.content.decode()
    assert list(GpuPrice.objects.values_list("gpu_model", "price_per_gpu_hour")) == before
    assert AuditEntry.objects.count() == audited


def test_a_bad_gpu_model_is_refused(mixed, client, django_user_model):
    client.force_login(_superuser(django_user_model))
    response = client.post(ADD, {"gpu_model": "H100 80GB", "price_per_gpu_hour": "2"})
    assert response.status_code == 200
    assert "GPU model &#x27;H100 80GB&#x27; is not a node label value" in response.content.decode()
    response = client.post(ADD, {"gpu_model": "", "price_per_gpu_hour": "2"})
    assert "GPU model is empty" in response.content.decode()
    response = client.post(ADD, {"gpu_model": A100, "price_per_gpu_hour": "9"})   # it has a price: change that one
    assert response.status_code == 200 and f"GPU model {A100} has a price already (1.2500 per GPU-hour): change that row instead" in \
        response.content.decode()
    assert list(GpuPrice.objects.values_list("gpu_model", "price_per_gpu_hour")) == [
        (A100, Decimal("1.2500")), (H100, Decimal("2.5000"))]
    assert not AuditEntry.objects.filter(app="savings").exists()
