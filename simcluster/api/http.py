"""JSON in and out, and Status bodies for errors."""
from __future__ import annotations

import orjson
from werkzeug.wrappers import Request, Response

from .. import errors

JSON = "application/json"


def json_response(body, status: int = 200, headers: dict | None = None) -> Response:
    # IMPORTANT: objects from the store go straight to orjson: no per-object copy on read.
    return Response(orjson.dumps(body), status=status, headers=headers, content_type=JSON)


def error_response(error: errors.ApiError) -> Response:
    return json_response(error.status(), error.code, error.headers)


def read_json(request: Request, what: str = "request body"):
    data = request.get_data(cache=True)
    if not data:
        raise errors.bad_request(f"the {what} is empty: a JSON object is required")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"the {what} is not valid JSON: {exc}") from None


def read_object(request: Request, what: str = "request body") -> dict:
    body = read_json(request, what)
    if not isinstance(body, dict):
        raise errors.bad_request(f"the {what} must be a JSON object, got {type(body).__name__}")
    return body


def dry_run(request: Request) -> bool:
    values = request.args.getlist("dryRun")
    for value in values:
        if value != "All":
            raise errors.bad_request(f'Invalid dryRun value "{value}": the only supported value is "All"')
    return bool(values)
