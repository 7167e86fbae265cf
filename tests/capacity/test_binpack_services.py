"""Binpack service, command, admin action and task on the simulated cluster through the
real client: only pods whose cost changes are patched, hand-set costs and opted-out
workloads are left alone, dry runs write nothing, every run is recorded."""
from __future__ import annotations

import json
import re
import uuid

import kubernetes
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.utils.html import escape

from audit.models import AuditEntry
from capacity.binpack import planning as bp
from clusters import labels
from capacity.binpack.services import pod_deletion_costs_apply
from capacity.binpack.models import WRITE_RESULTS, BinpackRun
from clusters.kube import PODS, KubeGateway
from simcluster.generate import namespace as namespace_doc
from tests.settings_check import manage_check
from simcluster.generate import node as node_doc

pytestmark = pytest.mark.django_db
NS = "team"


def rs_doc(name: str, *, replicas: int, annotations=None, owner=None) -> dict:
    # The ReplicaSet carries its selector's labels: a Deployment claims ReplicaSets by
    # their own labels and releases those that do not match (as upstream does).
    meta = {"name": name, "namespace": NS, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            "labels": {"app": name}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta,
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "model:1"}]}}}}


def pod_doc(name: str, rs: dict, node: str, *, annotations=None) -> dict:
    meta = {"name": name, "namespace": NS, "labels": {"app": rs["metadata"]["name"]},
            "annotations": annotations or {}, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{name}")),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
                                 "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "model:1", "resources": {
                "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def scenario() -> list[dict]:
    """n1: a-0, a-1, b-0 (shared); n2: a-2 alone; n3: b-1 by-hand; n4: c-0 (opted out via its Deployment).

    Replica counts match the pods each ReplicaSet owns (b: b-0, b-1 and `web`), else the
    running ReplicaSet controller deletes or adds pods before the test starts."""
    a, b = rs_doc("a", replicas=3), rs_doc("b", replicas=3)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "c", "namespace": NS, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "deploy/c")),
                               "annotations": {labels.BINPACK_OPT_OUT: "false"}},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "c-rs"}},
                           "template": {"metadata": {"labels": {"app": "c-rs"}},
                                        "spec": {"containers": [{"name": "main", "image": "model:1"}]}}}}
    c = rs_doc("c-rs", replicas=1, owner={"apiVersion": "apps/v1", "kind": "Deployment", "name": "c",
                                          "uid": deployment["metadata"]["uid"], "controller": True})
    nodes = [node_doc(f"n{i}", pool="h100", product="NVIDIA-H100", gpus=8) for i in range(1, 5)]
    nodes.append(node_doc("cpu-1", pool="cpu"))
    return nodes + [namespace_doc(NS), a, b, deployment, c,
                    pod_doc("a-0", a, "n1"), pod_doc("a-1", a, "n1"), pod_doc("b-0", b, "n1"),
                    pod_doc("a-2", a, "n2"),
                    pod_doc("b-1", b, "n3", annotations={labels.DELETION_COST: "999"}),
                    pod_doc("c-0", c, "n4"), pod_doc("web", b, "cpu-1")]


@pytest.fixture
def world(sim_cluster_factory):
    handle = sim_cluster_factory(scenario())
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    yield handle, kubernetes.client.CoreV1Api(api)
    api.close()


def cost_of(core, name):
    annotations = core.read_namespaced_pod(name, NS).metadata.annotations or {}
    return annotations.get(labels.DELETION_COST)


def patches(handle) -> int:
    return handle.gateway.calls[("patch", "pods")]


def test_costs_order_pods_so_the_emptiest_node_drains_first_and_rerun_writes_nothing(world):
    handle, core = world
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert run.written == run.planned == 4 == patches(handle)     # a-0, a-1, b-0, a-2
    costs = {n: int(cost_of(core, n)) for n in ("a-0", "a-1", "a-2", "b-0")}
    assert costs["a-2"] < costs["a-0"] == costs["a-1"]           # a-2 alone on n2: deleted first
    for value in costs.values():
        assert bp.parse_cost(str(value)) == value
    assert cost_of(core, "web") is None                          # CPU node: not ours to cost

    # The run is audited once, each pod's cost before and after.
    (entry,) = AuditEntry.objects.filter(app="binpack")
    assert (entry.subject_type, entry.subject_id, entry.cluster) == ("binpack_run", run.pk, handle.cluster)
    assert entry.old == {f"{NS}/{n}": None for n in costs} and entry.new == {f"{NS}/{n}": v for n, v in costs.items()}
    assert entry.target == f"4 pod(s) of cluster {handle.cluster}" and f"binpack run #{run.pk}" in entry.cause

    again, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    assert again.planned == again.written == 0 and again.unchanged == 4
    assert patches(handle) == 4                                  # nothing rewritten
    assert AuditEntry.objects.filter(app="binpack").count() == 1  # nothing patched: nothing to audit


def test_only_pods_whose_cost_changes_are_patched(world):
    handle, core = world
    pod_deletion_costs_apply(cluster=handle.cluster)
    before = {n: cost_of(core, n) for n in ("a-0", "a-1", "a-2", "b-0")}
    # n1 is now a's alone. b is scaled down with it, else its ReplicaSet would replace
    # b-0 (and the scheduler could put the new pod anywhere).
    apps = kubernetes.client.AppsV1Api(core.api_client)
    apps.patch_namespaced_replica_set_scale("b", NS, {"spec": {"replicas": 2}})
    core.delete_namespaced_pod("b-0", NS, grace_period_seconds=0)
    handle.advance(0)
    assert {p.metadata.name for p in core.list_namespaced_pod(NS).items} == {"a-0", "a-1", "a-2", "b-1", "c-0", "web"}
    calls = patches(handle)
    run, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    changed = {n for n in ("a-0", "a-1", "a-2") if cost_of(core, n) != before[n]}
    assert changed == {"a-0", "a-1"}
    assert run.written == 2 == patches(handle) - calls


def test_hand_set_costs_and_opted_out_workloads_are_left_alone(world):
    handle, core = world
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert cost_of(core, "b-1") == "999"
    assert cost_of(core, "c-0") is None
    assert {s.name: s.reason for s in plan.skipped} == {"b-1": "cost '999' set by hand", "c-0": "workload opted out"}
    forced, _ = pod_deletion_costs_apply(cluster=handle.cluster, override_manual=True)
    assert forced.written == 1 and cost_of(core, "b-1") != "999"


def gets(handle) -> int:
    return handle.gateway.calls[("get", "pods")]


def planned_change(core, name: str, *, new: int = 5) -> bp.CostChange:
    """A change planned from the pod as it is now (its uid, version and cost)."""
    meta = core.read_namespaced_pod(name, NS).metadata
    (owner,) = meta.owner_references
    return bp.CostChange(namespace=NS, name=name, uid=meta.uid, node="n2", group=None,
                         workload=f"{NS}/{owner.kind}/{owner.name}",   # as the plan names it, judged again
                         old=(meta.annotations or {}).get(labels.DELETION_COST), new=new, reason="test",
                         resource_version=meta.resource_version)


def test_pods_unchanged_since_the_snapshot_are_written_without_reading_them_again(world):
    handle, core = world
    run, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    assert run.written == 4 == patches(handle)
    assert gets(handle) == 0                  # each write conditioned on the version the snapshot read


@pytest.mark.parametrize("concurrency", [1, 8])
def test_every_planned_cost_is_written_one_or_several_writes_at_a_time(world, settings, concurrency):
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = concurrency
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert run.written == len(plan.changes) == 4 and run.stale == 0 and run.errors == []
    assert {c.name: str(c.new) for c in plan.changes} == {c.name: cost_of(core, c.name) for c in plan.changes}


def test_a_pod_whose_cost_changed_since_the_snapshot_is_not_overwritten(world):
    handle, core = world
    from capacity.binpack import services

    change = planned_change(core, "a-2")
    core.patch_namespaced_pod("a-2", NS, {"metadata": {"annotations": {labels.DELETION_COST: "42"}}})
    errors: list[str] = []
    assert services._apply_one(handle.gateway, change, errors) == "stale"
    assert cost_of(core, "a-2") == "42" and errors == []
    assert gets(handle) == 1                  # the conditioned write was refused: read and judged again


def test_a_pod_changed_otherwise_since_the_snapshot_is_judged_again_and_written(world):
    handle, core = world
    from capacity.binpack import services

    change = planned_change(core, "a-2")
    core.patch_namespaced_pod("a-2", NS, {"metadata": {"labels": {"seen": "yes"}}})
    errors: list[str] = []
    assert services._apply_one(handle.gateway, change, errors) == "written"
    assert cost_of(core, "a-2") == "5" and errors == []
    assert core.read_namespaced_pod("a-2", NS).metadata.labels["seen"] == "yes"   # the other change kept
    assert gets(handle) == 1


def test_a_pod_recreated_under_the_same_name_is_not_written(world):
    handle, core = world
    from capacity.binpack import services

    change = planned_change(core, "a-2")
    fresh = core.read_namespaced_pod("a-2", NS).to_dict()
    core.delete_namespaced_pod("a-2", NS, grace_period_seconds=0)
    handle.advance(0)
    pod = pod_doc("a-2", rs_doc("a", replicas=3), "n2")
    pod["metadata"]["uid"] = "another-uid"
    pod["metadata"].pop("ownerReferences")    # no controller, so nothing else replaces or removes it
    core.create_namespaced_pod(NS, pod)
    assert core.read_namespaced_pod("a-2", NS).metadata.uid != fresh["metadata"]["uid"]
    errors: list[str] = []
    assert services._apply_one(handle.gateway, change, errors) == "stale"
    assert cost_of(core, "a-2") is None and errors == []


def test_a_pod_gone_since_the_snapshot_is_stale_not_an_error(world):
    handle, core = world
    from capacity.binpack import services

    change = planned_change(core, "a-2")
    apps = kubernetes.client.AppsV1Api(core.api_client)
    apps.patch_namespaced_replica_set_scale("a", NS, {"spec": {"replicas": 2}})
    core.delete_namespaced_pod("a-2", NS, grace_period_seconds=0)
    handle.advance(0)
    errors: list[str] = []
    assert services._apply_one(handle.gateway, change, errors) == "stale" and errors == []


@pytest.mark.parametrize("value", ["0", "33", "-1"])
def test_the_product_does_not_start_with_a_write_concurrency_out_of_range(value):
    proc = manage_check(BINPACK_WRITE_CONCURRENCY=value)
    assert proc.returncode != 0
    assert (f"ImproperlyConfigured: BINPACK_WRITE_CONCURRENCY must be the cost patches in flight at once: "
            f"a whole number at least 1 and at most 32, not '{value}'" in proc.stderr)


A2_WHY = ("node n2: 1 of 8 GPUs in use, 1 pod (all of its workload, no other workload on it) → deleted first of "
          "its workload's 2 nodes; cost = (0 + 1) × 1024 + 342 (node tie-break) = 1366")


def test_command_dry_run_prints_what_it_would_write_and_writes_nothing(world, capsys):
    handle, core = world
    call_command("binpack", "--cluster", handle.cluster.name, "--dry-run")
    out = capsys.readouterr().out.splitlines()
    assert f"would write team/a-2: - -> 1366 ({A2_WHY})" in out
    # b's other pod carries a hand-set 999, so b-0's node goes last whatever its own cost.
    assert ("would write team/b-0: - -> 265452 (node n1: 3 of 8 GPUs in use, 3 pods (1 of its workload, 2 of others: "
            "shared, +256 as its workload alone cannot free it) → deleted last of its workload's 2 nodes; "
            "cost = (256 + 3) × 1024 + 236 (node tie-break) = 265452)") in out
    assert out[-2:] == ["4 to write, 0 unchanged, 2 skipped", bp.COST_ORDER]
    assert cost_of(core, "a-2") is None and patches(handle) == 0
    call_command("binpack", "--cluster", handle.cluster.name, "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["written"] == 4 and {c["pod"] for c in report["changes"]} == {"a-0", "a-1", "a-2", "b-0"}
    assert cost_of(core, "a-2") == str(next(c["new"] for c in report["changes"] if c["pod"] == "a-2"))
    runs = list(BinpackRun.objects.order_by("id").values_list("trigger", "dry_run", "written"))
    assert runs == [("command", True, 0), ("command", False, 4)]


def test_command_explains_a_pods_cost_whether_or_not_it_changes(world, capsys):
    handle, core = world
    pod_deletion_costs_apply(cluster=handle.cluster)
    call_command("binpack", "--cluster", handle.cluster.name, "--dry-run", "--explain", "team/a-2",
                 "--explain", "team/b-1", "--explain", "team/c-0")
    out = capsys.readouterr().out.splitlines()
    assert out == ["0 to write, 4 unchanged, 2 skipped", f"why team/a-2: {A2_WHY}",
                   "why team/b-1: no cost of ours: cost '999' set by hand",
                   "why team/c-0: no cost of ours: workload opted out", bp.COST_ORDER]
    call_command("binpack", "--cluster", handle.cluster.name, "--dry-run", "--json", "--explain", "team/a-2")
    report = json.loads(capsys.readouterr().out)
    assert report["explained"] == {"team/a-2": A2_WHY} and report["explain_not_found"] == []


def test_command_says_a_pod_to_explain_is_not_in_the_cluster_and_goes_on(world, capsys):
    """A pod that does not exist is not one that gets no cost: said so, text and JSON, and the
    run is made as asked (no failure)."""
    handle, core = world
    call_command("binpack", "--cluster", handle.cluster.name, "--explain", "team/a-9", "--explain", "team/web")
    out = capsys.readouterr().out.splitlines()
    run = BinpackRun.objects.get()
    assert (f"why team/a-9: no such pod: team/a-9 is not in the cluster's reading "
            f"(taken at {run.started_at:%Y-%m-%d %H:%M:%S %Z})") in out
    assert "why team/web: no cost of ours: not among the live pods with a controller on GPU nodes" in out
    assert out[-1] == f"written 4, stale 0, errors 0 (run {run.pk})" and run.written == 4

    call_command("binpack", "--cluster", handle.cluster.name, "--dry-run", "--json", "--explain", "team/a-9",
                 "--explain", "team/a-2")
    report = json.loads(capsys.readouterr().out)
    assert report["explain_not_found"] == ["team/a-9"]
    assert report["explained"]["team/a-9"].startswith("no such pod: team/a-9 is not in the cluster's reading")
    assert report["explained"]["team/a-2"] == A2_WHY


def test_command_refuses_an_explain_that_names_no_pod_before_reading_the_cluster(world):
    from django.core.management.base import CommandError

    handle, core = world
    with pytest.raises(CommandError, match=r"--explain wants NAMESPACE/POD, got 'a-2'"):
        call_command("binpack", "--cluster", handle.cluster.name, "--explain", "a-2")
    assert BinpackRun.objects.count() == 0 and handle.gateway.calls[("list", "pods")] == 0


def test_the_run_page_shows_each_change_with_why(world, client):
    handle, core = world
    run, _ = pod_deletion_costs_apply(cluster=handle.cluster, dry_run=True)
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    html = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    rows = changes_table(html)
    assert ("team/a-2", "n2", "—", "1366", "dry run: not written", escape(A2_WHY)) in rows and len(rows) == 4
    assert escape(bp.COST_ORDER) in html


def changes_table(html: str) -> list[tuple[str, ...]]:
    """The run page's "changes and why" rows: pod, node, old cost, new cost, result, why."""
    return re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>",
                      re.search(r'<table id="binpack-changes">(.*?)</table>', html, re.S).group(1))


def after_planning(monkeypatch, act) -> None:
    """Run `act()` between the plan and its writes: someone else acting on the cluster then."""
    plan = bp.binpack_plan

    def plan_then_act(*args, **kwargs):
        planned = plan(*args, **kwargs)
        act()
        return planned

    monkeypatch.setattr(bp, "binpack_plan", plan_then_act)


def test_a_write_run_says_which_costs_it_wrote_and_which_it_did_not(world, monkeypatch, capsys):
    """A pod whose owner set its cost between the plan and the write keeps that cost, and
    the command says that pod was not written instead of printing the planned cost as done."""
    handle, core = world
    after_planning(monkeypatch, lambda: core.patch_namespaced_pod(
        "a-2", NS, {"metadata": {"annotations": {labels.DELETION_COST: "7"}}}))
    call_command("binpack", "--cluster", handle.cluster.name)
    out = capsys.readouterr().out.splitlines()
    assert cost_of(core, "a-2") == "7"                                     # the owner's cost stays
    assert f"not written, the pod changed or went away since the plan: team/a-2: - -> 1366 ({A2_WHY})" in out
    assert not any(line.startswith(("team/a-2", "wrote team/a-2")) for line in out)
    assert [line.split(":")[0] for line in out if line.startswith("wrote ")] == [
        "wrote team/a-0", "wrote team/a-1", "wrote team/b-0"]
    assert out[-1] == f"written 3, stale 1, errors 0 (run {BinpackRun.objects.get().pk})"
    assert set(AuditEntry.objects.get(app="binpack").new) == {"team/a-0", "team/a-1", "team/b-0"}


def test_failed_writes_are_said_per_pod_and_the_command_exits_1(world, settings, client, capsys):
    """Every patch answered with a 500 (after the gateway's retries): the first write's
    outcome is not known (a server error may come after the write was applied), the rest
    are not tried; the command says so of each pod and exits 1, and the rest of the run is
    not spent retrying a cluster that does not answer."""
    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    handle.control.set_faults(error_rate=1.0, match={"verbs": ["patch"], "resources": ["pods"]})
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as failed:
        call_command("binpack", "--cluster", handle.cluster.name)
    run = BinpackRun.objects.get()
    assert str(failed.value) == (f"3 of 4 cost(s) not written and 1 of 4 cost(s) of unknown outcome (the write's "
                                 "answer was lost; the next run on the cluster settles it from the pod) on cluster "
                                 f"default (run {run.pk}): team/a-0: 500 InternalError: simcluster injected fault: "
                                 "internal error")
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert [line.split(": team/")[0] for line in out[:4]] == [
        WRITE_RESULTS["unknown"]] + ["not written, not tried: the cluster had stopped answering"] * 3
    assert not any(line.startswith("wrote ") for line in out)
    assert out[-1] == (f"written 0, stale 0, errors 0, outcome unknown 1 (settled by the next run), not tried 3 "
                       f"(run {run.pk})")
    assert captured.err.splitlines()[-2:] == [
        "1 write(s) sent whose answer was lost (above): their outcome is not known; the next run on the cluster "
        "settles them from the pods before it plans",
        "3 write(s) not tried after the cluster failed to answer a write (above); the next run plans them again"]
    assert patches(handle) == settings.KUBE_RETRY_ATTEMPTS            # one pod's retries, not every pod's
    assert all(cost_of(core, n) is None for n in ("a-0", "a-1", "a-2", "b-0"))
    assert not AuditEntry.objects.filter(app="binpack").exists()
    # The run page says the same of each pod.
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    html = client.get(f"/admin/capacity/binpackrun/{run.pk}/change/").content.decode()
    assert sorted(row[4] for row in changes_table(html)) == [
        "not written, not tried: the cluster had stopped answering"] * 3 + [escape(WRITE_RESULTS["unknown"])]


@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_a_pod_opted_out_between_the_plan_and_the_write_gets_no_cost(world, monkeypatch, where):
    handle, core = world
    after_planning(monkeypatch, lambda: core.patch_namespaced_pod(
        "a-2", NS, {"metadata": {where: {labels.BINPACK_OPT_OUT: "false"}}}))
    run, plan = pod_deletion_costs_apply(cluster=handle.cluster)
    assert "a-2" in {c.name for c in plan.changes}
    assert cost_of(core, "a-2") is None and (run.written, run.stale) == (3, 1)
    assert "team/a-2" not in AuditEntry.objects.get(app="binpack").new
    again, plan = pod_deletion_costs_apply(cluster=handle.cluster)            # the next run agrees
    assert "a-2" not in {c.name for c in plan.changes} and cost_of(core, "a-2") is None


def test_a_pod_orphaned_between_the_plan_and_the_write_gets_no_cost(world, monkeypatch):
    """A defrag job orphans a pod (no owner, no pod-template-hash): no controller reads a cost on it."""
    handle, core = world
    after_planning(monkeypatch, lambda: core.patch_namespaced_pod(
        "a-2", NS, [{"op": "remove", "path": "/metadata/ownerReferences"}]))
    run, _ = pod_deletion_costs_apply(cluster=handle.cluster)
    assert cost_of(core, "a-2") is None and (run.written, run.stale) == (3, 1)


@pytest.mark.parametrize("content", [b"clusters: [", b"- a list\n- not a kubeconfig\n", b"\xff\xfe not text"])
def test_a_malformed_kubeconfig_is_named_recorded_and_nothing_is_written(db, tmp_path, content):
    """Not YAML, YAML of another shape, not text: each is the operator's to fix, said as such."""
    from django.core.management.base import CommandError
    from clusters.models import Cluster

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    Cluster.objects.create(name="broken", kubeconfig_path=str(kubeconfig))
    with pytest.raises(CommandError) as failed:
        call_command("binpack", "--cluster", "broken")
    assert str(failed.value).startswith(f"cluster broken: 0 ConfigError: cannot load kubeconfig '{kubeconfig}' "
                                        "(context 'current'): not a kubeconfig file: ")
    (run,) = BinpackRun.objects.all()
    assert run.errors[0].startswith("cluster not read, nothing written: refused: 0 ConfigError: cannot load "
                                    f"kubeconfig '{kubeconfig}'")


def test_command_names_an_unknown_cluster(world):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no cluster named 'nope'"):
        call_command("binpack", "--cluster", "nope")


def test_admin_action_needs_its_permission_and_records_the_operator(world, client):
    handle, core = world
    operator = User.objects.create_user("op", password="pw", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_binpackrun"))
    client.force_login(operator)
    url = "/admin/capacity/binpackcluster/"
    form = {"action": "run_binpack", "_selected_action": [handle.cluster.pk]}
    response = client.post(url, form)
    assert cost_of(core, "a-2") is None               # no permission: the action is not offered
    operator.user_permissions.add(Permission.objects.get(codename="run_binpack"))
    operator = User.objects.get(pk=operator.pk)
    client.force_login(operator)
    response = client.post(url, form, follow=True)
    assert response.status_code == 200
    assert cost_of(core, "a-2") is not None
    run = BinpackRun.objects.get()
    assert (run.actor, run.trigger, run.written) == (operator, "admin", 4)
    assert AuditEntry.objects.get(app="binpack").actor == operator
    assert [str(m) for m in response.context["messages"]] == [
        f"default: wrote 4 of 4 cost(s), 0 unchanged, 2 skipped, 0 stale, 0 error(s) (run {run.pk})"]


def test_the_beat_task_costs_every_cluster(world, celery_eager):
    handle, core = world
    from capacity.binpack.tasks import binpack_all_clusters

    assert binpack_all_clusters.delay().get() == 1
    run = BinpackRun.objects.get()
    assert (run.actor, run.trigger, run.written) == (None, "schedule", 4)
    assert cost_of(core, "a-2") is not None


class PatchFaults(KubeGateway):
    """The gateway, over HTTP to the simulated cluster, each try of a pod patch going through
    `fault(pod, send)`: `send(body=...)` makes the request (the cluster applies it or not,
    as it would) and returns its answer; the fault may then lose that answer (raise), or
    raise without sending (the request never reached the API server)."""

    def __init__(self, *args, fault, **kwargs):
        super().__init__(*args, **kwargs)
        self.fault = fault

    @classmethod
    def to(cls, handle, settings, fault) -> "PatchFaults":
        return cls.from_kubeconfig(handle.kubeconfig_path, fault=fault, retry_attempts=settings.KUBE_RETRY_ATTEMPTS,
                                   backoff=settings.KUBE_RETRY_BACKOFF, backoff_max=settings.KUBE_RETRY_BACKOFF_MAX)

    def _send_once(self, verb, resource, method, path, query, body, *rest):
        if verb != "patch" or resource is not PODS:
            return super()._send_once(verb, resource, method, path, query, body, *rest)

        def send(body=body):
            return super(PatchFaults, self)._send_once(verb, resource, method, path, query, body, *rest)
        return self.fault(path.rsplit("/", 1)[-1], send)


def test_a_cost_whose_write_answer_was_lost_is_counted_written_and_audited(world, settings):
    """The first patch of a-0 reaches the API server but its answer is lost (the connection
    drops): the gateway tries again, the pod's version has moved under that very write, and
    the retry is refused 409. The pod carries the run's cost: it was written by this run,
    and is audited as such, not put down as someone else's change."""
    from clusters.errors import Unavailable

    handle, core = world
    settings.BINPACK_WRITE_CONCURRENCY = 1
    lost: list[str] = []

    def answer_lost_once(pod, send):
        answer = send()
        if not lost:
            lost.append(pod)   # applied, then the answer never came
            raise Unavailable("connection reset by peer", code=0)
        return answer

    gateway = PatchFaults.to(handle, settings, answer_lost_once)
    try:
        run, _ = pod_deletion_costs_apply(cluster=handle.cluster, gateway=gateway)
    finally:
        gateway.close()
    assert lost == ["a-0"]
    assert gateway.calls[("patch", "pods")] == 5 and gateway.retries[("patch", "pods")] == 1   # a-0 twice
    assert (run.written, run.stale, run.errors) == (4, 0, [])
    assert cost_of(core, "a-0") is not None
    assert set(AuditEntry.objects.get(app="binpack").new) == {"team/a-0", "team/a-1", "team/a-2", "team/b-0"}
