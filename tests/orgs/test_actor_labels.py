"""Who acted, when it was no panel user: a command from a shell, or the activity API's token;
and the worker that applies their switch later names them too."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from config import clock
from config.actors import acting_as
from audit.models import AuditEntry
from orgs import tasks
from orgs.models import DormancySwitch
from orgs.services import dormancy_sweep

pytestmark = pytest.mark.django_db


def test_a_token_issued_from_the_shell_is_audited_as_the_shell_user_and_the_panel_shows_it(client, capsys):
    User.objects.create_user("model-gateway").user_permissions.add(Permission.objects.get(codename="record_activity"))
    call_command("issue_activity_token", "model-gateway", "--user", "model-gateway")
    [record] = AuditEntry.objects.filter(action="activity_token_issue")
    assert record.actor is None and record.actor_label.startswith("cli:") and "@" in record.actor_label
    admin = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(admin)
    page = client.get("/admin/audit/auditentry/").content.decode()
    assert record.actor_label in page
    assert f"{record.at:%Y-%m-%d %H:%M:%S} UTC" in page          # times carry their zone


def test_a_wake_through_the_activity_api_names_the_tokens_caller(client, make_org, redis_cache, capsys):
    caller = User.objects.create_user("gateway-account")
    caller.user_permissions.add(Permission.objects.get(codename="record_activity"))
    call_command("issue_activity_token", "model-gateway", "--user", "gateway-account")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    org = make_org("acme", idle_hours=30, dormant=True)
    response = client.post("/api/orgs/acme/activity", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200 and response.json()["woke"] is True
    switch = org.switches.get(direction=DormancySwitch.Direction.TO_ACTIVE)
    assert (switch.actor, switch.actor_label) == (None, "token:model-gateway")


def test_a_sweep_run_from_a_shell_records_its_label_on_every_switch(make_org):
    make_org("acme", idle_hours=30)
    make_org("globex", idle_hours=40)
    with acting_as("cli:oncall@bastion"):
        result = dormancy_sweep(now=clock.now(), enqueue=False)
    assert sorted(result.switched) == ["acme", "globex"]
    assert set(DormancySwitch.objects.values_list("actor_label", flat=True)) == {"cli:oncall@bastion"}
    make_org("initech", idle_hours=50)
    dormancy_sweep(now=clock.now(), enqueue=False)
    assert DormancySwitch.objects.get(org__slug="initech").actor_label == ""     # the schedule: no label


def _run_as_the_worker(switch) -> None:
    """The queued apply, run as a worker runs it: outside the request's or shell's context."""
    tasks.org_scale_to_zero_apply.apply(args=[switch.org_id], kwargs={"switch_id": switch.id}).get()


@pytest.mark.django_db(transaction=True)
def test_the_workload_patches_of_a_wake_name_who_woke_the_org(client, sim_cluster_factory, capsys, redis_cache):
    from orgs import services
    from tests.orgs.test_services import ksvc_min_scale, make_idle, scenario

    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    caller = User.objects.create_user("gateway-account")
    caller.user_permissions.add(Permission.objects.get(codename="record_activity"))
    call_command("issue_activity_token", "model-gateway", "--user", "gateway-account")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    make_idle("acme")
    with acting_as("cli:oncall@bastion"):
        dormancy_sweep(now=clock.now(), enqueue=False)
    asleep = DormancySwitch.objects.get(org__slug="acme", direction="dormant")
    _run_as_the_worker(asleep)
    assert ksvc_min_scale(sim.gateway, "pynode") == "0"

    assert client.post("/api/orgs/acme/activity", HTTP_AUTHORIZATION=f"Bearer {token}").json()["woke"] is True
    awake = DormancySwitch.objects.get(org__slug="acme", direction="active")
    _run_as_the_worker(awake)
    assert ksvc_min_scale(sim.gateway, "pynode") == "1"

    enabled, disabled = AuditEntry.objects.filter(action="scale_to_zero_applied").order_by("id")
    assert (enabled.actor_label, enabled.cause) == (
        "cli:oncall@bastion", f"switch #{asleep.id}: became dormant (dormancy sweep)")
    assert (disabled.actor_label, disabled.cause) == (
        "token:model-gateway", f"switch #{awake.id}: became active (activity)")
    assert disabled.old["ksvc acme/pynode"] == "0" and disabled.new["ksvc acme/pynode"] == "1"
