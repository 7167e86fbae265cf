"""The default cluster row brought in line with the environment (KUBECONFIG / KUBE_CONTEXT):
connection settings that do not load are refused before anything is saved."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from clusters.kube import gateway_for
from clusters.models import Cluster

pytestmark = pytest.mark.django_db

ROW = ("kubeconfig_path", "kube_context", "in_cluster", "prometheus_url", "from_environment")


def row() -> tuple:
    return Cluster.objects.filter(name="default").values_list(*ROW).get()


@pytest.mark.parametrize(("kubeconfig", "context", "wanted"), [
    ("/nonexistent", "", "'/nonexistent' (context 'current')"),
    (None, "no-such-context", "(context 'no-such-context')"),
])
def test_a_command_with_a_kubeconfig_that_does_not_load_fails_and_leaves_the_default_cluster_as_it_was(
        sim_cluster, settings, capsys, kubeconfig, context, wanted):
    settings.KUBECONFIG = sim_cluster.kubeconfig_path
    call_command("sync_orgs")                       # the row as the workers use it
    before = row()

    settings.KUBECONFIG, settings.KUBE_CONTEXT = kubeconfig or sim_cluster.kubeconfig_path, context
    with pytest.raises(CommandError) as failed:
        call_command("sync_orgs")
    assert str(failed.value).startswith("0 ConfigError: cannot load kubeconfig ") and wanted in str(failed.value)

    assert row() == before, "a failed command changes nothing"
    gateway_for(Cluster.objects.get(name="default")).api_groups()   # the workers still reach the cluster


def test_no_default_cluster_is_created_from_a_kubeconfig_that_does_not_load(db, settings):
    settings.KUBECONFIG = "/nonexistent"
    with pytest.raises(CommandError, match="cannot load kubeconfig '/nonexistent'"):
        call_command("sync_orgs")
    assert not Cluster.objects.exists()
