"""Bearer tokens for the activity API: one per caller, only a SHA-256 stored."""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from audit.services import audit
from orgs.models import ActivityToken


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def activity_token_issue(*, caller: str, user, actor, now: datetime) -> str:
    """Issue (or rotate) the caller's token; the raw token is returned once, never stored."""
    if not caller.strip():
        raise ValueError("the caller name must not be empty")
    token = secrets.token_urlsafe(32)
    ActivityToken.objects.update_or_create(caller=caller, defaults={"digest": token_digest(token), "user": user,
                                                                    "active": True})
    audit(app="orgs", action="activity_token_issue", actor=actor, target=f"ActivityToken/{caller}", old={},
          new={"caller": caller, "user": user.get_username()}, at=now)
    return token


def activity_token_find(token: str) -> ActivityToken | None:
    """The active token presented (its caller and user), or None when unknown or revoked."""
    found = ActivityToken.objects.select_related("user").filter(digest=token_digest(token), active=True).first()
    return found if found and found.user.is_active else None


def activity_token_user(token: str):
    """The user a presented token acts as, or None when unknown or revoked."""
    found = activity_token_find(token)
    return found.user if found else None
