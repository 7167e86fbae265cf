"""The task retry policy (config.retries) without a cluster: which failures are worth a
retry, and how long a retry waits."""
from __future__ import annotations

import random

import pytest

from clusters.errors import (ConfigError, Conflict, Forbidden, Invalid, KubeError, NotFound, TooManyRequests,
                             Unavailable, describe_failure, error_for_status, is_transient)
from config.retries import retry_countdown


@pytest.mark.parametrize("code,transient", [
    (0, True), (500, True), (502, True), (503, True), (504, True), (429, True),
    (400, False), (401, False), (403, False), (404, False), (405, False), (409, False), (410, False), (422, False),
])
def test_an_api_answer_says_whether_a_retry_may_help(code, transient):
    exc = error_for_status(code, "", "the API server said so")
    assert exc.transient is transient and is_transient(exc) is transient


def test_a_broken_configuration_is_not_worth_a_retry():
    assert not is_transient(ConfigError("no kubeconfig at /nowhere"))


@pytest.mark.parametrize("exc,recorded", [
    (Forbidden("pods is forbidden"), "refused: 403 Forbidden: pods is forbidden"),
    (Unavailable("no answer", code=0), "transient: 0 ServiceUnavailable: no answer"),
    (TooManyRequests("slow down"), "transient: 429 TooManyRequests: slow down"),
    (Conflict("stale"), "refused: 409 Conflict: stale"),
    (NotFound("gone"), "refused: 404 NotFound: gone"),
    (Invalid("bad"), "refused: 422 Invalid: bad"),
    (KubeError("teapot", code=418), "refused: 418 Unknown: teapot"),
])
def test_a_failure_is_recorded_with_whether_a_retry_may_help(exc, recorded):
    assert describe_failure(exc) == recorded


@pytest.mark.parametrize("retries,bound", [(0, 30), (1, 60), (2, 120), (3, 240), (4, 300), (10, 300)])
def test_a_retry_waits_at_most_the_doubled_back_off_capped(retries, bound, monkeypatch):
    monkeypatch.setattr(random, "randrange", lambda stop: stop - 1)   # the longest wait jitter allows
    assert retry_countdown(retries, backoff=30, backoff_max=300) == bound
    monkeypatch.setattr(random, "randrange", lambda stop: 0)          # the shortest
    assert retry_countdown(retries, backoff=30, backoff_max=300) == 0
