"""Certificates and keys for one cluster's life, made with the `openssl` command.

A private CA signs the apiserver's serving certificate (valid for the names and
addresses clients use: 127.0.0.1 through the relay, 10.0.0.1 inside the namespace,
10.96.0.1 as the `kubernetes` Service); an RSA key signs ServiceAccount tokens.
Authentication is by static bearer tokens (`--token-auth-file`): each component gets
its own identity, so RBAC and audit read as on a real cluster.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_IP = "10.96.0.1"     # the first address of --service-cluster-ip-range 10.96.0.0/12
INSIDE_IP = "10.0.0.1"       # the namespace's address on lo; what components dial
DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local")
IP_ADDRESSES = ("127.0.0.1", INSIDE_IP, SERVICE_IP)

# (user, uid, groups) per token; system:masters for the admin only, the components get
# the identities their bootstrap ClusterRoles are bound to.
IDENTITIES = {
    "admin": ("realcluster-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    "kwok": ("realcluster-kwok", ("system:masters",)),   # writes node and pod status of fake kubelets
    # Knative's components act as the ServiceAccount their Deployments would run as, so
    # Serving's own ClusterRoleBindings grant them what they grant in a cluster.
    "knative": ("system:serviceaccount:knative-serving:controller",
                ("system:serviceaccounts", "system:serviceaccounts:knative-serving")),
    # KServe's controller manager, bound by its own ClusterRole (config/rbac/role.yaml).
    "kserve": ("system:serviceaccount:kserve:kserve-controller-manager",
               ("system:serviceaccounts", "system:serviceaccounts:kserve")),
}


class PkiError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pki:
    directory: Path
    tokens: dict[str, str]

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def token_file(self) -> Path:
        return self.directory / "tokens.csv"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("the `openssl` command is not installed; realcluster needs it to make its certificates")
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def pki_create(directory: Path, *, extra_tokens: dict | None = None) -> Pki:
    """Make the CA, serving certificate, ServiceAccount key and token file. `extra_tokens`
    is a scenario's `spec.tokens` (token -> {user, groups}), honoured as simcluster does."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=realcluster-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=directory)
    names = [f"DNS:{name}" for name in DNS_NAMES] + [f"IP:{ip}" for ip in IP_ADDRESSES]
    (directory / "apiserver.ext").write_text(
        f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "3650", "-extfile", "apiserver.ext", cwd=directory)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    tokens = {name: secrets.token_hex(16) for name in IDENTITIES}
    lines = []
    for name, (user, groups) in IDENTITIES.items():
        group_field = f',"{",".join(groups)}"' if groups else ""
        lines.append(f"{tokens[name]},{user},{user}{group_field}")
    for token, identity in (extra_tokens or {}).items():
        user, groups = identity.get("user", ""), identity.get("groups") or []
        if not user or any(ch in token + user + "".join(groups) for ch in ',"\n'):
            raise PkiError(f"spec.tokens: token for {user or '<no user>'}: a user is required, and no "
                           "token, user or group may hold a comma, quote or newline")
        lines.append(f"{token},{user},{user}" + (f',"{",".join(groups)}"' if groups else ""))
    pki = Pki(directory=directory, tokens=tokens)
    pki.token_file.write_text("\n".join(lines) + "\n")
    pki.token_file.chmod(0o600)
    return pki


def serving_cert_issue(pki: Pki, directory: Path, *, name: str, dns_names: tuple[str, ...]) -> Path:
    """A serving certificate signed by the tier's CA, as `tls.crt`/`tls.key` in `directory`
    (where controller-runtime's webhook server looks for them); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"DNS:{dns}" for dns in dns_names] + ["IP:127.0.0.1", f"IP:{INSIDE_IP}"]
    (directory / "tls.ext").write_text(f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\n"
                                       "keyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
             "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", str(pki.directory / "ca.crt"),
             "-CAkey", str(pki.directory / "ca.key"), "-CAcreateserial", "-out", "tls.crt", "-days", "3650",
             "-extfile", "tls.ext", cwd=directory)
    return directory
