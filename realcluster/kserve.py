"""KServe v0.14.1 on the real control plane: its CRDs, and its controller out of cluster.

v0.14.1 is the KServe written against Knative Serving v0.42.2, the Knative this tier
runs. Everything comes from the module `github.com/kserve/kserve` at that version, read
from the Go module cache the build filled:
- the CRDs from `config/crd/full` (with their OpenAPI schemas, so the apiserver
  validates an InferenceService as a cluster with KServe installed does);
- `config/configmap/inferenceservice.yaml` (the controller's configuration), with
  `disableIstioVirtualHost` on: there is no Istio, and the controller otherwise waits for
  a VirtualService that nothing would program;
- the webhook configurations of `config/webhook/manifests.yaml`, pointed at the
  controller process through an ExternalName Service (as for Knative's webhook), with a
  serving certificate signed by the tier's CA;
- the manager's ClusterRole from `config/rbac/role.yaml`, bound to the identity it runs
  as (`system:serviceaccount:kserve:kserve-controller-manager`).
The controller (`cmd/manager`) runs as a process in the tier's network namespace, with
its metrics and probe ports moved off :8080/:8081 (Knative's controller binds :8080).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .build import KSERVE, KSERVE_VERSION, go_env
from .client import Api

NAMESPACE = "kserve"
WEBHOOK_SERVICE = "kserve-webhook-server-service"
WEBHOOK_PORT = 9443
METRICS_ADDR = "127.0.0.1:8095"
PROBE_ADDR = "127.0.0.1:8096"
SERVICE_ACCOUNT = "kserve-controller-manager"
WEBHOOK_DNS = (f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc", f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local",
               "localhost")
SERVED_KINDS = (("serving.kserve.io/v1beta1", "InferenceService"),)
# The CRDs an InferenceService needs; LocalModel* (node-local model caches) and
# InferenceGraph/TrainedModel are installed too, as a release installs them all.
CRD_DIR = Path("config") / "crd" / "full"


def module_dir() -> Path:
    """The module cache directory of github.com/kserve/kserve at the pinned version."""
    text = (KSERVE.dir / "go.mod").read_text()
    match = re.search(r"^(?:require)?\s*github\.com/kserve/kserve (v\S+)", text, re.M)
    if not match:
        raise FileNotFoundError(f"github.com/kserve/kserve is not in {KSERVE.dir / 'go.mod'}")
    return Path(go_env()["GOMODCACHE"]) / f"github.com/kserve/kserve@{match.group(1)}"


def crds() -> list[dict]:
    root = module_dir() / CRD_DIR
    docs = []
    for path in sorted(root.glob("serving.kserve.io_*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                doc.get("metadata", {}).pop("creationTimestamp", None)
                docs.append(doc)
    if not docs:
        raise FileNotFoundError(f"no KServe CRDs in {root}; run `python -m realcluster build --with kserve`")
    return docs


def _controller_config() -> dict:
    doc = yaml.safe_load((module_dir() / "config" / "configmap" / "inferenceservice.yaml").read_text())
    data = doc["data"]
    ingress = json.loads(data["ingress"])
    # No Istio: the controller would otherwise wait for a VirtualService.
    ingress["disableIstioVirtualHost"] = True
    data["ingress"] = json.dumps(ingress)
    deploy = json.loads(data["deploy"])
    deploy["defaultDeploymentMode"] = "Serverless"
    data["deploy"] = json.dumps(deploy)
    doc["metadata"] = {"name": doc["metadata"]["name"], "namespace": NAMESPACE}
    return doc


def _webhooks(ca_bundle: str) -> list[dict]:
    docs = []
    text = (module_dir() / "config" / "webhook" / "manifests.yaml").read_text()
    for doc in yaml.safe_load_all(text):
        if not doc or doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc["metadata"] = {"name": doc["metadata"]["name"]}
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"]["service"]
            service.update({"name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "port": WEBHOOK_PORT})
            hook["clientConfig"]["caBundle"] = ca_bundle
        docs.append(doc)
    return docs


def _rbac() -> list[dict]:
    role = yaml.safe_load((module_dir() / "config" / "rbac" / "role.yaml").read_text())
    role["metadata"] = {"name": "kserve-manager-role"}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "kserve-manager-rolebinding"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "kserve-manager-role"},
               "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]}
    # Leader election and its own Events, as config/rbac's leader_election_role grants.
    lease_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": "kserve-leader-election-role", "namespace": NAMESPACE},
                  "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]}
    lease_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": "kserve-leader-election-rolebinding", "namespace": NAMESPACE},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "kserve-leader-election-role"},
                     "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]}
    return [role, binding, lease_role, lease_binding]


def manifests(*, ca_bundle: str | None) -> list[dict]:
    """What the apiserver needs: the CRDs always; with `ca_bundle` (the controller runs)
    also its namespace, configuration, RBAC, webhook Service and webhook configurations."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, *crds()]
    if ca_bundle is None:
        return docs
    docs += [_controller_config(), *_rbac(),
             {"apiVersion": "v1", "kind": "Service", "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
              "spec": {"type": "ExternalName", "externalName": "localhost",
                       "ports": [{"name": "https", "port": WEBHOOK_PORT}]}},
             *_webhooks(ca_bundle)]
    return docs


def controller_argv(binary: Path) -> list[str]:
    return [str(binary), f"--metrics-addr={METRICS_ADDR}", f"--health-probe-addr={PROBE_ADDR}",
            f"--webhook-port={WEBHOOK_PORT}"]


def controller_env(*, kubeconfig: Path, tmp_dir: Path) -> dict[str, str]:
    # controller-runtime looks for the webhook's tls.crt/tls.key under $TMPDIR/k8s-webhook-server/serving-certs.
    return {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE, "TMPDIR": str(tmp_dir)}


def webhook_cert_dir(tmp_dir: Path) -> Path:
    return tmp_dir / "k8s-webhook-server" / "serving-certs"


def controller_ready(api: Api) -> bool:
    return Api(f"http://{PROBE_ADDR}").answers("/readyz")


def describe(doc: dict) -> str:
    return json.dumps([doc.get("kind"), (doc.get("metadata") or {}).get("name")])


__all__ = ["KSERVE_VERSION", "manifests", "controller_argv", "controller_env", "webhook_cert_dir", "SERVED_KINDS"]
