"""The authenticated activity endpoint: token per caller, 401/403/404."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from config import clock
from orgs.models import ActivityToken, Org
from orgs.tokens import activity_token_issue, token_digest

pytestmark = pytest.mark.django_db


@pytest.fixture
def caller():
    user = User.objects.create_user("model-gateway")
    user.user_permissions.add(Permission.objects.get(codename="record_activity"))
    return user


@pytest.fixture
def token(caller):
    return activity_token_issue(caller="model-gateway", user=caller, actor=None, now=clock.now())


def post(client, slug, token=None, scheme="Bearer"):
    headers = {"HTTP_AUTHORIZATION": f"{scheme} {token}"} if token else {}
    return client.post(f"/api/orgs/{slug}/activity", **headers)


def test_a_caller_with_a_token_records_activity(client, make_org, token, redis_cache):
    org = make_org("acme", idle_hours=5)
    response = post(client, "acme", token)
    assert response.status_code == 200 and response.json() == {
        "org": "acme", "recorded": True, "woke": False, "message": "acme: activity recorded (it was awake)"}
    assert clock.now() - Org.objects.get(id=org.id).last_activity_at < timedelta(seconds=5)
    assert post(client, "acme", token).json()["recorded"] is False, "throttled"


def test_no_or_unknown_or_revoked_token_is_401(client, make_org, token, redis_cache):
    make_org("acme")
    missing = post(client, "acme")
    assert missing.status_code == 401 and missing["WWW-Authenticate"].startswith("Bearer")
    assert post(client, "acme", "not-a-token").status_code == 401
    assert post(client, "acme", token, scheme="Basic").status_code == 401
    ActivityToken.objects.update(active=False)
    assert post(client, "acme", token).json() == {"error": "unknown or revoked token"}


def test_a_caller_without_the_permission_is_403(client, make_org, redis_cache):
    make_org("acme")
    nobody = User.objects.create_user("intern")
    permission = Permission.objects.get(codename="record_activity")
    nobody.user_permissions.add(permission)
    raw = activity_token_issue(caller="intern-script", user=nobody, actor=None, now=clock.now())
    nobody.user_permissions.remove(permission)   # taken away after the token was issued
    response = post(client, "acme", raw)
    assert response.status_code == 403 and "orgs.record_activity" in response.json()["error"]


def test_an_unknown_org_is_404(client, token, redis_cache):
    response = post(client, "ghost", token)
    assert response.status_code == 404 and response.json()["error"] == "no org with slug 'ghost'"


def test_only_post_is_allowed(client, make_org, token):
    make_org("acme")
    assert client.get("/api/orgs/acme/activity", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


def test_issue_token_command_prints_it_once_and_stores_only_its_digest(caller, capsys):
    call_command("issue_activity_token", "batch-jobs", "--user", "model-gateway")
    raw = capsys.readouterr().out.strip()
    stored = ActivityToken.objects.get(caller="batch-jobs")
    assert stored.digest == token_digest(raw) and raw not in stored.digest


@pytest.mark.parametrize(("name", "wanted"), [
    ("  ", "caller: name who uses the token (e.g. model-gateway); it is empty"),
    ("x" * 300, "caller: at most 100 characters, got 300"),
    ("model-gateway\nforged: line", r"caller: printable characters on one line, not 'model-gateway\nforged: line'"),
    (" model-gateway", "caller: no spaces at its start or end, not ' model-gateway'"),
])
def test_a_bad_caller_name_is_refused_by_name_and_issues_nothing(caller, name, wanted):
    with pytest.raises(CommandError) as refused:
        call_command("issue_activity_token", name, "--user", "model-gateway")
    assert str(refused.value) == f"{wanted}; no token issued"
    assert not ActivityToken.objects.exists() and not AuditEntry.objects.exists()


def test_a_token_for_a_user_the_api_would_refuse_is_not_issued(capsys):
    User.objects.create_user("intern")
    with pytest.raises(CommandError) as refused:
        call_command("issue_activity_token", "intern-script", "--user", "intern")
    assert str(refused.value) == ("user 'intern' lacks the permission orgs.record_activity: the activity API would "
                                  "answer 403 to its token (grant it first); no token issued")
    assert capsys.readouterr().out == ""
    assert not ActivityToken.objects.exists() and not AuditEntry.objects.exists()


def test_a_rotation_is_audited_with_the_user_it_replaces(client, caller, make_org, redis_cache, capsys):
    make_org("acme")
    successor = User.objects.create_user("gateway-v2")
    successor.user_permissions.add(Permission.objects.get(codename="record_activity"))
    call_command("issue_activity_token", "model-gateway", "--user", "model-gateway")
    first = capsys.readouterr().out.strip()
    call_command("issue_activity_token", "model-gateway", "--user", "gateway-v2")
    second = capsys.readouterr().out.strip()

    issued, rotated = AuditEntry.objects.filter(action="activity_token_issue").order_by("id")
    assert issued.old == {}
    assert rotated.old == {"caller": "model-gateway", "user": "model-gateway", "active": True}
    assert rotated.new == {"caller": "model-gateway", "user": "gateway-v2", "active": True}
    assert post(client, "acme", first).status_code == 401, "the rotated token no longer works"
    assert post(client, "acme", second).status_code == 200
