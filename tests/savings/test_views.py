"""The savings page and its CSV on a simulated cluster, from records the other apps write:
a dormancy switch's audit, a prune decision acted and restored, a drained node."""
from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission

from capacity.defrag.models import DefragJob, JobState
from config import clock
from audit.models import AuditEntry
from orgs.models import DormancySwitch, Org
from pruning.models import PruneDecision, PruneRun

pytestmark = pytest.mark.django_db

PAGE, CSV = "/savings/clusters/sim/", "/savings/clusters/sim/savings.csv"
H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, *, cordoned: bool = False) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": H100, "karpenter.sh/nodepool": "h100"}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"},
                       "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1000Gi", "pods": "110"}}}


def gpu_container(gpus: int) -> dict:
    return {"name": "model", "image": "registry.example.com/m:1",
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}}


def scenario() -> list[dict]:
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                  for ns in ("org-a", "org-b", "org-c")]
    llama = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
             "metadata": {"name": "llama", "namespace": "org-a"},
             "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "1"}},
                                   "spec": {"containers": [gpu_container(2)]}}}}
    warm = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "warm", "namespace": "org-c"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "warm"}},
                     "template": {"metadata": {"labels": {"app": "warm"}},
                                  "spec": {"containers": [gpu_container(3)]}}}}
    return [node("h100-1"), node("h100-2", cordoned=True), *namespaces, llama, warm]


@pytest.fixture
def world(sim_cluster_factory):
    handle = sim_cluster_factory(scenario(), name="sim")
    handle.advance(60)
    now = clock.now()
    cluster = handle.cluster
    acme = Org.objects.create(slug="acme", cluster=cluster, namespace="org-a", last_activity_at=now)
    Org.objects.create(slug="beta", cluster=cluster, namespace="org-b", last_activity_at=now)
    Org.objects.create(slug="gamma", cluster=cluster, namespace="org-c", last_activity_at=now - timedelta(days=3),
                       dormant=True, scale_to_zero_allowed=False)
    # delta is snoozed by an operator for a day: held warm too, and the page says why.
    Org.objects.create(slug="delta", cluster=cluster, namespace="org-d", last_activity_at=now,
                       snoozed_until=now + timedelta(days=1), exemption_reason="quarter close")
    # acme dormant for 3 h: its pynode's floor 1 → 0, then back to 1 (1 replica × 2 GPUs).
    AuditEntry.objects.create(app="orgs", at=now - timedelta(hours=5), action="scale_to_zero_applied", org=acme,
                               cause="switch #1: became dormant (dormancy sweep)",
                               old={"ksvc org-a/llama": "1", "setting": "disabled"},
                               new={"ksvc org-a/llama": "0", "setting": "enabled"})
    AuditEntry.objects.create(app="orgs", at=now - timedelta(hours=2), action="scale_to_zero_applied", org=acme,
                               cause="switch #2: became active (activity)",
                               old={"ksvc org-a/llama": "0", "setting": "enabled"},
                               new={"ksvc org-a/llama": "1", "setting": "disabled"})
    # beta's idle 2-GPU pod scaled to zero for 3 h, then restored.
    run = PruneRun.objects.create(cluster=cluster, mode=PruneRun.Mode.SCALE_DOWN, status="succeeded",
                                  evaluated_at=now - timedelta(hours=4))
    PruneDecision.objects.create(run=run, namespace="org-b", pod="idle-1", owner_kind="Deployment",
                                 owner_name="idle", gpus=["GPU-1", "GPU-2"], decision="prune", reason="idle",
                                 method="scale", result="succeeded", acted_at=now - timedelta(hours=4),
                                 restore="restored", restored_at=now - timedelta(hours=1))
    # A dry run's decision frees nothing.
    dry = PruneRun.objects.create(cluster=cluster, mode=PruneRun.Mode.DRY_RUN, status="succeeded",
                                  evaluated_at=now - timedelta(hours=4))
    PruneDecision.objects.create(run=dry, namespace="org-b", pod="idle-2", gpus=["GPU-3"], decision="prune",
                                 reason="idle", result="dry-run")
    # h100-2 drained 2 h ago and still cordoned: its 8 GPUs freed until now.
    DefragJob.objects.create(cluster=cluster, node_name="h100-2", state=JobState.DRAINED,
                             created_at=now - timedelta(hours=3), finished_at=now - timedelta(hours=2),
                             report={"pods": [{"namespace": "org-a", "name": "p", "gpus": 2}]})
    return handle


def staff_user(django_user_model, *perms: str):
    user = django_user_model.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


@pytest.mark.parametrize("page", (PAGE, CSV))
def test_staff_without_the_permission_is_refused_before_any_cluster_call(world, client, django_user_model, page):
    calls = len(world.gateway.calls)
    client.force_login(staff_user(django_user_model))
    response = client.get(page)
    assert response.status_code == 403
    assert "acme" not in response.content.decode() and "h100-2" not in response.content.decode()
    assert len(world.gateway.calls) == calls


def test_anonymous_is_sent_to_the_login_page(world, client):
    response = client.get(CSV)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def _rows(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def _hours(rows, org, mechanism) -> float:
    return sum(float(r["gpu_hours"]) for r in rows if r["org"] == org and r["mechanism"] == mechanism)


def test_csv_has_a_row_per_day_org_and_mechanism_from_the_records(world, client, django_user_model):
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    response = client.get(CSV, {"days": "7"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert re.fullmatch(r'attachment; filename="savings-sim-\d{4}-\d\d-\d\d-to-\d{4}-\d\d-\d\d\.csv"',
                        response["Content-Disposition"])
    text = response.content.decode()
    assert text.splitlines()[0] == "day_utc,org,mechanism,gpu_model,gpu_hours,money,currency,money_note"
    rows = _rows(response)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", r["day_utc"]) for r in rows)
    assert _hours(rows, "acme", "dormancy") == pytest.approx(6.0, abs=0.01)       # 1 × 2 GPUs × 3 h
    assert _hours(rows, "beta", "pruning") == pytest.approx(6.0, abs=0.01)        # 2 GPUs × 3 h
    assert _hours(rows, "(whole nodes)", "defrag/drain") == pytest.approx(16.0, abs=0.05)   # 8 GPUs × 2 h
    assert {r["mechanism"] for r in rows} == {"dormancy", "pruning", "defrag/drain"}   # no binpack run marked a node


@pytest.mark.parametrize("days", ["0", "-3", "abc", "1e9", "nan"])
def test_bad_days_is_a_clear_400_naming_the_field(world, client, django_user_model, days):
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    calls = len(world.gateway.calls)
    response = client.get(CSV, {"days": days})
    assert response.status_code == 400
    assert "days" in response.content.decode()
    assert len(world.gateway.calls) == calls


def test_page_shows_totals_nodes_exempt_orgs_and_a_stacked_chart(world, client, django_user_model):
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    response = client.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    config = json.loads(re.search(r'<script id="savings-chart-config" type="application/json">(.*?)</script>',
                                  html, re.S).group(1))
    assert config["type"] == "bar" and config["options"]["scales"]["x"]["stacked"] is True
    assert config["options"]["scales"]["y"]["title"]["text"] == "GPU-hours freed"
    assert sum(sum(d["data"]) for d in config["data"]["datasets"]) == pytest.approx(28.0, abs=0.1)
    assert "not measured" not in html
    assert re.search(r'<tr data-mechanism="binpack"><td>binpack</td>\s*<td class="num">0.00</td>', html)
    assert re.search(r'id="binpack-nodes"><strong>0</strong> node\(s\)', html)
    assert re.search(r'id="nodes-freed"><strong>1</strong> node\(s\).*<strong>1</strong> still out', html)
    assert "node h100-2 (defrag job #" in html
    # gamma is exempt and dormant; its Deployment's pod holds 3 GPUs now.
    assert re.search(r"<td>gamma</td><td>scale to zero turned off</td><td>yes</td><td class=\"num\">3</td>", html)
    assert re.search(r"<td>delta</td><td>snoozed for [^<]*: quarter close</td><td>no</td><td class=\"num\">0</td>",
                     html)
    assert "vendor/chartjs/chart.umd.min.js" in html


def test_the_admin_menu_links_the_savings_page_for_those_allowed(world, client, django_user_model):
    user = staff_user(django_user_model, "capacity.view_cluster_contents")
    client.force_login(user)
    listing = client.get("/admin/savings/savingscluster/")
    assert listing.status_code == 200
    assert 'href="/savings/clusters/sim/"' in listing.content.decode()
    assert "/admin/savings/savingscluster/" in client.get("/admin/").content.decode()
    other = django_user_model.objects.create_user("plain", "p@example.com", "pw", is_staff=True)
    client.force_login(other)
    assert client.get("/admin/savings/savingscluster/").status_code == 403


def model_scenario() -> list[dict]:
    """One model of org-a (an InferenceService asking 2 GPUs a replica) on a GPU node."""
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama", "namespace": "org-a"},
            "spec": {"predictor": {"minReplicas": 1, "containers": [gpu_container(2)]}}}
    return [node("h100-1"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "org-a"}}, isvc]


def _pruned_llama(handle, *, pod, owner_kind, method, acted_at, restored_at):
    """The pruner scaled org-a's llama (2 GPUs) down at `acted_at`, restored at `restored_at`."""
    run = PruneRun.objects.create(cluster=handle.cluster, mode=PruneRun.Mode.SCALE_DOWN, status="succeeded",
                                  evaluated_at=acted_at)
    PruneDecision.objects.create(run=run, namespace="org-a", pod=pod, owner_kind=owner_kind, owner_name="llama",
                                 gpus=["GPU-1", "GPU-2"], decision="prune", reason="idle", method=method,
                                 result="succeeded", acted_at=acted_at, restore="restored", restored_at=restored_at)


def test_a_model_pruned_while_its_org_sleeps_is_counted_once(sim_cluster_factory, client, django_user_model):
    """Its org went dormant 5 h ago (the model's floor 1 → 0) and woke 1 h ago; the pruner
    scaled the same model down 4 h ago and it was restored 30 min ago. Its 2 GPUs were
    freed from 5 h ago until 30 min ago: 9 GPU-hours, not the 15 the two records add up to.
    Dormancy held it first (8 GPU-hours); the pruner freed it alone for the last 30 min."""
    handle = sim_cluster_factory(model_scenario(), name="sim")
    handle.advance(60)
    now = clock.now()
    acme = Org.objects.create(slug="acme", cluster=handle.cluster, namespace="org-a", last_activity_at=now)
    workload = "podautoscaler org-a/llama-predictor-00001"
    AuditEntry.objects.create(app="orgs", at=now - timedelta(hours=5), action="scale_to_zero_applied", org=acme,
                               cause="switch #1: became dormant (dormancy sweep)",
                               old={workload: "1", "setting": "disabled"}, new={workload: "0", "setting": "enabled"})
    AuditEntry.objects.create(app="orgs", at=now - timedelta(hours=1), action="scale_to_zero_applied", org=acme,
                               cause="switch #2: became active (activity)",
                               old={workload: "0", "setting": "enabled"}, new={workload: "1", "setting": "disabled"})
    _pruned_llama(handle, pod="llama-predictor-00001-deployment-5d9c7b-x2kqp", owner_kind="InferenceService",
                  method="kserve-min-replicas", acted_at=now - timedelta(hours=4),
                  restored_at=now - timedelta(minutes=30))
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))

    rows = _rows(client.get(CSV, {"days": "7"}))
    assert _hours(rows, "acme", "dormancy") == pytest.approx(8.0, abs=0.01)   # 1 × 2 GPUs × 4 h
    assert _hours(rows, "acme", "pruning") == pytest.approx(1.0, abs=0.01)    # 2 GPUs × the last 30 min
    html = client.get(PAGE).content.decode()
    assert re.search(r'id="savings-total">9\.00<', html)
    assert "counted once, under dormancy" in html


def _asleep_acme(handle, *, slept_at, lowered_at=None):
    """acme (org-a) marked dormant at `slept_at`, its pynode's floor lowered 1 → 0 then (1 × 2 GPUs)."""
    acme = Org.objects.create(slug="acme", cluster=handle.cluster, namespace="org-a", last_activity_at=slept_at)
    DormancySwitch.objects.create(org=acme, at=slept_at, direction=DormancySwitch.Direction.TO_DORMANT,
                                  cause=DormancySwitch.Cause.SWEEP, applied_at=slept_at)
    AuditEntry.objects.create(app="orgs", at=lowered_at or slept_at, action="scale_to_zero_applied", org=acme,
                              cause="switch #1: became dormant (dormancy sweep)",
                              old={"ksvc org-a/llama": "1", "setting": "disabled"},
                              new={"ksvc org-a/llama": "0", "setting": "enabled"})
    return acme


def _woke(org, at):
    """The org woke at `at`; its apply patched nothing (the pruner's 0 stayed, or the revision was replaced)."""
    DormancySwitch.objects.create(org=org, at=at, direction=DormancySwitch.Direction.TO_ACTIVE,
                                  cause=DormancySwitch.Cause.ACTIVITY, applied_at=at)


def _disallowed(org, at):
    """An operator turned the org's scale to zero off at `at`; the apply patched nothing either."""
    AuditEntry.objects.create(app="orgs", at=at, action="org_disallow_scale_to_zero", org=org,
                              target=f"Org/{org.slug}", cause="operator",
                              old={"scale_to_zero_allowed": True}, new={"scale_to_zero_allowed": False})


@pytest.mark.parametrize("switched_off", (_woke, _disallowed), ids=("woke", "scale to zero disallowed"))
def test_dormancy_stops_counting_when_the_org_wakes_without_a_raise(sim_cluster_factory, client, django_user_model,
                                                                    switched_off):
    """acme slept 5 h and woke 1 h ago, but no raise of its pynode was recorded: the page
    counts the 5 h it slept (1 × 2 GPUs × 5 h), not the 6 h until now."""
    handle = sim_cluster_factory(scenario(), name="sim")
    handle.advance(60)
    now = clock.now()
    acme = _asleep_acme(handle, slept_at=now - timedelta(hours=6))
    switched_off(acme, now - timedelta(hours=1))
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))

    rows = _rows(client.get(CSV, {"days": "7"}))
    assert _hours(rows, "acme", "dormancy") == pytest.approx(10.0, abs=0.01)
    html = client.get(PAGE).content.decode()
    assert re.search(r'id="savings-total">10\.00<', html)
    assert "or its org woke or had scale to zero turned off" in html


def test_a_pynode_the_pruner_still_holds_after_its_org_woke_counts_under_pruning_once(
        sim_cluster_factory, client, django_user_model):
    """The pruner scaled acme's pynode down 6 h ago; acme slept 5 h ago (floor 1 → 0) and woke
    3 h ago without patching it (the pruner's 0 stayed); the pruner restored it 2 h ago. Its
    2 GPUs were freed for 4 h, 8 GPU-hours: dormancy the 2 h asleep, pruning the hour before
    the sleep and the hour after the wake."""
    handle = sim_cluster_factory(scenario(), name="sim")
    handle.advance(60)
    now = clock.now()
    acme = _asleep_acme(handle, slept_at=now - timedelta(hours=5))
    _woke(acme, now - timedelta(hours=3))
    _pruned_llama(handle, pod="llama-00001-deployment-5d9c7b-x2kqp", owner_kind="Service", method="knative-min-scale",
                  acted_at=now - timedelta(hours=6), restored_at=now - timedelta(hours=2))
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))

    rows = _rows(client.get(CSV, {"days": "7"}))
    assert _hours(rows, "acme", "dormancy") == pytest.approx(4.0, abs=0.01)   # 2 GPUs × 2 h asleep
    assert _hours(rows, "acme", "pruning") == pytest.approx(4.0, abs=0.01)    # 2 GPUs × (1 h before + 1 h after)
    assert re.search(r'id="savings-total">8\.00<', client.get(PAGE).content.decode())


def _pruned(handle, *, namespace, pod, acted_at, seconds):
    """One 1-GPU pod of `namespace` the pruner scaled down at `acted_at` for `seconds`."""
    run = PruneRun.objects.create(cluster=handle.cluster, mode=PruneRun.Mode.SCALE_DOWN, status="succeeded",
                                  evaluated_at=acted_at)
    PruneDecision.objects.create(run=run, namespace=namespace, pod=pod, owner_kind="Deployment", owner_name=pod,
                                 gpus=["GPU-1"], decision="prune", reason="idle", method="scale",
                                 result="succeeded", acted_at=acted_at, restore="restored",
                                 restored_at=acted_at + timedelta(seconds=seconds))


def _shown_figures(html: str) -> dict:
    """What the page shows: the headline, the mechanism cells, the per-org totals, the chart."""
    config = json.loads(re.search(r'<script id="savings-chart-config" type="application/json">(.*?)</script>',
                                  html, re.S).group(1))
    orgs = re.search(r'<table id="savings-orgs">.*?</table>', html, re.S).group(0)
    return {"headline": Decimal(re.search(r'id="savings-total">([^<]*)<', html).group(1)),
            "mechanisms": {m: Decimal(h) for m, h in re.findall(
                r'<tr data-mechanism="([^"]+)"><td>[^<]*</td>\s*<td class="num">([0-9.]+)</td>', html)},
            "org_totals": [Decimal(t) for t in re.findall(r'<td class="num">([0-9.]+)</td>(?:<td class="num">[0-9.]+</td>){2}</tr>',
                                                           orgs)],
            "chart": [Decimal(repr(v)) for d in config["data"]["datasets"] for v in d["data"]]}


def test_every_total_on_the_page_and_in_the_csv_is_the_sum_of_the_rows_shown(
        sim_cluster_factory, client, django_user_model):
    """Three orgs' pods pruned 40 min each (0.667 GPU-hours, shown 0.67) and one for 72 s
    (0.02): the headline is 2.03, the sum of the rows, not 2.0 beside rows of 0.7 or 0.0
    beside a bar of 0.02."""
    handle = sim_cluster_factory(model_scenario(), name="sim")
    handle.advance(60)
    now = clock.now()
    yesterday_noon = datetime.combine(now.astimezone(timezone.utc).date(), time(12), tzinfo=timezone.utc) \
        - timedelta(days=1)
    for namespace in ("org-a", "org-b", "org-c"):
        _pruned(handle, namespace=namespace, pod=f"idle-{namespace}", acted_at=yesterday_noon, seconds=40 * 60)
    _pruned(handle, namespace="org-a", pod="blip", acted_at=yesterday_noon - timedelta(days=1), seconds=72)
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))

    figures = _shown_figures(client.get(PAGE, {"days": "7"}).content.decode())
    assert figures["headline"] == Decimal("2.03")
    assert figures["mechanisms"] == {"dormancy": 0, "pruning": Decimal("2.03"), "defrag/drain": 0, "binpack": 0}
    assert sorted(figures["org_totals"]) == [Decimal("0.67"), Decimal("0.67"), Decimal("0.69")]
    assert sum(figures["org_totals"]) == figures["headline"] == sum(figures["chart"])
    rows = _rows(client.get(CSV, {"days": "7"}))
    assert sorted(r["gpu_hours"] for r in rows) == ["0.02", "0.67", "0.67", "0.67"]
    assert sum(Decimal(r["gpu_hours"]) for r in rows) == figures["headline"]


def test_a_total_below_a_tenth_of_a_gpu_hour_is_shown_as_the_bar_beside_it(
        sim_cluster_factory, client, django_user_model):
    """One pod pruned for 72 s: 0.02 GPU-hours on the headline, the pruning row and the bar."""
    handle = sim_cluster_factory(model_scenario(), name="sim")
    handle.advance(60)
    noon = datetime.combine(clock.now().astimezone(timezone.utc).date(), time(12), tzinfo=timezone.utc)
    _pruned(handle, namespace="org-a", pod="blip", acted_at=noon - timedelta(days=1), seconds=72)
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))

    figures = _shown_figures(client.get(PAGE).content.decode())
    assert figures["headline"] == figures["mechanisms"]["pruning"] == sum(figures["chart"]) == Decimal("0.02")


def test_a_retired_orgs_savings_stay_on_the_page_and_in_the_csv(world, client, django_user_model):
    from orgs.retirement import org_retire

    for slug in ("acme", "beta"):
        org_retire(org=Org.objects.get(slug=slug), actor=None, now=clock.now())
    client.force_login(staff_user(django_user_model, "capacity.view_cluster_contents"))
    rows = _rows(client.get(CSV, {"days": "7"}))
    assert _hours(rows, "acme", "dormancy") == pytest.approx(6.0, abs=0.01)
    assert _hours(rows, "beta", "pruning") == pytest.approx(6.0, abs=0.01)
