"""Label and field selectors, with the grammar of k8s.io/apimachinery/pkg/labels."""
from __future__ import annotations

import re
from typing import Callable

from .errors import bad_request

Predicate = Callable[[dict], bool]

# A requirement: key, operator, optional value set. Set-based ops first so `in` wins.
_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*$")


def _split_requirements(selector: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(f"unable to parse requirement: unbalanced ')' in {selector!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise bad_request(f"unable to parse requirement: unbalanced '(' in {selector!r}")
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_label_selector(selector: str | None) -> Predicate | None:
    """A predicate over a labels dict, or None for "everything"."""
    if not selector or not selector.strip():
        return None
    checks: list[Callable[[dict], bool]] = []
    for requirement in _split_requirements(selector):
        if m := _SET_RE.match(requirement):
            key = m["key"]
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            if m["op"] == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ_RE.match(requirement):
            key, value = m["key"], m["value"]
            if m["op"] == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS_RE.match(requirement):
            key = m["key"]
            if m["neg"]:
                checks.append(lambda labels, k=key: k not in labels)
            else:
                checks.append(lambda labels, k=key: k in labels)
        else:
            raise bad_request(f"unable to parse requirement: {requirement.strip()!r} in label selector {selector!r}")

    if len(checks) == 1:
        return checks[0]   # the usual selector: one requirement, asked of every object of a LIST

    def matches(labels: dict) -> bool:
        for check in checks:
            if not check(labels):
                return False
        return True

    return matches


def selector_from_match_labels(selector: dict | None) -> Predicate:
    """A predicate from a metav1.LabelSelector (matchLabels + matchExpressions).

    An empty selector matches everything, as for PodDisruptionBudgets; callers that
    must treat it as "nothing" (ReplicaSets) check that themselves.
    """
    selector = selector or {}
    match_labels = dict(selector.get("matchLabels") or {})
    expressions = selector.get("matchExpressions") or []

    def matches(labels: dict) -> bool:
        for k, v in match_labels.items():
            if labels.get(k) != v:
                return False
        for expr in expressions:
            key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
            if op == "In" and labels.get(key) not in values:
                return False
            if op == "NotIn" and key in labels and labels[key] in values:
                return False
            if op == "Exists" and key not in labels:
                return False
            if op == "DoesNotExist" and key in labels:
                return False
        return True

    return matches


def _field_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _field_getter(path: str) -> Callable[[dict], str]:
    parts = path.split(".")
    if len(parts) == 2:
        # Most selectable fields are two levels deep (spec.nodeName, status.phase): asked
        # of every object of a LIST, so no loop per object.
        outer, inner = parts

        def get_two(obj: dict) -> str:
            value = obj.get(outer)
            if not isinstance(value, dict):
                return ""
            return _field_value(value.get(inner))

        return get_two

    def get(obj: dict) -> str:
        value = obj
        for part in parts:
            if not isinstance(value, dict):
                return ""
            value = value.get(part)
            if value is None:
                return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


# Fields each kind can be selected on (besides metadata.name and metadata.namespace):
# the field label conversions of pkg/apis/core/v1/conversion.go and batch/v1.
FIELD_SELECTABLE = {
    "pods": {"spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName"},
    "nodes": {"spec.unschedulable"},
    "events": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
               "regarding.kind", "regarding.name", "regarding.namespace", "regarding.uid"},
    "namespaces": {"status.phase"},
    "secrets": {"type"},
    "services": {"spec.clusterIP", "spec.type"},
    "replicationcontrollers": {"status.replicas"},
    "jobs": {"status.successful"},
}
# Built-in kinds with no conversion of their own: runtime.DefaultMetaV1FieldSelectorConversion
# refuses other fields in its own words. (Custom resources say "field label not supported".)
_DEFAULT_CONVERSION = {"configmaps", "serviceaccounts", "deployments", "replicasets", "statefulsets", "daemonsets",
                       "poddisruptionbudgets", "roles", "rolebindings", "clusterroles", "clusterrolebindings"}
# Boolean fields a field selector reads as "false" when the object leaves them out
# (NodeToSelectableFields formats spec.unschedulable with strconv.FormatBool).
_FALSE_WHEN_ABSENT = {"spec.unschedulable"}


def parse_field_selector(selector: str | None, plural: str) -> tuple[Predicate | None, dict[str, str]]:
    """A predicate, and the exact-match terms (for index look-ups such as spec.nodeName)."""
    if not selector or not selector.strip():
        return None, {}
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_SELECTABLE.get(plural, set())
    checks = []
    exact: dict[str, str] = {}
    for term in selector.split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            field, value = term.split("!=", 1)
            negate = True
        elif "==" in term:
            field, value = term.split("==", 1)
            negate = False
        elif "=" in term:
            field, value = term.split("=", 1)
            negate = False
        else:
            raise bad_request(f"invalid selector: {term!r}; can't understand {term!r}")
        field, value = field.strip(), value.strip()
        if field not in allowed:
            if plural in _DEFAULT_CONVERSION:
                raise bad_request(f'"{field}" is not a known field selector: only "metadata.name", "metadata.namespace"')
            raise bad_request(f'field label not supported: {field}')
        getter = _field_getter(field)
        if field in _FALSE_WHEN_ABSENT:
            getter = lambda obj, g=getter: g(obj) or "false"   # noqa: E731
        if negate:
            checks.append(lambda obj, g=getter, v=value: g(obj) != v)
        else:
            exact[field] = value
            checks.append(lambda obj, g=getter, v=value: g(obj) == v)

    if len(checks) == 1:
        return checks[0], exact

    def matches(obj: dict) -> bool:
        for check in checks:
            if not check(obj):
                return False
        return True

    return matches, exact
