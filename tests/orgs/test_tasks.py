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
