"""One retry policy for the Celery tasks that talk to a cluster or to Prometheus.

A transient failure (no answer, a timeout, 5xx, 429: `clusters.errors.is_transient`) is
retried after a capped exponential back-off with full jitter, so workers that failed
together do not retry together. A refusal (401/403, 404, 400/422, a 409 that outlasted
the service's re-reads, a broken cluster configuration) fails the task at once with its
reason: the same request would be refused the same way, and each retry would only
repeat the denial in the cluster's audit log.

A task opts in with `base=RetryTransient` and states its own numbers with Celery's
usual options (`max_retries`, `retry_backoff` seconds for the first wait, doubling per
attempt, `retry_backoff_max` seconds at most):

    @shared_task(base=RetryTransient, max_retries=3, retry_backoff=30, retry_backoff_max=300)
    def binpack_cluster(cluster_id: int) -> dict: ...

`autoretry_for` is not used: it chooses by exception class, and whether a failure is
worth retrying is said by the failure itself (an API error's code, a Prometheus error's
`transient`, a task's own "not all applied" error).
"""
from __future__ import annotations

import logging

from celery import Task
from celery.utils.time import get_exponential_backoff_interval

from clusters.errors import describe_failure, is_transient

log = logging.getLogger(__name__)


def retry_countdown(retries: int, *, backoff: float, backoff_max: float) -> int:
    """Seconds before retry number `retries + 1`: uniform in [0, min(backoff_max,
    backoff * 2**retries)] (full jitter)."""
    return get_exponential_backoff_interval(factor=backoff, retries=retries, maximum=backoff_max, full_jitter=True)


class RetryTransient(Task):
    """A task whose transient failures are retried with back-off and whose refusals fail it."""

    retry_backoff = 30        # seconds before the first retry; doubles per attempt
    retry_backoff_max = 600   # seconds: the longest wait between two attempts

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if not is_transient(exc):
                log.error("%s%s failed, not retried: %s", self.name, _call(args, kwargs), describe_failure(exc))
                raise
            retries = self.request.retries
            log.warning("%s%s failed (attempt %d, at most %s retries): %s", self.name, _call(args, kwargs),
                        retries + 1, self.max_retries, describe_failure(exc))
            raise self.retry(exc=exc, countdown=retry_countdown(
                retries, backoff=self.retry_backoff, backoff_max=self.retry_backoff_max)) from None


def _call(args: tuple, kwargs: dict) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(shown)})"
