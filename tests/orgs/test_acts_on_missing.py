"""Acts on things that do not exist are refused, naming the missing object, and change
nothing: exempting or snoozing a model or pynode the org's namespace does not have (unless
the operator says it is not deployed yet: then the hold says it waits for it), registering an
org for a namespace the cluster does not have, and the CLIs that name an org, a cluster or a
user. Driven as an operator does: the admin as a superuser, the commands by `call_command`."""
from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.urls import reverse

from audit.models import AuditEntry
from capacity.defrag.models import DefragJob
from clusters.models import Cluster
from config import clock
from orgs import services
from orgs.models import Org, WorkloadExemption
from orgs.retirement import org_retire
from tests.orgs.test_services import scenario

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(sim_cluster_factory):
    """Org acme (namespace acme: models llm and big, one pynode), globex, on a simulated cluster."""
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    return sim


@pytest.fixture
def operator(client, django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    client.user = user
    return client


def _hold(operator, name: str, kind: str = "inferenceservice", **more):
    data = {"org": Org.objects.get(slug="acme").pk, "kind": kind, "name": name, "hold": "exempt",
            "reason": "customer SLA", **more}
    return operator.post(reverse("admin:orgs_workloadexemption_add"), data, follow=True)


def _nothing_held() -> bool:
    return not WorkloadExemption.objects.exists() and not AuditEntry.objects.filter(
        action__in=["workload_exempt", "workload_snooze"]).exists()


@pytest.mark.parametrize("kind, name, said", [
    ("inferenceservice", "lllm", "no model (InferenceService) named 'lllm' in namespace acme on cluster default: "
                                 "nothing was exempted or snoozed. Check the name, or tick “Not deployed yet” to "
                                 "hold it until it appears."),
    ("pynode", "llm", "no pynode (Knative Service) named 'llm' in namespace acme on cluster default"),
])
def test_exempting_a_workload_the_namespace_does_not_have_is_refused_by_name(cluster, operator, kind, name, said):
    response = _hold(operator, name, kind)
    assert response.status_code == 200
    assert said in response.context["adminform"].form.errors["name"][0]
    assert _nothing_held()


def test_exempting_a_workload_that_is_there_holds_it(cluster, operator):
    response = _hold(operator, "big")
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said[0].startswith("inferenceservice acme/big: exempt until removed: customer SLA")
    assert "waits for it" not in said[0]
    assert WorkloadExemption.objects.filter(name="big").exists()


def test_a_hold_for_a_workload_not_deployed_yet_says_it_waits_for_it(cluster, operator):
    response = _hold(operator, "next-llm", not_deployed_yet="on")
    said = [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]
    assert said[0] == ("warning", "inferenceservice acme/next-llm: exempt until removed: customer SLA; no model "
                                  "(InferenceService) named 'next-llm' in namespace acme on cluster default: the hold "
                                  "waits for it and applies when it appears")
    assert WorkloadExemption.objects.filter(name="next-llm").exists()


def test_the_service_refuses_a_missing_workload_and_one_it_cannot_check(cluster, make_org):
    acme = Org.objects.get(slug="acme")
    with pytest.raises(services.WorkloadMissing, match="no pynode .Knative Service. named 'big' in namespace acme"):
        services.workload_hold_set(org=acme, kind="pynode", name="big", until=None, reason="x", actor=None,
                                   now=clock.now())
    unreachable = make_org("faraway")     # on a cluster whose kubeconfig does not exist
    with pytest.raises(services.WorkloadMissing, match="whether model .InferenceService. faraway/llm exists could "
                                                       "not be read"):
        services.workload_hold_set(org=unreachable, kind="inferenceservice", name="llm", until=None, reason="x",
                                   actor=None, now=clock.now())
    assert _nothing_held()


def _org_form(operator, *, slug: str, namespace: str, cluster_pk: int):
    management = {f"{prefix}-{field}": value for prefix in ("exemptions", "switches")
                  for field, value in (("TOTAL_FORMS", "0"), ("INITIAL_FORMS", "0"))}
    return operator.post(reverse("admin:orgs_org_add"), {"slug": slug, "cluster": cluster_pk, "namespace": namespace,
                                                         **management}, follow=True)


def test_registering_an_org_for_a_namespace_the_cluster_does_not_have_is_refused(cluster, operator):
    response = _org_form(operator, slug="initech", namespace="initech", cluster_pk=cluster.cluster.pk)
    assert response.context["adminform"].form.errors["namespace"] == [
        "no namespace 'initech' on cluster default: nothing was saved. An org is registered for a namespace of its "
        "cluster (create the namespace first, or check its name)."]
    assert not Org.all_objects.filter(slug="initech").exists()

    _org_form(operator, slug="weird-org", namespace="weird", cluster_pk=cluster.cluster.pk)
    assert Org.objects.get(slug="weird-org").namespace == "weird"


def test_an_org_cannot_be_registered_on_a_retired_cluster(cluster, operator):
    Cluster.all_objects.filter(pk=cluster.cluster.pk).update(retired_at=clock.now())
    response = _org_form(operator, slug="weird-org", namespace="weird", cluster_pk=cluster.cluster.pk)
    assert "Select a valid choice" in response.context["adminform"].form.errors["cluster"][0]


@pytest.mark.parametrize("command, args, said", [
    ("record_activity", ["nosuch"], "no org with slug 'nosuch'"),
    ("issue_activity_token", ["gateway", "--user", "nosuch"], "no user 'nosuch'"),
    ("sync_orgs", ["--cluster", "nosuch"], "no cluster named 'nosuch' (known: "),
    ("binpack", ["--cluster", "nosuch", "--dry-run"], "no cluster named 'nosuch' (known: "),
    ("defrag", ["gpu-1", "--cluster", "nosuch"], "no cluster named 'nosuch' (known: "),
])
def test_a_command_naming_what_does_not_exist_is_refused_by_name(db, command, args, said):
    Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    audits = AuditEntry.objects.count()
    with pytest.raises(CommandError) as refused:
        call_command(command, *args, stdout=StringIO(), stderr=StringIO())
    assert said in str(refused.value)
    assert AuditEntry.objects.count() == audits


def test_commands_naming_a_retired_org_or_cluster_say_it_is_retired(db):
    east = Cluster.objects.create(name="east", kubeconfig_path="/nonexistent")
    acme = Org.objects.create(slug="acme", cluster=east, namespace="acme")
    org_retire(org=acme, actor=None, now=clock.now())
    with pytest.raises(CommandError, match="org 'acme' is retired: no act reaches it"):
        call_command("record_activity", "acme", stdout=StringIO())
    Cluster.objects.filter(pk=east.pk).update(retired_at=clock.now())
    with pytest.raises(CommandError, match="cluster 'east' is retired .since .*: no act reaches it"):
        call_command("sync_orgs", "--cluster", "east", stdout=StringIO())


def test_a_slug_or_namespace_in_service_is_refused_and_freed_by_retiring_its_org(cluster, operator):
    pk = cluster.cluster.pk
    form = _org_form(operator, slug="acme", namespace="acme", cluster_pk=pk).context["adminform"].form
    assert form.errors["slug"] == ["An org in service already has this slug."]
    assert form.errors["namespace"] == ["An org in service already has this namespace on this cluster."]
    old = Org.objects.get(slug="acme")
    org_retire(org=old, actor=operator.user, now=clock.now())
    _org_form(operator, slug="acme", namespace="acme", cluster_pk=pk)
    assert Org.objects.get(slug="acme").pk != old.pk
    assert Org.all_objects.filter(slug="acme").count() == 2


def test_defrag_and_binpack_name_the_node_or_pod_the_cluster_does_not_have(sim_cluster, operator):
    with pytest.raises(CommandError) as refused:
        call_command("defrag", "gpu-node-9", "--yes", stdout=StringIO(), stderr=StringIO())
    assert "gpu-node-9" in str(refused.value) and "not found" in str(refused.value).lower()
    response = operator.get(reverse("admin:capacity_defragjob_start"), {"cluster": "default", "node": "gpu-node-9"},
                            follow=True)
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said and said[0].startswith("Cannot defrag 'gpu-node-9':")
    out = StringIO()
    call_command("binpack", "--dry-run", "--explain", "default/nosuch", stdout=out)
    assert "why default/nosuch: no such pod: default/nosuch is not in the cluster's reading" in out.getvalue()
    assert not DefragJob.objects.exists()
