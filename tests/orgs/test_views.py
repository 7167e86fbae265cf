"""The authenticated activity endpoint: token per caller, 401/403/404/405/503."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

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


@pytest.mark.parametrize("method", ["get", "put", "delete", "patch", "options"])
def test_only_post_is_allowed_and_the_refusal_says_so_in_json(client, make_org, token, method):
    org = make_org("acme", idle_hours=5)
    response = getattr(client, method)("/api/orgs/acme/activity", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response.json() == {"error": f"{method.upper()} is not allowed: POST to record activity"}
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=4), "nothing recorded"


def test_a_token_whose_account_was_deactivated_is_refused_saying_why(client, make_org, caller, token, redis_cache):
    org = make_org("acme", idle_hours=5)
    caller.is_active = False
    caller.save()
    response = post(client, "acme", token)
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert response.json() == {"error": "the token's account 'model-gateway' is deactivated"}
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=4), "nothing recorded"


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer ", "Basic dXNlcjpwdw==", "Bearer\tabc", "abc",
                                    "Bearer nope, Bearer other"])
def test_a_caller_without_a_valid_token_learns_nothing_of_which_orgs_exist(client, make_org, header, redis_cache):
    make_org("acme", idle_hours=5)
    answers = set()
    for slug in ("acme", "ghost", "ACME", "x" * 300):
        headers = {"HTTP_AUTHORIZATION": header} if header else {}
        response = client.post(f"/api/orgs/{slug}/activity", **headers)
        answers.add((response.status_code, response.content))
    [(status, _)] = answers
    assert status == 401, "the same answer for an org that exists and one that does not"
    assert Org.objects.get(slug="acme").last_activity_at < clock.now() - timedelta(hours=4)


def test_a_slug_longer_than_any_org_is_404_without_echoing_it_whole(client, token, redis_cache):
    response = post(client, "a" * 5000, token)
    assert response.status_code == 404
    assert response.json() == {"error": f"no org with slug '{'a' * 63}…'"}


@pytest.mark.django_db(transaction=True)
def test_a_database_failure_is_a_503_that_says_nothing_was_recorded_and_the_next_call_records(
        client, make_org, token, redis_cache):
    """The org's row is locked by another transaction past this connection's lock timeout:
    PostgreSQL refuses the write. The caller is told to try again, and the throttle window
    is not spent on the failed write."""
    org = make_org("acme", idle_hours=5)
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT id FROM orgs_org WHERE id = %s FOR UPDATE", [org.id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        refused = post(client, "acme", token)
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert refused.status_code == 503 and refused["Retry-After"] == "5"
    assert refused.json() == {"error": "activity not recorded: the database failed (OperationalError); "
                                       "try again in 5 s"}
    assert Org.objects.get(id=org.id).last_activity_at < clock.now() - timedelta(hours=4)

    again = post(client, "acme", token)
    assert again.status_code == 200 and again.json()["recorded"] is True
    assert clock.now() - Org.objects.get(id=org.id).last_activity_at < timedelta(seconds=5)


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
