"""Admin flows: each action behind its own permission, each leaving an audit record."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User

from clusters import kube
from config import clock
from orgs import services
from audit.models import AuditEntry
from orgs.models import Org
from orgs.planning import MIN_SCALE
from tests.orgs.test_safety import broker_down  # noqa: F401 - the fixture
from tests.orgs.test_services import ksvc_min_scale, make_idle, scenario

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "/admin/orgs/org/"


def operator(*codenames: str) -> User:
    user = User.objects.create_user(f"op-{'-'.join(codenames) or 'viewer'}", password="pw", is_staff=True)
    for codename in ("view_org", "view_dormancyswitch", *codenames):
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="orgs"))
    return user


@pytest.fixture
def cluster(sim_cluster_factory, celery_eager):
    sim = sim_cluster_factory(scenario())
    sim.advance(0)
    services.orgs_sync(cluster=sim.cluster, now=clock.now())
    return sim


def act(client, user, action, *slugs, **form):
    """Run an action as the panel does: the preview page first, then its confirmation."""
    client.force_login(user)
    ids = [str(Org.objects.get(slug=s).id) for s in slugs]
    client.post(CHANGELIST, {"action": action, "_selected_action": ids, "index": "0"})
    return client.post(CHANGELIST, {"action": action, "_selected_action": ids, "index": "0", "confirm": "yes", **form},
                       follow=True)


def test_changelist_shows_state_and_filters(client, cluster):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    client.force_login(operator())
    page = client.get(CHANGELIST + "?dormant__exact=1")
    assert page.status_code == 200
    assert [o.slug for o in page.context["cl"].result_list] == ["acme"]
    detail = client.get(f"{CHANGELIST}{Org.objects.get(slug='acme').id}/change/")
    assert b"became dormant" in detail.content, "the switch history is inline"


def offered(client) -> set[str]:
    form = client.get(CHANGELIST).context["action_form"]
    return {name for name, _ in form.fields["action"].choices} if form else set()


def test_actions_are_offered_only_with_their_permission(client, cluster):
    client.force_login(operator())
    assert not offered(client) & {"disallow_scale_to_zero", "allow_scale_to_zero", "mark_active_now",
                                  "run_dormancy_sweep_now"}
    client.force_login(operator("mark_active"))
    assert "mark_active_now" in offered(client) and "disallow_scale_to_zero" not in offered(client)


def test_an_action_without_its_permission_does_nothing(client, cluster):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    act(client, operator("allow_scale_to_zero"), "disallow_scale_to_zero", "acme")
    assert Org.objects.get(slug="acme").scale_to_zero_allowed
    assert not AuditEntry.objects.filter(action="org_disallow_scale_to_zero").exists()


def test_disallow_reverts_a_dormant_org_now_and_is_audited(client, cluster):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    gw = cluster.gateway
    assert ksvc_min_scale(gw, "pynode") == "0"
    user = operator("disallow_scale_to_zero")

    page = act(client, user, "disallow_scale_to_zero", "acme")

    assert "scale to zero disallowed for 1 org(s)" in [str(m) for m in page.context["messages"]]
    org = Org.objects.get(slug="acme")
    assert not org.scale_to_zero_allowed and org.applied == "disabled"
    assert ksvc_min_scale(gw, "pynode") == "1"
    assert gw.get(kube.REVISIONS, "llm-predictor-00001", namespace="acme")["metadata"]["annotations"][MIN_SCALE] == "1"
    record = AuditEntry.objects.get(action="org_disallow_scale_to_zero")
    assert (record.actor, record.old, record.new) == (user, {"scale_to_zero_allowed": True},
                                                      {"scale_to_zero_allowed": False})

    allow = operator("allow_scale_to_zero")
    act(client, allow, "allow_scale_to_zero", "acme")
    assert Org.objects.get(slug="acme").scale_to_zero_allowed
    assert ksvc_min_scale(gw, "pynode") == "0", "still dormant: allowed again, it scales to zero again"
    assert AuditEntry.objects.get(action="org_allow_scale_to_zero").actor == allow


def test_mark_active_now(client, cluster):
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    user = operator("mark_active")
    page = act(client, user, "mark_active_now", "acme", "globex")
    assert b"woke acme" in page.content
    org = Org.objects.get(slug="acme")
    assert not org.dormant and org.switches.first().actor == user and org.switches.first().cause == "admin"
    assert ksvc_min_scale(cluster.gateway, "pynode") == "1"
    assert AuditEntry.objects.filter(action="org_mark_active", actor=user).count() == 2


def test_run_the_sweep_now(client, cluster):
    make_idle("globex")
    user = operator("run_dormancy_sweep")
    page = act(client, user, "run_dormancy_sweep_now", "acme")
    assert b"1 org(s) turned dormant: globex" in page.content
    assert Org.objects.get(slug="globex").dormant
    assert ksvc_min_scale(cluster.gateway, "pynode", ns="globex") == "0"
    record = AuditEntry.objects.get(action="dormancy_sweep")
    assert record.actor == user and record.new == {"dormant": ["globex"]}
    assert Org.objects.get(slug="globex").switches.get().cause == "admin"


def test_a_sweep_now_whose_scale_to_zero_the_queue_refused_warns_and_says_the_retry_task_applies_it(
        client, cluster, broker_down):  # noqa: F811
    make_idle("globex")
    page = act(client, operator("run_dormancy_sweep"), "run_dormancy_sweep_now", "acme")
    shown = [(m.level_tag, str(m)) for m in page.context["messages"]]
    assert shown[0] == ("info", "sweep: 1 org(s) turned dormant: globex")
    [(level, warning)] = shown[1:]
    assert level == "warning"
    assert warning.startswith("1 org(s) turned dormant and are marked, but their scale to zero could not be queued "
                              "(OperationalError")
    assert warning.endswith("the retry task applies it within 2 minutes once the queue answers")
    assert Org.objects.get(slug="globex").dormant
    assert ksvc_min_scale(cluster.gateway, "pynode", ns="globex") == "1", "nothing reached the cluster yet"


def test_allow_and_disallow_count_only_the_orgs_they_changed_and_name_the_others(client, cluster, make_org):
    make_org("initech", cluster=cluster.cluster, scale_to_zero_allowed=False)
    user = operator("disallow_scale_to_zero")

    page = act(client, user, "disallow_scale_to_zero", "acme", "initech")
    assert [str(m) for m in page.context["messages"]][-1] == (
        "scale to zero disallowed for 1 org(s); left as they were (already disallowed): initech")
    assert list(AuditEntry.objects.filter(action="org_disallow_scale_to_zero").values_list("org__slug", flat=True)) \
        == ["acme"]

    page = act(client, user, "disallow_scale_to_zero", "acme", "initech")
    assert [str(m) for m in page.context["messages"]] == [
        "scale to zero disallowed for 0 org(s); left as they were (already disallowed): acme, initech"]
    assert AuditEntry.objects.filter(action="org_disallow_scale_to_zero").count() == 1
    assert not Org.objects.filter(scale_to_zero_allowed=True, slug__in=["acme", "initech"]).exists()


ACTIONS = {"disallow_scale_to_zero": "disallow_scale_to_zero", "allow_scale_to_zero": "allow_scale_to_zero",
           "mark_active_now": "mark_active", "run_dormancy_sweep_now": "run_dormancy_sweep"}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_action_needs_its_own_permission_not_any_other(client, cluster, make_org, action):
    """A user holding every other action's permission still cannot run this one."""
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    # Every action would change something: acme is dormant (wake, disallow), globex is idle
    # (sweep), initech is protected (allow).
    make_idle("globex")
    make_org("initech", cluster=cluster.cluster, scale_to_zero_allowed=False)
    others = [codename for name, codename in ACTIONS.items() if name != action]
    user = operator(*others)
    state = lambda: sorted(Org.objects.values_list("slug", "dormant", "scale_to_zero_allowed", "applied"))  # noqa: E731
    before, audits = state(), AuditEntry.objects.count()

    page = act(client, user, action, "acme", "globex", "initech")

    assert page.status_code == 200
    assert state() == before, f"{action} ran without orgs.{ACTIONS[action]}"
    assert AuditEntry.objects.count() == audits
    assert ksvc_min_scale(cluster.gateway, "pynode") == "0"


def test_the_change_form_cannot_flip_what_only_actions_may_change(client, cluster):
    """scale_to_zero_allowed and the dormancy state are read-only in the form: changing them
    goes through the audited, permission-checked actions."""
    org = Org.objects.get(slug="acme")
    client.force_login(operator("change_org"))
    page = client.post(f"{CHANGELIST}{org.id}/change/", {
        "slug": org.slug, "cluster": org.cluster_id, "namespace": org.namespace,
        "dormant": "on", "scale_to_zero_allowed": "",
        "switches-TOTAL_FORMS": "0", "switches-INITIAL_FORMS": "0",
        "exemptions-TOTAL_FORMS": "0", "exemptions-INITIAL_FORMS": "0"})
    assert page.status_code == 302, page.content[:2000]
    org.refresh_from_db()
    assert org.scale_to_zero_allowed and not org.dormant


def test_an_org_added_in_the_panel_counts_as_active_from_then_and_turns_dormant_a_day_idle_later(client, cluster,
                                                                                                  settings):
    client.force_login(operator("add_org"))
    # An org is registered for a namespace its cluster has (the form reads it first).
    cluster.gateway.create(kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "newco"}})
    response = client.post("/admin/orgs/org/add/", {
        "slug": "newco", "cluster": cluster.cluster.id, "namespace": "newco",
        "exemptions-TOTAL_FORMS": 0, "exemptions-INITIAL_FORMS": 0,
        "switches-TOTAL_FORMS": 0, "switches-INITIAL_FORMS": 0})
    assert response.status_code == 302
    registered = Org.objects.get(slug="newco").last_activity_at
    assert abs(clock.now() - registered) < timedelta(seconds=5), "registered active, not dormant at birth"
    assert services.dormancy_sweep(now=clock.now(), dry_run=True).switched == ()
    a_day_idle = registered + settings.ORGS_DORMANT_AFTER + timedelta(minutes=1)
    assert "newco" in services.dormancy_sweep(now=a_day_idle).switched
    assert Org.objects.get(slug="newco").dormant


def test_the_org_list_says_its_states_in_words_with_no_red_mark_for_normal_ones(client, cluster):
    """An active org without drift reads "active", "allowed", "none": no boolean icon (Django's
    red ✖) stands for a normal state; drift is the one marked."""
    make_idle("acme")
    services.dormancy_sweep(now=clock.now())
    Org.objects.filter(slug="acme").update(drift=[{"workload": "ksvc org-a/llama"}])
    client.force_login(operator())
    html = client.get(CHANGELIST).content.decode()
    assert "icon-no.svg" not in html and "icon-yes.svg" not in html.split('id="result_list"')[1]
    table = html.split('id="result_list"')[1].split("</table>")[0]
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1], re.S):
        texts = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
        rows[next(t for t in texts if t)] = texts   # the slug: the first column with text
    assert "dormant" in rows["acme"] and "⚠ drift: 1 part(s)" in rows["acme"]
    others = [texts for slug, texts in rows.items() if slug != "acme"]
    assert others
    for texts in others:
        assert {"active", "allowed", "none"} <= set(texts), texts
