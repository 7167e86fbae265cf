"""Kubernetes API errors, shaped as the `Status` objects kube-apiserver returns."""
from __future__ import annotations


class ApiError(Exception):
    """An error the API answers with: HTTP code, Kubernetes reason and a message.

    `details` follows metav1.StatusDetails (name, group, kind, causes).
    """

    def __init__(self, code: int, reason: str, message: str, *, details: dict | None = None,
                 headers: dict | None = None, list_meta: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.headers = headers or {}
        # The Status's ListMeta (a 410 on a paged LIST carries a continue token).
        self.list_meta = list_meta or {}

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(kind: str, name: str | None, group: str = "") -> dict:
    details: dict = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found',
                    details=_details(plural, name, group))


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(409, "AlreadyExists", f'{qualified} "{name}" already exists',
                    details=_details(plural, name, group))


def conflict(plural: str, name: str, group: str = "", why: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
                    details=_details(plural, name, group))


# field.ErrorType of a cause, from how its message starts (k8s.io/apimachinery/pkg/util/validation/field).
_CAUSE_REASONS = (("Required value", "FieldValueRequired"), ("Unsupported value", "FieldValueNotSupported"),
                  ("Too long", "FieldValueTooLong"), ("Forbidden", "FieldValueForbidden"),
                  ("Duplicate value", "FieldValueDuplicate"))


def _cause_reason(message: str) -> str:
    return next((reason for prefix, reason in _CAUSE_REASONS if message.startswith(prefix)), "FieldValueInvalid")


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
    """422 Invalid; `causes` are (field, message) pairs, as field.ErrorList renders them:
    apierrors.NewInvalid names the group-qualified kind and writes one error as is, several
    as an aggregate ("[a, b]")."""
    texts = [f"{field}: {message}" for field, message in causes]
    text = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    qualified = f"{kind}.{group}" if group else kind
    details = _details(kind, name, group)
    details["causes"] = [{"reason": _cause_reason(message), "message": message, "field": field}
                         for field, message in causes]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def too_many_requests(message: str, retry_after: int = 1) -> ApiError:
    return ApiError(429, "TooManyRequests", message,
                    details={"retryAfterSeconds": retry_after},
                    headers={"Retry-After": str(retry_after)})


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", message)


def resource_not_found() -> ApiError:
    """What kube-apiserver answers for a path no resource is served at."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    """negotiation.NewUnsupportedMediaTypeError: the message names what is accepted, not
    what was sent."""
    return ApiError(415, "UnsupportedMediaType",
                    "the body of the request was in an unknown format - "
                    f"accepted media types include: {', '.join(accepted)}")


def request_entity_invalid(message: str) -> ApiError:
    """422 without field causes: a JSON patch that does not apply (a failed `test`
    included), as staging/.../endpoints/handlers/patch.go answers it."""
    return ApiError(422, "Invalid", message)
