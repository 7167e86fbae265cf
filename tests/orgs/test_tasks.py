"""The scale-to-zero apply task on the simulated cluster: a refusal (403) runs once and the
org, its audit and the task say why; a server error (5xx) is retried with back-off."""
from __future__ import annotations

import pytest

from audit.models import AuditEntry
from orgs.services import CONFLICT_RETRIES
from orgs.tasks import ApplyIncomplete, org_scale_to_zero_apply
from simcluster.generate import pynode
from tests.kube_access import cluster_denied, cluster_read_only, denials
from tests.orgs.test_real_clusters import world
from tests.orgs.test_services import ksvc_min_scale

pytestmark = pytest.mark.django_db


def attempts(org) -> int:
    """Each apply that could not finish leaves one audit record."""
    return AuditEntry.objects.filter(org=org, action="scale_to_zero_apply_incomplete").count()


def test_an_apply_the_cluster_refuses_runs_once_and_the_org_says_why(sim_cluster_factory, tmp_path, make_org,
                                                                     celery_eager):
    handle = sim_cluster_factory()
    org = make_org("acme", idle_hours=48, cluster=cluster_denied(handle, tmp_path), dormant=True)

    result = org_scale_to_zero_apply.apply(args=[org.id])

    assert result.failed() and isinstance(result.result, ApplyIncomplete) and not result.result.transient
    assert "acme: scale to zero enabled NOT fully applied" in str(result.result)
    assert "403 Forbidden" in str(result.result)
    assert attempts(org) == 1 and len(denials(handle)) == 1
    org.refresh_from_db()
    assert org.applied == "" and "403 Forbidden" in org.last_error


def test_an_apply_that_meets_server_errors_is_retried(sim_cluster_factory, make_org, celery_eager):
    handle = sim_cluster_factory()
    org = make_org("acme", idle_hours=48, cluster=handle.cluster, dormant=True)
    handle.control.set_faults(seed=0, error_rate=1.0)

    result = org_scale_to_zero_apply.apply(args=[org.id])

    assert result.failed() and isinstance(result.result, ApplyIncomplete) and result.result.transient
    assert "500 InternalError" in str(result.result)
    assert attempts(org) == 1 + org_scale_to_zero_apply.max_retries
    org.refresh_from_db()
    assert org.applied == "" and "500 InternalError" in org.last_error


def test_a_refused_patch_is_not_retried_and_leaves_the_workload_as_it_was(sim_cluster_factory, tmp_path, make_org,
                                                                          celery_eager):
    handle = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    handle.advance(0)
    org = make_org("acme", idle_hours=48, cluster=cluster_read_only(handle, tmp_path), dormant=True)

    result = org_scale_to_zero_apply.apply(args=[org.id])

    assert result.failed() and not result.result.transient
    assert [(d.verb, d.resource, d.name) for d in denials(handle)] == [("patch", "services", "pynode")]
    assert attempts(org) == 1
    org.refresh_from_db()
    assert org.pending and "403 Forbidden" in org.pending[0]
    assert ksvc_min_scale(handle.gateway, "pynode") == "1", "the pynode keeps its setting"


def test_a_conflict_that_outlasts_its_retries_fails_the_apply_with_its_reason(sim_cluster_factory, make_org,
                                                                              celery_eager):
    handle = sim_cluster_factory(world(orgs={"acme": [pynode("acme")]}))
    handle.advance(0)
    org = make_org("acme", idle_hours=48, cluster=handle.cluster, dormant=True)
    handle.control.set_faults(seed=0, conflict_rate=1.0, match={"verbs": ["patch"]})

    result = org_scale_to_zero_apply.apply(args=[org.id])

    assert result.failed() and not result.result.transient
    assert handle.gateway.calls_total(("patch",)) == CONFLICT_RETRIES, "tried again at once, then gave up"
    assert attempts(org) == 1
    org.refresh_from_db()
    assert "409 Conflict" in org.pending[0] and org.applied == ""
    assert ksvc_min_scale(handle.gateway, "pynode") == "1"


def test_the_retry_pass_tries_a_cluster_that_does_not_answer_for_one_org_only(sim_cluster_factory, tmp_path,
                                                                            make_org, settings, celery_eager):
    import socket

    from clusters.kube import gateway_for
    from clusters.models import Cluster
    from orgs.tasks import scale_to_zero_retry, scale_to_zero_retry_cluster
    from simcluster.kubeconfig import write_kubeconfig

    handle = sim_cluster_factory(world(orgs={"live": [pynode("live")]}))
    handle.advance(0)
    with socket.socket() as probe:       # a port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = Cluster.objects.create(name="down", kubeconfig_path=str(
        write_kubeconfig(tmp_path / "down", f"http://127.0.0.1:{closed}")))
    make_org("down-a", idle_hours=48, cluster=down, dormant=True)
    first = scale_to_zero_retry_cluster(down.pk)
    one_org = gateway_for(down).calls_total()      # what one org's apply costs: every attempt counted
    assert first["incomplete"] and "ConnectionError" in first["incomplete"][0] and first["skipped"] == []
    assert one_org >= settings.KUBE_RETRY_ATTEMPTS, "the gateway retried the unanswered request"

    others = [make_org(slug, idle_hours=48, cluster=down, dormant=True) for slug in ("down-b", "down-c")]
    live = make_org("live", idle_hours=48, cluster=handle.cluster, dormant=True)
    second = scale_to_zero_retry_cluster(down.pk)

    assert gateway_for(down).calls_total() == 2 * one_org, "down-a was tried again, down-b and down-c not at all"
    assert [line.split(":")[0] for line in second["skipped"]] == ["down-b", "down-c"]
    assert all("not tried: cluster down did not answer" in line and "left for the next pass" in line
               for line in second["skipped"])
    for org in others:
        org.refresh_from_db()
        assert org.applied == "" and org.reconciled_at is None and org.last_error == ""
        assert not AuditEntry.objects.filter(org=org).exists()
    # The beat's pass: one retry task per cluster with work (eager here), the live cluster's
    # in a task of its own, whatever the silent cluster costs.
    assert scale_to_zero_retry() == 2
    live.refresh_from_db()
    assert live.applied == "enabled", "the other cluster's org was applied by its own task"
    assert ksvc_min_scale(handle.gateway, "pynode", ns="live") == "0"


def _down_cluster(tmp_path):
    """A cluster row whose API server is a port nothing listens on: connection refused."""
    import socket

    from clusters.models import Cluster
    from simcluster.kubeconfig import write_kubeconfig

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    return Cluster.objects.create(name="down", kubeconfig_path=str(
        write_kubeconfig(tmp_path / "down", f"http://127.0.0.1:{closed}")))


def test_a_reconcile_names_a_cluster_that_does_not_answer_in_one_line_exits_1_and_asks_it_no_more(
        sim_cluster_factory, tmp_path, make_org, settings, celery_eager, capsys):
    """It used to exit 0 saying nothing, or try each org of the silent cluster with the
    gateway's full retries (1m46s for 30 orgs), each 'NOT fully applied (drift repair)'."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from clusters.kube import gateway_for

    handle = sim_cluster_factory(world(orgs={"live": [pynode("live")]}))
    handle.advance(0)
    down = _down_cluster(tmp_path)
    silent = [make_org(f"down-{i}", idle_hours=48, cluster=down, dormant=True) for i in range(5)]
    make_org("live", idle_hours=48, cluster=handle.cluster, dormant=True)

    with pytest.raises(CommandError) as failed:
        call_command("reconcile_scale_to_zero")

    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("cluster down could not be read: 0 ") and "ConnectionError" in message
    assert message.endswith("; the scheduled reconcile tries it again")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "live: scale to zero enabled applied (first apply): 1 workload(s) patched"
    assert len(out) == 2 and out[1].startswith("  ksvc live/pynode: min-scale 1 → 0"), "no line for the silent orgs"
    assert ksvc_min_scale(handle.gateway, "pynode", ns="live") == "0", "the other cluster is reconciled"
    # API discovery and one list, each with its retries, whatever the number of orgs.
    assert gateway_for(down).calls_total() <= 2 * settings.KUBE_RETRY_ATTEMPTS
    for org in silent:
        org.refresh_from_db()
        assert org.reconciled_at is None and org.applied == ""
        assert org.last_error.startswith("reconcile could not read the cluster: 0 ")
        assert not AuditEntry.objects.filter(org=org).exists()


def test_a_reconcile_stops_asking_a_cluster_that_stops_answering(sim_cluster_factory, make_org, monkeypatch,
                                                                  celery_eager):
    from config import clock
    from orgs import services

    slugs = ("a-org", "b-org", "c-org")
    handle = sim_cluster_factory(world(orgs={slug: [pynode(slug)] for slug in slugs}))
    handle.advance(0)
    orgs = [make_org(slug, idle_hours=48, cluster=handle.cluster, dormant=True) for slug in slugs]
    read = services.workloads_read

    def read_then_go_silent(*args, **kwargs):
        found = read(*args, **kwargs)
        handle.server.stop()      # the API server goes away between the read and the first apply
        return found

    monkeypatch.setattr(services, "workloads_read", read_then_go_silent)
    result = services.orgs_reconcile(now=clock.now())

    [tried] = result.outcomes
    assert tried.org == "a-org" and not tried.complete
    [(name, why)] = result.clusters_failed.items()
    assert name == handle.cluster.name
    assert why.startswith("stopped answering (0 ") and why.endswith("); 2 org(s) not checked: b-org, c-org")
    for org in orgs[1:]:
        org.refresh_from_db()
        assert org.reconciled_at is None and org.last_error == "" and org.applied == ""
        assert not AuditEntry.objects.filter(org=org).exists()
