"""The product's identity on the real tier: the ServiceAccount `deploy/rbac.yaml` binds,
installed with kubectl as an operator installs it, and a token for it minted by the real
kube-apiserver (TokenRequest).

The product is then run with a kubeconfig holding only that token, so every call it makes
is judged by the apiserver's RBAC authorizer against the ClusterRole of `deploy/`. The
test's own set-up and checks keep the admin kubeconfig, as an operator's would.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client

from .backends import Backend

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The RBAC the product needs, as deploy/README.md has the operator apply it: the namespace
# and the ServiceAccount, its ClusterRole and binding, and the Role Knative's namespace holds.
IDENTITY_MANIFESTS = (DEPLOY / "namespace.yaml", DEPLOY / "rbac.yaml", DEPLOY / "knative" / "rbac.yaml")
TOKEN_SECONDS = 3600                    # the session's length with room; TokenRequest's minimum is 600
AUTHORIZER_SECONDS = 10.0               # the RBAC authorizer sees a role change within about a second


def deploy_documents(*paths: Path) -> list[dict]:
    return [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]


def deploy_object(kind: str, path: Path = DEPLOY / "rbac.yaml") -> dict:
    [found] = [d for d in deploy_documents(path) if d["kind"] == kind]
    return found


def kubectl(backend: Backend, *args: str, stdin: str | None = None, cache_dir: Path) -> subprocess.CompletedProcess:
    """Run the system's kubectl against the backend as its admin; the caller reads rc and stderr."""
    program = shutil.which("kubectl")
    if program is None:
        raise AssertionError("kubectl is not installed (the Debian/Google Cloud SDK package provides it)")
    return subprocess.run([program, "--kubeconfig", backend.kubeconfig_path, "--cache-dir", str(cache_dir), *args],
                          input=stdin, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(cache_dir)})


@dataclass(frozen=True)
class ProductIdentity:
    user: str                 # system:serviceaccount:<namespace>:<name>
    kubeconfig_path: str      # the backend's server and CA, the ServiceAccount's token


def subject_allowed(backend: Backend, user: str, *, verb: str, resource: str, group: str = "",
                    subresource: str = "", namespace: str = "", name: str = "") -> bool:
    """What the apiserver's authorizer answers for `user` now (a SubjectAccessReview)."""
    sa_namespace = user.split(":")[2]
    review = client.AuthorizationV1Api(backend.api_client).create_subject_access_review(
        client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}",
                               "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, group=group, subresource=subresource or None,
                namespace=namespace or None, name=name or None))))
    return bool(review.status.allowed)


def until_authorizer_says(backend: Backend, user: str, allowed: bool, **attributes) -> None:
    """Poll until the authorizer's answer for `attributes` is `allowed`: its role informer
    takes a role change up within about a second."""
    deadline = time.monotonic() + AUTHORIZER_SECONDS
    while subject_allowed(backend, user, **attributes) != allowed:
        if time.monotonic() > deadline:
            raise AssertionError(f"the authorizer still answers allowed={not allowed} for {user} {attributes} "
                                 f"after {AUTHORIZER_SECONDS:.0f} s")
        time.sleep(0.05)


def identity_install(backend: Backend, workdir: Path) -> ProductIdentity:
    """Apply the identity manifests with kubectl, mint the ServiceAccount's token and
    write the product's kubeconfig; return once the authorizer grants the role."""
    files = [arg for path in IDENTITY_MANIFESTS for arg in ("-f", str(path))]
    applied = kubectl(backend, "apply", "--server-side", *files, cache_dir=workdir)
    assert applied.returncode == 0, applied.stderr
    account = deploy_object("ServiceAccount")["metadata"]
    namespace, name = account["namespace"], account["name"]
    token = client.CoreV1Api(backend.api_client).create_namespaced_service_account_token(
        name, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS))).status.token
    config = yaml.safe_load(Path(backend.kubeconfig_path).read_text())
    for entry in config["users"]:
        entry["user"] = {"token": token}
    path = workdir / "product.kubeconfig"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.chmod(path, 0o600)
    user = f"system:serviceaccount:{namespace}:{name}"
    until_authorizer_says(backend, user, True, verb="list", resource="nodes")
    return ProductIdentity(user=user, kubeconfig_path=str(path))
