"""The Prometheus gateway: the only module of the product that talks to Prometheus.

A thin layer over prometheus-api-client: bearer-token auth (the token is read from the
environment variable the cluster names, never stored), TLS verification with an
optional CA bundle, retries of transient failures through urllib3's `Retry` (capped
exponential backoff, honours Retry-After), and `PrometheusError` instead of the
client's exception types. Later features add their queries on top of `query`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from clusters.errors import PrometheusError

_STATUS = re.compile(r"HTTP Status Code (\d+)")
TRANSIENT_STATUSES = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Sample:
    """One instant-vector element: its labels and value."""

    labels: dict[str, str]
    value: float
    timestamp: float


class PrometheusGateway:
    def __init__(self, url: str, *, token: str | None = None, ca_bundle: str | None = None,
                 verify_tls: bool = True, retries: int = 4, backoff: float = 0.2,
                 backoff_max: float = 10.0, timeout: float = 30.0):
        if not url or not url.startswith(("http://", "https://")):
            raise PrometheusError(f"Prometheus URL must start with http:// or https://, got {url!r}")
        retry = Retry(total=retries, backoff_factor=backoff, backoff_max=backoff_max,
                      status_forcelist=TRANSIENT_STATUSES, respect_retry_after_header=True,
                      allowed_methods=frozenset({"GET", "POST"}), raise_on_status=False)
        session = requests.Session()
        session.verify = ca_bundle if (verify_tls and ca_bundle) else verify_tls
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.url = url.rstrip("/")
        self.calls = 0
        self._client = PrometheusConnect(url=self.url, headers=headers, retry=retry, session=session,
                                         timeout=timeout)

    @classmethod
    def for_cluster(cls, cluster: Any) -> "PrometheusGateway":
        """From a cluster row: `prometheus_url`, `prometheus_token_env` (a variable name)."""
        if not cluster.prometheus_url:
            raise PrometheusError(f"cluster {cluster.name!r} has no Prometheus URL")
        token = None
        if cluster.prometheus_token_env:
            token = os.environ.get(cluster.prometheus_token_env) or None
        return cls(cluster.prometheus_url, token=token,
                   ca_bundle=getattr(cluster, "prometheus_ca_bundle", "") or None,
                   verify_tls=getattr(cluster, "prometheus_verify_tls", True))

    def _call(self, fn, *args, **kwargs):
        self.calls += 1
        try:
            return fn(*args, **kwargs)
        except PrometheusApiClientException as exc:
            match = _STATUS.search(str(exc))
            status = int(match.group(1)) if match else 0
            raise PrometheusError(f"Prometheus at {self.url} answered: {exc}", status=status,
                                  transient=status in TRANSIENT_STATUSES) from None
        except requests.RequestException as exc:
            raise PrometheusError(f"no answer from Prometheus at {self.url}: {exc}", transient=True) from None
        except (KeyError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} sent an unexpected answer: {exc}") from None

    def query(self, promql: str, *, at: datetime | None = None) -> list[Sample]:
        """An instant query; `at` pins the evaluation time (inject the clock)."""
        params = {"time": at.timestamp()} if at else None
        result = self._call(self._client.custom_query, promql, params=params)
        samples = []
        for series in result:
            timestamp, value = series["value"]
            samples.append(Sample(labels=series.get("metric", {}), value=float(value), timestamp=float(timestamp)))
        return samples

    def query_range(self, promql: str, *, start: datetime, end: datetime, step: str) -> list[dict]:
        return self._call(self._client.custom_query_range, promql, start_time=start, end_time=end, step=step)

    def ready(self) -> bool:
        try:
            return bool(self._call(self._client.check_prometheus_connection))
        except PrometheusError:
            return False
