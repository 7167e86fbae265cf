"""Bearer-token authentication and RBAC authorization, as kube-apiserver does them.

Who a token is (decided here, documented in README "Simulated cluster: users"):
- `kubeconfig.ADMIN_TOKEN` ("simcluster"), the token of every kubeconfig the simulator
  writes, is `simcluster-admin` in group `system:masters`: full access, as the
  apiserver's privileged-group short cut gives (no RBAC lookup at all).
- The `simcluster.io/v1alpha1 Simulation` document's `spec.tokens` maps a token to
  `{user: NAME, groups: [..]}`.
- A ServiceAccount object annotated `simcluster.io/token: TOKEN` is that token's
  identity: `system:serviceaccount:<ns>:<name>` in groups `system:serviceaccounts` and
  `system:serviceaccounts:<ns>` (what the TokenRequest API's tokens authenticate as).
- Every authenticated user is also in `system:authenticated`.
- A request without credentials follows `spec.anonymous_access`: "admin" (the default;
  like kube-apiserver's old insecure port, so plain HTTP clients keep working),
  "rbac" (`system:anonymous` in `system:unauthenticated`, authorized by RBAC like
  `--anonymous-auth=true`) or "reject" (401).
A token nobody holds, or an Authorization header that is not `Bearer`, is 401.

Authorization follows plugin/pkg/auth/authorizer/rbac/rbac.go: a request is allowed when
a rule of a role bound to the user (ClusterRoleBinding: anywhere; RoleBinding: in its
namespace only, to a Role of that namespace or a ClusterRole) matches its verb, API
group, resource (`pods/eviction`, `deployments/scale`, `*/scale`, `*`) and, when the
rule names some, its resourceNames. ClusterRole aggregationRule is not evaluated.
Discovery (/api, /apis/...) needs an authenticated user; /version, the health paths and
the simulator's own control endpoints (/simcluster/v1/*, /metrics) are open.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from .. import errors
from ..kubeconfig import ADMIN_TOKEN
from ..resources import by_path

ADMIN_USER = "simcluster-admin"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
TOKEN_ANNOTATION = "simcluster.io/token"
ANONYMOUS_MODES = ("admin", "rbac", "reject")

SERVICEACCOUNTS = by_path("", "v1", "serviceaccounts")
ROLES = by_path("rbac.authorization.k8s.io", "v1", "roles")
CLUSTERROLES = by_path("rbac.authorization.k8s.io", "v1", "clusterroles")
ROLEBINDINGS = by_path("rbac.authorization.k8s.io", "v1", "rolebindings")
CLUSTERROLEBINDINGS = by_path("rbac.authorization.k8s.io", "v1", "clusterrolebindings")

# What environ key carries the authenticated user from dispatch to serve_resource.
USER_KEY = "simcluster.user"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @property
    def privileged(self) -> bool:
        return MASTERS in self.groups


ADMIN = User(ADMIN_USER, (MASTERS, AUTHENTICATED))


class Attributes(NamedTuple):
    """authorizer.Attributes of a resource request."""
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


class Denial(NamedTuple):
    user: str
    attributes: Attributes


def unauthorized() -> errors.ApiError:
    return errors.ApiError(401, "Unauthorized", "Unauthorized")


def _service_account_user(namespace: str, name: str) -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED))


def _declared_user(entry) -> User:
    if isinstance(entry, str):
        entry = {"user": entry}
    name = str(entry.get("user") or entry.get("username") or "")
    if not name:
        raise errors.internal("simcluster: spec.tokens entry without a user")
    groups = [str(g) for g in entry.get("groups") or ()]
    if name.startswith("system:serviceaccount:") and name.count(":") == 3:
        _, _, namespace, sa = name.split(":")
        groups += [g for g in _service_account_user(namespace, sa).groups if g not in groups]
    if AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return User(name, tuple(groups))


def authenticate(sim, request) -> User:
    """The user of a request, or 401."""
    header = request.headers.get("Authorization", "")
    if not header:
        mode = getattr(sim.settings, "anonymous_access", "admin")
        if mode == "admin":
            return ADMIN
        if mode == "rbac":
            return User(ANONYMOUS, (UNAUTHENTICATED,))
        raise unauthorized()
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized()
    if token == ADMIN_TOKEN:
        return ADMIN
    declared = (getattr(sim.settings, "tokens", None) or {}).get(token)
    if declared is not None:
        return _declared_user(declared)
    with sim.store.lock:
        accounts = list(sim.store.all(SERVICEACCOUNTS))
    for sa in accounts:
        meta = sa.get("metadata") or {}
        if (meta.get("annotations") or {}).get(TOKEN_ANNOTATION) == token:
            return _service_account_user(meta.get("namespace", ""), meta.get("name", ""))
    raise unauthorized()


# ---- authorization ------------------------------------------------------------------------------
def _matches(values, wanted: str) -> bool:
    return "*" in values or wanted in values


def _resource_matches(resources, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in resources or ():
        if r == "*" or r == combined:
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def rule_allows(rule: dict, attrs: Attributes) -> bool:
    """rbac/v1 helpers: VerbMatches, APIGroupMatches, ResourceMatches, ResourceNameMatches."""
    if not _matches(rule.get("verbs") or (), attrs.verb):
        return False
    if not _matches(rule.get("apiGroups") or (), attrs.group):
        return False
    if not _resource_matches(rule.get("resources"), attrs.resource, attrs.subresource):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _subject_matches(subject: dict, user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    return False


def _role_rules(store, ref: dict, namespace: str) -> list[dict]:
    kind, name = (ref or {}).get("kind"), (ref or {}).get("name", "")
    if kind == "ClusterRole":
        role = store.get(CLUSTERROLES, None, name)
    elif kind == "Role" and namespace:
        role = store.get(ROLES, namespace, name)
    else:
        role = None
    return list((role or {}).get("rules") or ())


def allowed(sim, user: User, attrs: Attributes) -> bool:
    if user.privileged:
        return True
    store = sim.store
    with store.lock:
        bindings = [(b, "") for b in store.all(CLUSTERROLEBINDINGS)]
        if attrs.namespace:
            bindings += [(b, attrs.namespace) for b in store.all(ROLEBINDINGS, attrs.namespace)]
        for binding, namespace in bindings:
            if not any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or ()):
                continue
            if any(rule_allows(rule, attrs) for rule in _role_rules(store, binding.get("roleRef"), namespace)):
                return True
    return False


def forbidden(user: User, attrs: Attributes) -> errors.ApiError:
    """responsewriters.Forbidden + apierrors.NewForbidden, word for word."""
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = (f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope")
    why = (f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {where}')
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    message = f'{qualified} "{attrs.name}" is forbidden: {why}' if attrs.name else f"{qualified} is forbidden: {why}"
    details = {"kind": attrs.resource}
    if attrs.group:
        details["group"] = attrs.group
    if attrs.name:
        details["name"] = attrs.name
    return errors.ApiError(403, "Forbidden", message, details=details)


def forbidden_path(user: User, verb: str, path: str) -> errors.ApiError:
    return errors.ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot {verb} path "{path}"')


def attributes(verb: str, route) -> Attributes:
    namespace = route.namespace or ""
    if route.rtype.plural == "namespaces" and not route.rtype.group and route.name:
        namespace = route.name   # requestinfo.go: a Namespace object is in its own namespace
    return Attributes(verb, route.group, route.rtype.plural, route.subresource or "", namespace,
                      route.name or "")


class Authorizer:
    """Per server: decides, and remembers the last denials (tests and operators read them)."""

    def __init__(self, sim, *, remember: int = 1000):
        self.sim = sim
        self.denials: deque[Denial] = deque(maxlen=remember)

    def authenticate(self, request) -> User:
        return authenticate(self.sim, request)

    def require_authenticated(self, user: User, path: str) -> None:
        """Discovery: system:discovery is bound to system:authenticated only."""
        if AUTHENTICATED not in user.groups and not user.privileged:
            raise forbidden_path(user, "get", path)

    def authorize(self, user: User, verb: str, route) -> None:
        attrs = attributes(verb, route)
        if not allowed(self.sim, user, attrs):
            self.denials.append(Denial(user.name, attrs))
            raise forbidden(user, attrs)
