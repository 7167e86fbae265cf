"""The activity endpoint for product code in other processes and services.

POST /api/orgs/<slug>/activity with `Authorization: Bearer <token>` (one token per caller);
no body is read. → 200 {"org": slug, "recorded": bool, "woke": bool, "message": str}:
"recorded" false when another call already recorded the org's activity in this window;
when the org woke but its wake could not be queued, "message" says so and when the retry
task applies it. Errors are {"error": str}: 401 no, unknown or revoked token, or its
account deactivated; 403 the caller may not record activity; 404 unknown org (only said
to a caller allowed to record activity); 405 not a POST; 503 the database failed, nothing
recorded (Retry-After).
"""
from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config.actors import acting_as, token_label
from orgs.activity import org_activity_record_result
from orgs.models import Org
from orgs.tokens import activity_token_authorize

logger = logging.getLogger(__name__)

SLUG_MAX = Org._meta.get_field("slug").max_length
RETRY_AFTER_SECONDS = 5   # a failed database write: the caller may simply try again shortly


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="orgs-activity"'
    elif status == 405:
        response["Allow"] = "POST"
    elif status == 503:
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _no_org(slug: str) -> JsonResponse:
    shown = slug if len(slug) <= SLUG_MAX else f"{slug[:SLUG_MAX]}…"
    return _error(404, f"no org with slug {shown!r}")


@csrf_exempt
def activity(request, slug: str) -> JsonResponse:
    if request.method != "POST":
        return _error(405, f"{request.method} is not allowed: POST to record activity")
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "send 'Authorization: Bearer <token>'")
    try:
        found, status, why = activity_token_authorize(token.strip())
        if found is None:
            return _error(status, why)
        if len(slug) > SLUG_MAX or not Org.objects.filter(slug=slug).exists():
            return _no_org(slug)
        # A wake this call causes is audited as the token's caller's.
        with acting_as(token_label(found.caller)):
            result = org_activity_record_result(slug)
    except Org.DoesNotExist:   # removed since the check above
        return _no_org(slug)
    except DatabaseError as exc:
        logger.error("activity API: activity of %r not recorded, the database failed: %s: %s",
                     slug, type(exc).__name__, exc)
        return _error(503, f"activity not recorded: the database failed ({type(exc).__name__}); "
                           f"try again in {RETRY_AFTER_SECONDS} s")
    if result is None:
        return JsonResponse({"org": slug, "recorded": False, "woke": False,
                             "message": f"{slug}: activity already recorded in this window"})
    return JsonResponse({"org": slug, "recorded": True, "woke": result.woke, "message": result.describe()})
