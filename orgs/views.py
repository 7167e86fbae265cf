"""The activity endpoint for product code in other processes and services.

POST /api/orgs/<slug>/activity with `Authorization: Bearer <token>` (one token per caller)
→ 200 {"org": slug, "recorded": bool, "woke": bool, "message": str}; when the org woke but
its wake could not be queued, "message" says so and when the retry task applies it.
401 no/unknown token; 403 the caller may not record activity; 404 unknown org.
"""
from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from config.actors import acting_as, token_label
from orgs.activity import org_activity_record_result
from orgs.models import Org
from orgs.tokens import activity_token_find


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="orgs-activity"'
    return response


@csrf_exempt
@require_POST
def activity(request, slug: str) -> JsonResponse:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "send 'Authorization: Bearer <token>'")
    found = activity_token_find(token.strip())
    if found is None:
        return _error(401, "unknown or revoked token")
    user = found.user
    if not user.has_perm("orgs.record_activity"):
        return _error(403, f"caller {user.get_username()!r} lacks the permission orgs.record_activity")
    if not Org.objects.filter(slug=slug).exists():
        return _error(404, f"no org with slug {slug!r}")
    # A wake this call causes is audited as the token's caller's.
    with acting_as(token_label(found.caller)):
        result = org_activity_record_result(slug)
    if result is None:
        return JsonResponse({"org": slug, "recorded": False, "woke": False,
                             "message": f"{slug}: activity already recorded in this window"})
    return JsonResponse({"org": slug, "recorded": True, "woke": result.woke, "message": result.describe()})
