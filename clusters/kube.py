"""The Kubernetes gateway: the only module of the product that imports `kubernetes`.

One `KubeGateway` per cluster. It speaks the REST API through the official client's
`ApiClient` (auth, TLS, kubeconfig handling) but reads raw JSON with orjson and returns
plain dicts: the client's model objects are slow for big lists and know nothing of
custom resources. Every call names a `Resource` from the table below, is counted in
`calls[(verb, resource)]`, retried with capped exponential backoff when the failure is
transient (5xx, 429 honouring Retry-After, no answer) and fails with the project's own
errors from `clusters.errors`.
"""
from __future__ import annotations

import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import quote

import kubernetes.client
import kubernetes.config
import kubernetes.utils
import orjson
import prometheus_client
import tenacity
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from clusters.errors import (
    BadResponse,
    ConfigError,
    Gone,
    Invalid,
    KubeError,
    TooManyRequests,
    Unavailable,
    error_for_status,
)

# Process-wide counters for /metrics (config/observability.py): every attempt, retries
# included, as in `KubeGateway.calls`; errors by HTTP code (0 = no answer).
API_CALLS = prometheus_client.Counter("gpu_capacity_kube_api_calls", "Kubernetes API requests made.",
                                      ["cluster", "verb", "resource"])
API_ERRORS = prometheus_client.Counter("gpu_capacity_kube_api_errors", "Kubernetes API requests that failed.",
                                       ["cluster", "verb", "resource", "code"])


# What kube-apiserver accepts as an object's name (k8s.io/apimachinery/pkg/util/validation:
# IsDNS1123Label, IsDNS1123Subdomain; namespaces are labels, as pkg/api/validation's
# ValidateNamespaceName says). A name goes into the request path, where "?", "#", "/" or
# ".." would address another object, subresource or query: one the server could never hold
# is refused before any request (IsValidPathSegmentName guards the same path on the server).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1123_LABEL_RULE = ("a DNS-1123 label: at most 63 characters, lowercase letters, digits and '-', "
                      "starting and ending with a letter or digit")
DNS1123_SUBDOMAIN_RULE = ("a DNS-1123 subdomain: at most 253 characters, lowercase letters, digits, '-' and '.', "
                          "each dot-separated part starting and ending with a letter or digit")


def name_check(value: Any, *, what: str, label: bool = False) -> str:
    """`value` when it is a valid object name (`label`: a DNS-1123 label, else a subdomain),
    else `Invalid` (400) naming `what`, the value and the rule."""
    pattern, limit, rule = ((_DNS1123_LABEL, 63, DNS1123_LABEL_RULE) if label
                            else (_DNS1123_SUBDOMAIN, 253, DNS1123_SUBDOMAIN_RULE))
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        raise Invalid(f"{what} {value!r} is not a valid Kubernetes name: it must be {rule}", code=400)
    return value


@dataclass(frozen=True)
class Resource:
    """A resource type as the API serves it: where it lives and what it is called."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    label_named: bool = False  # its names are DNS-1123 labels (Namespaces, Services), not subdomains

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """A short unique label, used in call counters and error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The request path. Every part given is checked (`name_check`) before it is put in,
        and percent-encoded all the same, so no value can reach past its own segment."""
        if namespace:
            name_check(namespace, what="namespace", label=True)
        if name is not None:
            name_check(name, what=f"{self.kind} name", label=self.label_named)
        if subresource is not None:
            name_check(subresource, what=f"{self.kind} subresource", label=True)
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        elif self.namespaced and name:
            raise Invalid(f"{self.name} {name!r} is namespaced: a namespace is required", code=400)
        elif not self.namespaced and namespace:
            raise Invalid(f"{self.name} is cluster-scoped: no namespace may be given (got {namespace!r})",
                          code=400)
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if subresource:
            if not name:
                raise Invalid(f"subresource {subresource!r} of {self.name} needs an object name", code=400)
            base += f"/{quote(subresource, safe='')}"
        return base


NAMESPACES = Resource("", "v1", "Namespace", "namespaces", namespaced=False, label_named=True)
NODES = Resource("", "v1", "Node", "nodes", namespaced=False)
PODS = Resource("", "v1", "Pod", "pods")
SERVICES = Resource("", "v1", "Service", "services", label_named=True)
EVENTS = Resource("", "v1", "Event", "events")
CONFIGMAPS = Resource("", "v1", "ConfigMap", "configmaps")
DEPLOYMENTS = Resource("apps", "v1", "Deployment", "deployments")
REPLICASETS = Resource("apps", "v1", "ReplicaSet", "replicasets")
STATEFULSETS = Resource("apps", "v1", "StatefulSet", "statefulsets")
DAEMONSETS = Resource("apps", "v1", "DaemonSet", "daemonsets")
PDBS = Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
KNATIVE_SERVICES = Resource("serving.knative.dev", "v1", "Service", "services", label_named=True)
CONFIGURATIONS = Resource("serving.knative.dev", "v1", "Configuration", "configurations")
REVISIONS = Resource("serving.knative.dev", "v1", "Revision", "revisions")
PODAUTOSCALERS = Resource("autoscaling.internal.knative.dev", "v1alpha1", "PodAutoscaler", "podautoscalers")
INFERENCESERVICES = Resource("serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices")
NOTEBOOKS = Resource("kubeflow.org", "v1", "Notebook", "notebooks")
MODELSERVINGS = Resource("workload.serving.volcano.sh", "v1alpha1", "ModelServing", "modelservings")

RESOURCES: tuple[Resource, ...] = (
    NAMESPACES, NODES, PODS, SERVICES, EVENTS, CONFIGMAPS, DEPLOYMENTS, REPLICASETS,
    STATEFULSETS, DAEMONSETS, PDBS, KNATIVE_SERVICES, CONFIGURATIONS, REVISIONS,
    PODAUTOSCALERS, INFERENCESERVICES, NOTEBOOKS, MODELSERVINGS,
)
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}
# Not a resource: the discovery document `GET /apis`, named for the call counters only.
DISCOVERY = Resource("", "v1", "APIGroupList", "apis", namespaced=False)


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource of an object's `apiVersion` and `kind` (an ownerReference, say)."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        known = ", ".join(sorted(f"{a} {k}" for a, k in _BY_KIND))
        raise Invalid(f"unknown resource kind {kind!r} in {api_version!r}; known: {known}", code=400) from None


PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class WatchEvent(NamedTuple):
    type: str  # ADDED, MODIFIED, DELETED
    object: dict
    resource_version: str


def _query_given(*params: tuple[str, Any]) -> list[tuple[str, Any]]:
    """The query parameters of a list or watch that were given (an empty selector, a zero
    limit or timeout means "not asked for" and is left out of the URL)."""
    return [(name, value) for name, value in params if value]


def _retry_after_seconds(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from kube-apiserver, fall back to backoff


def _error_from_response(status: int, body: bytes, headers: Any, what: str) -> KubeError:
    reason, message, details = "", "", None
    try:
        status_obj = orjson.loads(body) if body else {}
        if isinstance(status_obj, dict):
            reason = status_obj.get("reason", "")
            message = status_obj.get("message", "")
            details = status_obj.get("details")
    except orjson.JSONDecodeError:
        message = body[:300].decode("utf-8", "replace")
    return error_for_status(status, reason, message or f"{what}: HTTP {status}",
                            retry_after=_retry_after_seconds(headers), details=details)


def _proxy_settled(configuration: kubernetes.client.Configuration) -> kubernetes.client.Configuration:
    """The configuration with its proxy fixed as the kubeconfig and the environment give it now.

    The client resolves a proxy from the environment whenever the host is set, and the
    kubeconfig loader's token hook sets the host again before every request: each call
    read the whole environment (~0.2 ms; 55 calls for a 50,000-pod snapshot) to find the
    same answer. The connection pool took its proxy when the client was made; this only
    keeps later assignments of the same host from re-reading it."""
    configuration.proxy = configuration.proxy
    return configuration


def event_name(object_name: str, moment: datetime) -> str:
    """`<object>.<unix ns hex>.<6 random hex>`: client-go's recorder name plus a random
    part, since two Events about one object at the same instant (a restore in the same
    nanosecond as its prune, as a simulated clock makes it) would otherwise share a name
    and the second would be refused with 409. The random part is drawn once per Event, so
    a retried create after a lost answer cannot land twice. At most 253 characters (a DNS
    subdomain): a very long object name is shortened, the stamp and random part are kept."""
    tail = f".{int(moment.timestamp() * 1e9):x}.{secrets.token_hex(3)}"
    return f"{object_name[:253 - len(tail)].rstrip('.-')}{tail}"


class KubeGateway:
    """All Kubernetes API access of one cluster. Thread-safe; share one per cluster."""

    def __init__(self, api_client: "kubernetes.client.ApiClient", *, name: str = "default",
                 retry_attempts: int = 5, backoff: float = 0.2, backoff_max: float = 10.0,
                 request_timeout: float = 30.0, sleep: Callable[[float], None] = time.sleep):
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be at least 1, got {retry_attempts}")
        self.name = name
        self._api = api_client
        # IMPORTANT: urllib3 must not retry on its own, or retries would be invisible
        # to the backoff and the counters below.
        self._api.rest_client.pool_manager.connection_pool_kw["retries"] = False
        self.retry_attempts = retry_attempts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self._sleep = sleep
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.retries: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()

    # --- construction ---------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None, **kwargs) -> "KubeGateway":
        configuration = kubernetes.client.Configuration()
        configuration.retries = False  # retries are ours (see __init__)
        try:
            kubernetes.config.load_kube_config(config_file=path or None, context=context or None,
                                               client_configuration=configuration,
                                               persist_config=False)
        # A malformed file fails inside the loader with whatever it trips on: YAMLError (not
        # YAML), TypeError / KeyError / AttributeError (YAML of another shape), ValueError
        # (UnicodeDecodeError: not text). All say the same: this file is no kubeconfig.
        except (ConfigException, OSError, yaml.YAMLError, TypeError, KeyError, AttributeError, ValueError) as exc:
            malformed = "" if isinstance(exc, (ConfigException, OSError)) else "not a kubeconfig file: "
            raise ConfigError(f"cannot load kubeconfig {path!r} (context {context or 'current'!r}): {malformed}{exc}") \
                from None
        return cls(kubernetes.client.ApiClient(_proxy_settled(configuration)), **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs) -> "KubeGateway":
        configuration = kubernetes.client.Configuration()
        configuration.retries = False  # retries are ours (see __init__)
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise ConfigError(f"not running inside a cluster: {exc}") from None
        return cls(kubernetes.client.ApiClient(_proxy_settled(configuration)), **kwargs)

    @property
    def host(self) -> str:
        return self._api.configuration.host

    def close(self) -> None:
        self._api.close()

    # --- the one request path ---------------------------------------------------------
    def _count(self, counter: Counter, verb: str, resource: Resource) -> None:
        with self._lock:
            counter[(verb, resource.name)] += 1

    def calls_total(self, verbs: tuple[str, ...] | None = None) -> int:
        """API calls made so far, optionally only these verbs (e.g. the writes)."""
        with self._lock:
            return sum(n for (verb, _), n in self.calls.items() if verbs is None or verb in verbs)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            return min(exc.retry_after, self.backoff_max)
        return min(self.backoff * (2 ** (state.attempt_number - 1)), self.backoff_max)

    def _send(self, verb: str, resource: Resource, method: str, path: str, *,
              query: list[tuple[str, Any]] | None = None, body: Any = None,
              content_type: str | None = None, stream: bool = False,
              timeout: float | None = None, retry_throttled: bool = True, decoder: Any = None):
        retry_on: tuple[type[KubeError], ...] = (Unavailable, TooManyRequests) if retry_throttled else (Unavailable,)

        unanswered: list[bool] = []

        def before_sleep(state: tenacity.RetryCallState) -> None:
            self._count(self.retries, verb, resource)
            if isinstance(state.outcome.exception(), Unavailable):
                unanswered.append(True)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retry_attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(self._send_counted, verb, resource, method, path, query, body, content_type,
                            stream, timeout, decoder)
        except KubeError as exc:
            exc.after_unanswered_write = bool(unanswered) and method not in ("GET", "HEAD")
            raise

    def _send_counted(self, verb, resource, *args):
        """One attempt, also counted process-wide, its failure in `errors` too."""
        API_CALLS.labels(self.name, verb, resource.name).inc()
        try:
            return self._send_once(verb, resource, *args)
        except KubeError as exc:
            self._count(self.errors, verb, resource)
            API_ERRORS.labels(self.name, verb, resource.name, str(exc.code)).inc()
            raise

    def ping(self, *, timeout: float = 5.0) -> None:
        """Is the API answering us? One cheap list (one namespace), no retries: a readiness
        probe answers within its own timeout. Raises the gateway's errors."""
        self._send_counted("list", NAMESPACES, "GET", NAMESPACES.path(), [("limit", 1)], None, None, False,
                           timeout, None)

    def api_groups(self) -> dict[str, list[str]]:
        """The API groups the server serves and their versions, preferred first, as its
        discovery document `GET /apis` says (the core group "" is always served and not
        listed). Every authenticated user may read it (the built-in system:discovery role)."""
        listing = self._send("get", DISCOVERY, "GET", "/apis")
        served: dict[str, list[str]] = {}
        for group in listing.get("groups") or ():
            preferred = (group.get("preferredVersion") or {}).get("version")
            versions = [v.get("version") for v in group.get("versions") or () if v.get("version")]
            served[group.get("name", "")] = sorted(versions, key=lambda v: v != preferred)
        return served

    def _send_once(self, verb, resource, method, path, query, body, content_type, stream, timeout, decoder):
        self._count(self.calls, verb, resource)
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        what = f"{verb} {resource.name} {path}"
        try:
            request = self._api.param_serialize(
                method=method, resource_path=path, query_params=query or [],
                header_params=headers, body=body, auth_settings=["BearerToken"])
            response = self._api.call_api(*request, _request_timeout=timeout or self.request_timeout)
        except ApiException as exc:  # the client's own failures (TLS, unserializable body)
            raise error_for_status(exc.status or 0, exc.reason or "", f"{what}: {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{what}: no answer from {self.host}: {exc}", code=0,
                              reason="ConnectionError") from None
        if not 200 <= response.status <= 299:
            try:
                data = response.read()
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            raise _error_from_response(response.status, data, response.getheaders(), what)
        if stream:
            return response.response
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{what}: answer cut short: {exc}", code=0, reason="ConnectionError") from None
        try:
            if decoder is not None:
                return decoder.decode(data or b"{}")
            return orjson.loads(data) if data else {}
        except ValueError as exc:   # orjson's and msgspec's decode and validation errors
            raise BadResponse(f"{what}: the answer is not what was asked for: {exc}") from None

    # --- reads --------------------------------------------------------------------------
    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            subresource: str | None = None) -> dict:
        return self._send("get", resource, "GET", resource.path(namespace, name, subresource))

    def list_page(self, resource: Resource, *, namespace: str | None = None,
                  label_selector: str | None = None, field_selector: str | None = None,
                  limit: int | None = None, continue_token: str | None = None,
                  resource_version: str | None = None, decoder: Any = None) -> Any:
        """One raw page: the List object with `items` and `metadata.continue`, as dicts, or
        as `decoder` (a `msgspec.json.Decoder`) decodes it: only the fields it names."""
        query = _query_given(("labelSelector", label_selector), ("fieldSelector", field_selector),
                             ("limit", limit), ("continue", continue_token))
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        return self._send("list", resource, "GET", resource.path(namespace), query=query, decoder=decoder)

    def list(self, resource: Resource, *, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None,
             page_size: int | None = 500, decoder: Any = None,
             take: Callable[[Any], Iterable] | None = None) -> list:
        """All matching objects, following `continue` tokens page by page; each page is let
        go before the next is asked for.

        Items are dicts with `apiVersion` and `kind` filled in (lists omit them per item), or
        what `decoder` makes of them (its pages must have `items` and `continue_token`, as
        `clusters.snapshot.ListFields` does). `take(items)`, when given, is called with each
        page's items and what it returns is kept instead of them: a caller that wants a few
        objects, or its own views of them, never holds more than one page of the rest.

        When the list's version has been compacted away between two pages (410 Expired),
        everything is read again in one LIST and what was kept from the earlier pages is
        dropped, as client-go's pager does (FullListIfExpired): never an object twice or lost.
        """
        kept: list = []
        token = None
        while True:
            try:
                page = self.list_page(resource, namespace=namespace, label_selector=label_selector,
                                      field_selector=field_selector, limit=page_size, continue_token=token,
                                      decoder=decoder)
            except Gone:
                if token is None:
                    raise
                kept, token, page_size = [], None, None
                continue
            if decoder is None:
                items = page.get("items") or ()
                for item in items:
                    item.setdefault("apiVersion", resource.api_version)
                    item.setdefault("kind", resource.kind)
                token = (page.get("metadata") or {}).get("continue")
            else:
                items, token = page.items or (), page.continue_token
            kept.extend(items if take is None else take(items))
            if not token:
                return kept
            del page, items

    # --- writes -------------------------------------------------------------------------
    def create(self, resource: Resource, obj: dict, *, namespace: str | None = None,
               dry_run: bool = False) -> dict:
        namespace = namespace or (obj.get("metadata") or {}).get("namespace") if resource.namespaced else None
        query = [("dryRun", "All")] if dry_run else None
        return self._send("create", resource, "POST", resource.path(namespace), body=obj,
                          content_type="application/json", query=query)

    def replace(self, resource: Resource, obj: dict, *, subresource: str | None = None) -> dict:
        """PUT the whole object; its `metadata.resourceVersion` makes it a compare-and-swap."""
        meta = obj.get("metadata") or {}
        if not meta.get("name"):
            raise Invalid(f"replace {resource.name}: the object has no metadata.name", code=400)
        return self._send("replace", resource, "PUT",
                          resource.path(meta.get("namespace") if resource.namespaced else None,
                                        meta["name"], subresource),
                          body=obj, content_type="application/json")

    def patch(self, resource: Resource, name: str, patch: dict | list, *, namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> dict:
        """Patch with `patch_type` "merge" (RFC 7386), "strategic" (core kinds only) or "json" (RFC 6902)."""
        if patch_type not in PATCH_TYPES:
            raise Invalid(f"unknown patch type {patch_type!r}; use one of {', '.join(PATCH_TYPES)}", code=400)
        if (patch_type == "json") != isinstance(patch, list):
            raise Invalid(f"a {patch_type!r} patch must be a {'list of operations' if patch_type == 'json' else 'dict'}",
                          code=400)
        return self._send("patch", resource, "PATCH", resource.path(namespace, name, subresource),
                          body=patch, content_type=PATCH_TYPES[patch_type])

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
               propagation: str | None = None, uid: str | None = None,
               resource_version: str | None = None, grace_period_seconds: int | None = None) -> dict:
        """Delete; `uid` / `resource_version` are preconditions (409 when they no longer hold)."""
        if propagation not in (None, "Foreground", "Background", "Orphan"):
            raise Invalid(f"propagation must be Foreground, Background or Orphan, not {propagation!r}", code=400)
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        if uid or resource_version:
            body["preconditions"] = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return self._send("delete", resource, "DELETE", resource.path(namespace, name), body=body,
                          content_type="application/json")

    # --- subresources and helpers -----------------------------------------------------------
    def get_scale(self, resource: Resource, name: str, *, namespace: str) -> dict:
        return self._send("get", resource, "GET", resource.path(namespace, name, "scale"))

    def set_scale(self, resource: Resource, name: str, replicas: int, *, namespace: str) -> dict:
        if not isinstance(replicas, int) or replicas < 0:
            raise Invalid(f"replicas must be a whole number >= 0, got {replicas!r}", code=400)
        return self._send("patch", resource, "PATCH", resource.path(namespace, name, "scale"),
                          body={"spec": {"replicas": replicas}}, content_type=PATCH_TYPES["merge"])

    def evict(self, name: str, *, namespace: str, grace_period_seconds: int | None = None) -> dict:
        """Evict through policy/v1. A PodDisruptionBudget refusal is `TooManyRequests`,
        returned at once: retrying it is the caller's decision (kubectl drain waits 5 s)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
        return self._send("evict", PODS, "POST", PODS.path(namespace, name, "eviction"), body=body,
                          content_type="application/json", retry_throttled=False)

    def create_event(self, involved: dict, *, reason: str, message: str, event_type: str = "Normal",
                     component: str = "gpu-capacity", now: datetime | None = None) -> dict:
        """Record a core/v1 Event about `involved` (a full object: apiVersion, kind, metadata)."""
        if event_type not in ("Normal", "Warning"):
            raise Invalid(f"event type must be Normal or Warning, not {event_type!r}", code=400)
        meta = involved.get("metadata") or {}
        if not involved.get("apiVersion") or not involved.get("kind") or not meta.get("name"):
            raise Invalid("the involved object needs apiVersion, kind and metadata.name", code=400)
        # The Event's own name is made from it (`event_name`): a name no object can have is refused here.
        name_check(meta["name"], what=f"involved {involved['kind']} name")
        namespace = meta.get("namespace") or "default"
        moment = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(meta["name"], moment), "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"],
                "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        return self.create(EVENTS, event, namespace=namespace)

    def watch(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout_seconds: int | None = None) -> Iterator[WatchEvent]:
        """Events of `resource`, each with its resourceVersion.

        Without `resource_version` it lists first and yields every current object as
        ADDED. When the server says the version is too old (410 Gone) it lists again,
        yields the current objects as ADDED, and goes on from there: consumers must be
        idempotent, as informers are. A dropped stream is resumed from the last version.
        With `timeout_seconds` the generator ends when the server closes the stream.
        """
        rv = resource_version
        while True:
            if rv is None:
                page = self.list_page(resource, namespace=namespace, label_selector=label_selector,
                                      field_selector=field_selector)
                rv = (page.get("metadata") or {}).get("resourceVersion") or "0"
                for item in page.get("items") or ():
                    item.setdefault("apiVersion", resource.api_version)
                    item.setdefault("kind", resource.kind)
                    yield WatchEvent("ADDED", item, (item.get("metadata") or {}).get("resourceVersion", rv))
            query = [("watch", "true"), ("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                     *_query_given(("labelSelector", label_selector), ("fieldSelector", field_selector),
                                   ("timeoutSeconds", timeout_seconds))]
            try:
                stream = self._send("watch", resource, "GET", resource.path(namespace), query=query,
                                    stream=True, timeout=(timeout_seconds or 0) + self.request_timeout)
            except Gone:
                rv = None
                continue
            gone = False
            try:
                for line in stream:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            gone = True
                            break
                        raise error_for_status(obj.get("code", 500), obj.get("reason", ""),
                                               obj.get("message", "watch error"))
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    yield WatchEvent(kind, obj, rv)
            except (urllib3.exceptions.HTTPError, OSError):
                pass  # a dropped stream: resume from the last version seen
            finally:
                stream.release_conn()
            if gone:
                rv = None
            elif timeout_seconds:
                return


_GATEWAYS: dict[tuple, KubeGateway] = {}
_GATEWAYS_LOCK = threading.Lock()


def gateway_for(cluster: Any) -> KubeGateway:
    """The shared gateway of a cluster row (anything with `name`, `kubeconfig_path`,
    `kube_context` and `in_cluster`), built once per connection setting."""
    from django.conf import settings  # the retry policy is a deployment setting

    key = (cluster.name, cluster.kubeconfig_path, cluster.kube_context, cluster.in_cluster)
    with _GATEWAYS_LOCK:
        gateway = _GATEWAYS.get(key)
        if gateway is None:
            options = dict(name=cluster.name, retry_attempts=settings.KUBE_RETRY_ATTEMPTS,
                           backoff=settings.KUBE_RETRY_BACKOFF, backoff_max=settings.KUBE_RETRY_BACKOFF_MAX,
                           request_timeout=settings.KUBE_REQUEST_TIMEOUT)
            if cluster.in_cluster:
                gateway = KubeGateway.in_cluster(**options)
            else:
                if not cluster.kubeconfig_path:
                    raise ConfigError(f"cluster {cluster.name!r} has neither a kubeconfig path nor in-cluster set")
                gateway = KubeGateway.from_kubeconfig(cluster.kubeconfig_path, cluster.kube_context, **options)
            _GATEWAYS[key] = gateway
        return gateway


def gateway_forget(cluster: Any) -> None:
    """Close and drop the shared gateway of one cluster row, if one was built (the cluster is gone)."""
    key = (cluster.name, cluster.kubeconfig_path, cluster.kube_context, cluster.in_cluster)
    with _GATEWAYS_LOCK:
        gateway = _GATEWAYS.pop(key, None)
    if gateway is not None:
        gateway.close()


def forget_gateways() -> None:
    """Drop cached gateways (a cluster's kubeconfig was rewritten, or between tests)."""
    with _GATEWAYS_LOCK:
        for gateway in _GATEWAYS.values():
            gateway.close()
        _GATEWAYS.clear()


def quantity_parse(text: str) -> Decimal:
    """A Kubernetes quantity ("500m", "32Gi", "1.5") as a number, by the official client's
    parser; ValueError when it is not one."""
    return kubernetes.utils.parse_quantity(text)
