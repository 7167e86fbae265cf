"""The project's own errors for the Kubernetes and Prometheus gateways.

Callers catch these, never the client libraries' exception types.
"""
from __future__ import annotations


class KubeError(Exception):
    """A Kubernetes API failure: HTTP `code` (0 when no answer), Status `reason`, `message`."""

    code: int = 0
    default_reason: str = "Unknown"

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None,
                 retry_after: float | None = None, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.code = self.code if code is None else code
        self.reason = reason or self.default_reason
        self.retry_after = retry_after
        self.details = details or {}
        # Set by the gateway on the final error of a write it sent more than once, when an
        # earlier try got no answer or a 5xx: that try may have been applied, so a 409 or
        # 404 now may be the caller's own change (its answer lost), not someone else's.
        self.after_unanswered_write = False

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    @property
    def transient(self) -> bool:
        """Whether trying again later may help: no answer (code 0), 5xx or 429. A refusal
        (401/403, 404, 400/422, a 409 — re-read and decide again instead) says no."""
        return self.code == 0 or self.code == 429 or self.code >= 500


class NotFound(KubeError):
    code, default_reason = 404, "NotFound"


class Conflict(KubeError):
    """409 Conflict: a stale resourceVersion or a failed precondition."""

    code, default_reason = 409, "Conflict"


class AlreadyExists(Conflict):
    code, default_reason = 409, "AlreadyExists"


class Gone(KubeError):
    """410: the resourceVersion asked for is too old (a watch must re-list)."""

    code, default_reason = 410, "Expired"


class Invalid(KubeError):
    """400/422: the request or the object is malformed."""

    code, default_reason = 422, "Invalid"


class Forbidden(KubeError):
    """401/403: not authenticated or not authorized (RBAC)."""

    code, default_reason = 403, "Forbidden"


class TooManyRequests(KubeError):
    """429: throttled by the API server, or an eviction refused by a PodDisruptionBudget."""

    code, default_reason = 429, "TooManyRequests"


class Unavailable(KubeError):
    """5xx or no answer at all (connection refused, timeout)."""

    code, default_reason = 503, "ServiceUnavailable"


class BadResponse(KubeError):
    """The API server answered 2xx with a body that is not what was asked for (not JSON, or
    not the object's shape). Not retried: the same request would get the same answer."""

    code, default_reason = 502, "BadResponse"
    transient = False


class ConfigError(KubeError):
    """The cluster's connection settings are wrong (missing kubeconfig, unknown context)."""

    code, default_reason = 0, "ConfigError"
    transient = False   # no answer because nothing was asked: only the operator can fix it


class PrometheusError(Exception):
    """A Prometheus query failed; `transient` tells whether a retry may help."""

    def __init__(self, message: str, *, status: int = 0, transient: bool = False):
        super().__init__(message)
        self.status = status
        self.transient = transient


def error_for_status(code: int, reason: str, message: str, *, retry_after: float | None = None,
                     details: dict | None = None) -> KubeError:
    """The project's error for an API answer (`code` and the Status `reason`)."""
    if code == 404:
        cls = NotFound
    elif code == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif code == 410:
        cls = Gone
    elif code in (400, 415, 422):
        cls = Invalid
    elif code in (401, 403):
        cls = Forbidden
    elif code == 429:
        cls = TooManyRequests
    elif code >= 500 or code == 0:
        cls = Unavailable
    else:
        cls = KubeError
    return cls(message, code=code, reason=reason or None, retry_after=retry_after, details=details)


def is_transient(exc: BaseException) -> bool:
    """Whether trying again later may help: no answer, a timeout, 5xx or 429 say yes;
    a refusal (401/403, 404, 400/422, 409 — re-read and decide again instead) or a
    broken configuration says no, and is reported with its reason rather than retried.

    An exception that knows says so in its `transient` attribute (`KubeError`,
    `PrometheusError`, a task's own "not all applied" error)."""
    transient = getattr(exc, "transient", None)
    if isinstance(transient, bool):
        return transient
    return isinstance(exc, (ConnectionError, TimeoutError))


def describe_failure(exc: BaseException) -> str:
    """A failure as a run or a task records it: whether trying again may help, then what it said."""
    return f"{'transient' if is_transient(exc) else 'refused'}: {exc}"
