"""Bearer tokens for the activity API: one per caller, only a SHA-256 stored."""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.db import transaction

from audit.services import audit
from orgs.models import ActivityToken

RECORD_ACTIVITY = "orgs.record_activity"   # what the activity API asks of the token's user
CALLER_MAX = ActivityToken._meta.get_field("caller").max_length


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _caller_check(caller: str) -> None:
    """The caller names the token in the panel and in every audit row its wakes leave
    (`token:<caller>`): one printable line, as given."""
    if not caller or not caller.strip():
        raise ValueError("caller: name who uses the token (e.g. model-gateway); it is empty")
    if len(caller) > CALLER_MAX:
        raise ValueError(f"caller: at most {CALLER_MAX} characters, got {len(caller)}")
    if not caller.isprintable():
        raise ValueError(f"caller: printable characters on one line, not {caller!r}")
    if caller != caller.strip():
        raise ValueError(f"caller: no spaces at its start or end, not {caller!r}")


def activity_token_issue(*, caller: str, user, actor, now: datetime) -> str:
    """Issue (or rotate) the caller's token; the raw token is returned once, never stored.
    Refused (ValueError, nothing written) for a bad caller name, or a user the activity API
    would refuse (inactive, or without the permission orgs.record_activity)."""
    _caller_check(caller)
    if not user.is_active:
        raise ValueError(f"user {user.get_username()!r} is inactive: the activity API would refuse its token")
    if not user.has_perm(RECORD_ACTIVITY):
        raise ValueError(f"user {user.get_username()!r} lacks the permission {RECORD_ACTIVITY}: the activity API "
                         "would answer 403 to its token (grant it first)")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        previous = ActivityToken.objects.select_for_update(of=("self",)).select_related("user").filter(
            caller=caller).first()
        old = {} if previous is None else {"caller": caller, "user": previous.user.get_username(),
                                           "active": previous.active}
        ActivityToken.objects.update_or_create(caller=caller, defaults={"digest": token_digest(token), "user": user,
                                                                        "active": True})
        audit(app="orgs", action="activity_token_issue", actor=actor, target=f"ActivityToken/{caller}", old=old,
              new={"caller": caller, "user": user.get_username(), "active": True}, at=now)
    return token


def activity_token_active_set(*, token: ActivityToken, active: bool, actor, now: datetime) -> bool:
    """Revoke (or reinstate) a token, audited; False when it already was so (nothing written)."""
    with transaction.atomic():
        if not ActivityToken.objects.filter(pk=token.pk).exclude(active=active).update(active=active):
            return False
        audit(app="orgs", action="activity_token_revoke" if not active else "activity_token_reinstate", actor=actor,
              target=f"ActivityToken/{token.caller}", old={"active": not active}, new={"active": active}, at=now)
    token.active = active
    return True


def activity_token_delete(*, token: ActivityToken, actor, now: datetime) -> None:
    """Delete a token (it holds no history: its callers' acts name it by text), audited."""
    with transaction.atomic():
        ActivityToken.objects.filter(pk=token.pk).delete()
        audit(app="orgs", action="activity_token_delete", actor=actor, target=f"ActivityToken/{token.caller}",
              old={"caller": token.caller, "user": token.user.get_username(), "active": token.active}, new={}, at=now)


def activity_token_authorize(token: str) -> tuple[ActivityToken | None, int, str]:
    """The presented token's row when it may record activity, else None with the HTTP
    status and the reason: 401 unknown or revoked, or its account deactivated; 403 its
    account lacks the permission."""
    found = ActivityToken.objects.select_related("user").filter(digest=token_digest(token), active=True).first()
    if found is None:
        return None, 401, "unknown or revoked token"
    username = found.user.get_username()
    if not found.user.is_active:
        return None, 401, f"the token's account {username!r} is deactivated"
    if not found.user.has_perm(RECORD_ACTIVITY):
        return None, 403, f"caller {username!r} lacks the permission {RECORD_ACTIVITY}"
    return found, 200, ""

