"""The two backends a differential check runs on, behind one small interface.

Both are reached the same way, through the official `kubernetes` client over HTTP with
a kubeconfig. They differ only in how time passes: simcluster's clock is manual, so
`settle` advances it a second at a time; the real tier runs in real time, so `settle`
polls with a deadline.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

T = TypeVar("T")
_namespaces = itertools.count()


class NotSettled(AssertionError):
    pass


@dataclass
class Backend:
    name: str
    kubeconfig_path: str
    advance: Callable[[float], Any] | None = None      # simcluster's clock; None on the real tier
    clock: Callable[[], datetime] | None = None        # simcluster's time; None: the wall clock
    # Forget the stored history up to now, as etcd's compaction does: simcluster's store,
    # or the real tier's etcd (`python -m realcluster compact`).
    compact: Callable[[], Any] | None = None
    api_client: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api_client = config.new_client_from_config(config_file=self.kubeconfig_path)
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.policy = client.PolicyV1Api(self.api_client)

    def now(self) -> datetime:
        """The time the product is handed as `now`: simcluster's manual clock, or the wall clock."""
        return self.clock() if self.clock is not None else datetime.now(timezone.utc)

    def settle(self, condition: Callable[[], T], *, what: str, seconds: float = 30.0) -> T:
        """Wait until `condition()` is truthy and return it: on simcluster by advancing the
        clock up to `seconds` of simulated time, on the real tier within `seconds` of wall time."""
        if self.advance is not None:
            self.advance(0)
            for _ in range(int(seconds) + 1):
                value = condition()
                if value:
                    return value
                self.advance(1)
        else:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                value = condition()
                if value:
                    return value
                time.sleep(0.1)
        raise NotSettled(f"{self.name}: {what} not reached within {seconds:.0f} s")

    def wait(self, seconds: float) -> None:
        """Let `seconds` pass with nothing asked: to see that something does NOT happen
        (a value not reverted). simcluster advances its clock; the real tier really waits."""
        if self.advance is not None:
            self.advance(seconds)
        else:
            time.sleep(seconds)

    def namespace_create(self, prefix: str) -> str:
        name = f"{prefix}-{next(_namespaces)}-{int(time.time() * 1000) % 100000}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        # On the real tier pods are refused until the namespace's default ServiceAccount
        # exists (ServiceAccount admission; the controller-manager creates it). simcluster
        # creates no ServiceAccounts and admits pods without one.
        if self.advance is None:
            self.settle(lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)),
                        what=f"ServiceAccount {name}/default", seconds=30)
        return name

    def service_account_token(self, namespace: str, name: str) -> str:
        """Create ServiceAccount `name` and return a bearer token that authenticates as it.
        The real tier issues one through the TokenRequest API; simcluster does not serve
        TokenRequest and takes the token its `simcluster.io/token` annotation names."""
        token = f"sa-{namespace}-{name}"
        self.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=name, annotations={"simcluster.io/token": token})))
        if self.advance is not None:
            return token
        issued = self.core.create_namespaced_service_account_token(name, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)))
        return issued.status.token


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
