"""The object validation kube-apiserver does that matters to this product.

Names (DNS-1123), label and annotation syntax (k8s.io/apimachinery/pkg/util/validation)
and the pod-deletion-cost annotation (pkg/apis/core/validation: first character `-`,
a non-zero digit, or exactly "0", then a base-10 int32). Failures are 422 Invalid with
the field path, as field.ErrorList renders them.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

from . import errors
from .resources import ResourceType
from .selectors import selector_from_match_labels

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# pkg/apis/policy/validation: the values spec.unhealthyPodEvictionPolicy may take.
UNHEALTHY_POD_EVICTION_POLICIES = ("AlwaysAllow", "IfHealthyBudget")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

# Kinds whose names are DNS-1123 labels rather than subdomains.
_LABEL_NAMED = {("", "namespaces"), ("", "services"), ("serving.knative.dev", "services")}


def _q(value) -> str:
    """Quoted as Go's %q quotes values in field errors."""
    return json.dumps(value)


# Namespaces, label and annotation keys and label values repeat across objects (every
# pod of a namespace carries the same ones): each is checked once, then answered from
# here. Object names, unique, are checked every time.
_CHECKED_TEXTS = 8192


def name_errors(name: str, label: bool) -> tuple[str, ...]:
    if label:
        if len(name) > 63:
            return ("must be no more than 63 characters",)
        if not _DNS1123_LABEL.match(name):
            return ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc')",)
        return ()
    if len(name) > 253:
        return ("must be no more than 253 characters",)
    if not _DNS1123_SUBDOMAIN.match(name):
        return ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character (e.g. 'example.com')",)
    return ()


def _namespace_errors(namespace) -> tuple[str, ...]:
    return _checked_namespace(namespace) if type(namespace) is str else name_errors(namespace, label=True)


@lru_cache(maxsize=_CHECKED_TEXTS)
def _checked_namespace(namespace: str) -> tuple[str, ...]:
    return name_errors(namespace, label=True)


@lru_cache(maxsize=_CHECKED_TEXTS)
def qualified_name_errors(key: str) -> tuple[str, ...]:
    """A label or annotation key: an optional DNS subdomain prefix and '/', then a name."""
    prefix, _, name = key.rpartition("/")
    problems = []
    if "/" in key and not prefix:
        problems.append("prefix part must be non-empty")
    elif prefix:
        problems += [f"prefix part {p}" for p in name_errors(prefix, label=False)]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        problems.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
                        "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc')")
    return tuple(problems)


def label_value_errors(value) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ("must be a string",)
    return _label_text_errors(value)


@lru_cache(maxsize=_CHECKED_TEXTS)
def _label_text_errors(value: str) -> tuple[str, ...]:
    if len(value) > 63:
        return ("must be no more than 63 characters",)
    if not _LABEL_VALUE.match(value):
        return ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character",)
    return ()


def deletion_cost_error(value) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a 32bit integer"
    if not (value[0] == "-" or value == "0" or "1" <= value[0] <= "9"):
        return "must be a 32bit integer"
    if not re.fullmatch(r"-?[0-9]+", value) or not -2**31 <= int(value) < 2**31:
        return "must be a 32bit integer"
    return None


def validate(rtype: ResourceType, obj: dict, old: dict | None) -> None:
    """The Store's validator: raises 422 Invalid listing every problem found."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    causes: list[tuple[str, str]] = []
    if old is None:
        label_named = (rtype.group, rtype.plural) in _LABEL_NAMED
        if problems := name_errors(name, label_named):
            causes += [("metadata.name", f"Invalid value: {_q(name)}: {p}") for p in problems]
        namespace = meta.get("namespace")
        if rtype.namespaced and namespace and (problems := _namespace_errors(namespace)):
            causes += [("metadata.namespace", f"Invalid value: {_q(meta['namespace'])}: {p}") for p in problems]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    for field, mapping in (("labels", labels), ("annotations", annotations)):
        if not isinstance(mapping, dict):
            causes.append((f"metadata.{field}", "Invalid value: must be a map of strings"))
            continue
        for key in mapping:
            if problems := qualified_name_errors(key):
                causes += [(f"metadata.{field}", f"Invalid value: {_q(key)}: {p}") for p in problems]
    if isinstance(labels, dict):
        for value in labels.values():
            if problems := label_value_errors(value):
                causes += [("metadata.labels", f"Invalid value: {_q(value)}: {p}") for p in problems]
    if isinstance(annotations, dict):
        for key, value in annotations.items():
            if not isinstance(value, str):
                causes.append((f"metadata.annotations[{key}]", f"Invalid value: {_q(value)}: must be a string"))
    if rtype.group == "" and rtype.plural == "pods" and isinstance(annotations, dict) and DELETION_COST in annotations:
        value = annotations[DELETION_COST]
        if problem := deletion_cost_error(value):
            causes.append((f"metadata.annotations[{DELETION_COST}]", f"Invalid value: {_q(value)}: {problem}"))
    if rtype.group == "policy" and rtype.plural == "poddisruptionbudgets":
        policy = (obj.get("spec") or {}).get("unhealthyPodEvictionPolicy")
        if policy is not None and policy not in UNHEALTHY_POD_EVICTION_POLICIES:
            supported = ", ".join(_q(p) for p in UNHEALTHY_POD_EVICTION_POLICIES)
            causes.append(("spec.unhealthyPodEvictionPolicy",
                           f"Unsupported value: {_q(policy)}: supported values: {supported}"))
    if rtype.group == "apps":
        causes += _workload_causes(obj, old)
    if causes:
        raise errors.invalid(rtype.kind, name, causes, rtype.group)


def _workload_causes(obj: dict, old: dict | None) -> list[tuple[str, str]]:
    """pkg/apis/apps/validation for Deployments, ReplicaSets, StatefulSets and DaemonSets:
    replicas a non-negative integer, a selector the template's labels match, and a
    selector that never changes once created (apps/v1). Upstream renders the values with
    Go's %#v; JSON stands in for it here."""
    spec = obj.get("spec") or {}
    causes = []
    if "replicas" in spec:
        replicas = spec["replicas"]
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            causes.append(("spec.replicas", f"Invalid value: {_q(replicas)}: must be an integer"))
        elif replicas < 0:
            causes.append(("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0"))
    selector = spec.get("selector")
    labels = (((spec.get("template") or {}).get("metadata") or {}).get("labels")) or {}
    if isinstance(selector, dict) and (selector.get("matchLabels") or selector.get("matchExpressions")) \
            and isinstance(labels, dict) and not selector_from_match_labels(selector)(labels):
        causes.append(("spec.template.metadata.labels",
                       f"Invalid value: {_q(labels)}: `selector` does not match template `labels`"))
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        causes.append(("spec.selector", f"Invalid value: {_q(selector)}: field is immutable"))
    return causes
