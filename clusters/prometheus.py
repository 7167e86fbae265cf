"""The Prometheus gateway: the only module of the product that talks to Prometheus.

A thin layer over prometheus-api-client: bearer-token auth (the token is read from the
environment variable the cluster names, never stored), TLS verification with an
optional CA file, retries of transient failures through urllib3's `Retry` (capped
exponential backoff, honours Retry-After), and `PrometheusError` instead of the
client's exception types. Later features add their queries on top of `query`.

Instant queries are POSTed with the query in the body (Prometheus' API takes both): the
pruner's follow-up query names its candidate pods and may run to hundreds of KB, more
than a URL should carry. `bytes_read` counts the answers' bodies. `query_many` sends
several instant queries at once (on the session's connection pool, from threads kept for
the process): Prometheus evaluates one query's parts one after the other, separate
queries side by side.
"""
from __future__ import annotations

import os
import re
import ssl
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import datetime

import orjson
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from clusters.errors import PrometheusError
from config.threads import SharedThreads

_STATUS = re.compile(r"HTTP Status Code (\d+)")
# What a bearer token may hold to go into an Authorization header: visible ASCII (RFC 6750's
# b64token is a subset). A newline would split the header (requests refuses it, quoting the
# whole value), a non-ASCII character cannot be sent at all.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")
_TLS_REASON = re.compile(r"certificate verify failed: ([^'\"()]+)")
TRANSIENT_STATUSES = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Sample:
    """One instant-vector element: its labels and value."""

    labels: dict[str, str]
    value: float
    timestamp: float


class UnexpectedAnswer(ValueError):
    """A 200 answer whose body is not what the API documents (raised inside `_call`)."""


class PrometheusGateway:
    def __init__(self, url: str, *, token: str | None = None, ca_bundle: str | None = None,
                 verify_tls: bool = True, retries: int = 4, backoff: float = 0.2,
                 backoff_max: float = 10.0, timeout: float = 30.0):
        if not url or not url.startswith(("http://", "https://")):
            raise PrometheusError(f"Prometheus URL must start with http:// or https://, got {url!r}")
        if token and not _HEADER_SAFE.fullmatch(token):
            # IMPORTANT: never quote the token (it would reach the run's errors and the output).
            raise PrometheusError("the Prometheus token holds characters not allowed in a header (a newline, "
                                  "space, control or non-ASCII character): check the flag, variable or file it "
                                  "comes from")
        if verify_tls and ca_bundle:
            _check_ca_file(ca_bundle)
        # `other=0`: a TLS failure (an untrusted certificate) is refused at once; asking
        # again cannot change the answer.
        retry = Retry(total=retries, other=0, backoff_factor=backoff, backoff_max=backoff_max,
                      status_forcelist=TRANSIENT_STATUSES, respect_retry_after_header=True,
                      allowed_methods=frozenset({"GET", "POST"}), raise_on_status=False)
        session = requests.Session()
        session.verify = ca_bundle if (verify_tls and ca_bundle) else verify_tls
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.url = url.rstrip("/")
        self.ca_bundle = ca_bundle if verify_tls else None
        self.calls = 0
        self.bytes_read = 0
        self._counting = threading.Lock()
        self._headers = headers or {}
        self._timeout = timeout
        self._session = session
        self._client = PrometheusConnect(url=self.url, headers=headers, retry=retry, session=session,
                                         timeout=timeout)

    def _call(self, fn, *args, **kwargs):
        with self._counting:
            self.calls += 1
        try:
            return fn(*args, **kwargs)
        except PrometheusApiClientException as exc:
            match = _STATUS.search(str(exc))
            status = int(match.group(1)) if match else 0
            raise PrometheusError(f"Prometheus at {self.url} answered: {exc}", status=status,
                                  transient=status in TRANSIENT_STATUSES) from None
        except requests.exceptions.SSLError as exc:
            match = _TLS_REASON.search(str(exc))
            reason = f"certificate verify failed: {match.group(1).strip()}" if match else str(exc)
            trust = f"the CA file {self.ca_bundle}" if self.ca_bundle else "the system's trusted CAs"
            raise PrometheusError(f"Prometheus at {self.url}: its TLS certificate is not trusted by {trust} "
                                  f"({reason})") from None
        except requests.RequestException as exc:
            raise PrometheusError(f"no answer from Prometheus at {self.url}: {exc}", transient=True) from None
        except UnexpectedAnswer as exc:
            raise PrometheusError(f"unexpected answer from Prometheus: {exc} (from {self.url})") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(f"unexpected answer from Prometheus: {type(exc).__name__}: {exc} "
                                  f"(from {self.url})") from None

    def query(self, promql: str, *, at: datetime | None = None) -> list[Sample]:
        """An instant query; `at` pins the evaluation time (inject the clock). An answer that
        is no instant vector is a PrometheusError saying what was wrong with it."""
        form = {"query": promql, **({"time": at.timestamp()} if at else {})}
        return self._call(lambda: _samples(self._post("/api/v1/query", form)))

    def query_many(self, promqls: list[str], *, at: datetime | None = None) -> list[list[Sample]]:
        """Several instant queries sent at once; their answers in the same order. The first
        failure (in that order) is raised once all have ended. The first is sent from the
        calling thread, the others from the process's query threads (kept between calls:
        starting threads for every pass cost more than the follow-up query)."""
        if len(promqls) < 2:
            return [self.query(q, at=at) for q in promqls]
        futures = [self.query_started(q, at=at) for q in promqls[1:]]
        try:
            first = self.query(promqls[0], at=at)
        except BaseException:
            wait(futures)   # the others have ended too when the caller hears of it
            raise
        return [first] + [f.result() for f in futures]

    def query_started(self, promql: str, *, at: datetime | None = None) -> Future:
        """An instant query sent from one of the process's query threads at once; the
        future's `result()` answers (or raises) as `query` does."""
        return _senders.pool().submit(self.query, promql, at=at)

    def _post(self, path: str, form: dict) -> list:
        # `verify` explicitly: requests would otherwise let REQUESTS_CA_BUNDLE override the CA file.
        response = self._session.post(self.url + path, data=form, headers=self._headers, timeout=self._timeout,
                                      verify=self._session.verify)
        with self._counting:
            self.bytes_read += len(response.content)
        if response.status_code != 200:
            # The client's own wording, so that every failure reads alike.
            raise PrometheusApiClientException(f"HTTP Status Code {response.status_code} ({response.content!r})")
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise UnexpectedAnswer(f"the body is not JSON ({exc})") from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise UnexpectedAnswer(f"no data object in {_excerpt(response.content)}")
        if data.get("resultType", "vector") != "vector":
            raise UnexpectedAnswer(f"a {data.get('resultType')!r} result where an instant vector was asked for")
        return data.get("result")

    def query_range(self, promql: str, *, start: datetime, end: datetime, step: str) -> list[dict]:
        def ranged():
            result = self._client.custom_query_range(promql, start_time=start, end_time=end, step=step)
            if not isinstance(result, list):
                raise UnexpectedAnswer(f"the range query's result is not a list of series: {_excerpt(result)}")
            for series in result:
                values = series.get("values") if isinstance(series, dict) else None
                if not isinstance(values, list) or not isinstance(series.get("metric", {}), dict):
                    raise UnexpectedAnswer(f"a range series without labels and values: {_excerpt(series)}")
                for point in values:
                    try:
                        float(point[0]), float(point[1])
                    except (TypeError, ValueError, IndexError, KeyError):
                        raise UnexpectedAnswer(f"a range sample {_excerpt(point)} is no [time, value] pair "
                                               "of numbers") from None
            return result
        return self._call(ranged)

    def ready(self) -> bool:
        try:
            return bool(self._call(self._client.check_prometheus_connection))
        except PrometheusError:
            return False


def _excerpt(value, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _samples(result) -> list[Sample]:
    """An instant vector's elements; anything else raises `UnexpectedAnswer` naming what."""
    if not isinstance(result, list):
        raise UnexpectedAnswer(f"the result is {_excerpt(result)}, not a list of series")
    samples = []
    for series in result:
        point = series.get("value") if isinstance(series, dict) else None
        labels = series.get("metric", {}) if isinstance(series, dict) else None
        if not isinstance(point, list) or len(point) != 2 or not isinstance(labels, dict):
            raise UnexpectedAnswer(f"a series without a [time, value] pair and labels: {_excerpt(series)}")
        timestamp, value = point
        try:
            # Prometheus writes values as strings ("1.5", "NaN", "+Inf"); a number is refused
            # by the same rule as any other text float() cannot read.
            samples.append(Sample(labels=labels, value=float(value), timestamp=float(timestamp)))
        except (TypeError, ValueError):
            raise UnexpectedAnswer(f"a sample value {value!r} at {timestamp!r} is not a number") from None
    return samples


# Threads sending the second and later queries of `query_many`, shared by every gateway of
# the process.
SENDERS = 4
_senders = SharedThreads(SENDERS, "prometheus")


def _check_ca_file(path: str) -> None:
    """A CA file that cannot be used is named before any query is sent."""
    if not os.path.isfile(path):
        raise PrometheusError(f"Prometheus CA file {path!r} does not exist or is not a file")
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise PrometheusError(f"Prometheus CA file {path!r} holds no usable PEM certificate: {exc}") from None
