"""Knative Serving 1.15 (v0.42.2) out of cluster, on the real control plane.

The controller, autoscaler, webhook and activator run as processes in the tier's network
namespace (10.0.0.1), not as pods. What a cluster install would give them is made here:
- the CRDs, roles, config maps and webhook configurations from the modules' own `config/`
  directories (serving's `config/core`, networking's and caching's CRDs), read from the
  Go module cache the build filled;
- the webhook's Service is an ExternalName for `localhost`, and each webhook
  configuration names port 8443: the apiserver dials the webhook process directly (it
  makes its own certificate and fills in the CA bundles);
- the activator's Service selects nothing; an Endpoints object points it at 10.0.0.1;
- the queue-proxy image becomes a `dev.local/` name, and the registries of the scenario's
  images skip the digest lookup (there is no registry to ask);
- `config-features` enables nodeSelector, affinity and tolerations in Knative Services,
  as a GPU platform does (Knative refuses them by default);
- there is no networking layer: `ingress_ready_loop` marks each KIngress Ready, as an
  ingress controller would once it had programmed its proxies.
Deployments and HPAs of the components themselves are not created.
"""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import yaml

from .build import KNATIVE, KNATIVE_SERVING_VERSION, go_env
from .client import Api

NAMESPACE = "knative-serving"
QUEUE_IMAGE = f"dev.local/knative/queue:{KNATIVE_SERVING_VERSION}"
WEBHOOK_PORT = 8443
INGRESS_DOMAIN = "knative-ingress.realcluster.invalid"
# Each component's Prometheus and profiling ports: the defaults (9090, 8008) would collide.
COMPONENTS = {
    "controller": {"METRICS_DOMAIN": "knative.dev/internal/serving", "METRICS_PROMETHEUS_PORT": "9091",
                   "PROFILING_PORT": "8018"},
    "webhook": {"METRICS_DOMAIN": "knative.dev/serving", "METRICS_PROMETHEUS_PORT": "9092",
                "PROFILING_PORT": "8028", "WEBHOOK_NAME": "webhook", "WEBHOOK_PORT": str(WEBHOOK_PORT)},
    "autoscaler": {"METRICS_DOMAIN": "knative.dev/serving", "METRICS_PROMETHEUS_PORT": "9093",
                   "PROFILING_PORT": "8038"},
    "activator": {"METRICS_DOMAIN": "knative.dev/internal/serving", "METRICS_PROMETHEUS_PORT": "9094",
                  "PROFILING_PORT": "8048"},
}
GPU_PODSPEC_FEATURES = ("kubernetes.podspec-nodeselector", "kubernetes.podspec-affinity",
                        "kubernetes.podspec-tolerations", "kubernetes.podspec-schedulername")
SKIPPED_KINDS = {"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                 "Certificate",   # serving's routing certificate needs a certificate controller
                 "Image"}         # the image cache needs caching's controller


def component_env(name: str, *, kubeconfig: Path, pod_ip: str) -> dict[str, str]:
    env = {"KUBECONFIG": str(kubeconfig), "SYSTEM_NAMESPACE": NAMESPACE, "POD_NAME": name, "POD_IP": pod_ip,
           "CONFIG_LOGGING_NAME": "config-logging", "CONFIG_OBSERVABILITY_NAME": "config-observability"}
    env.update(COMPONENTS[name])
    return env


def _module_dir(path: str) -> Path:
    """The module cache directory of `path` at the version the knative go.mod requires."""
    text = (KNATIVE.dir / "go.mod").read_text()
    match = re.search(rf"^(?:require)?\s*{re.escape(path)} (v\S+)", text, re.M)
    if not match:
        raise FileNotFoundError(f"{path} is not in {KNATIVE.dir / 'go.mod'}")
    return Path(go_env()["GOMODCACHE"]) / f"{path}@{match.group(1)}"


SERVED_KINDS = (("serving.knative.dev/v1", "Service"), ("serving.knative.dev/v1", "Revision"),
                ("autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler"),
                ("networking.internal.knative.dev/v1alpha1", "Ingress"),
                ("networking.internal.knative.dev/v1alpha1", "ServerlessService"))


def _registry(image: str) -> str:
    # As go-containerregistry names it: the first path part when it looks like a host.
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "index.docker.io"


def scenario_registries(objects) -> set[str]:
    """Registries of the images a scenario's Knative Services run: the controller is told
    to skip their digest lookup (there is no registry to ask here)."""
    found = set()
    for _where, doc in objects:
        if doc.get("apiVersion", "").startswith("serving.knative.dev/") and doc.get("kind") == "Service":
            spec = (((doc.get("spec") or {}).get("template") or {}).get("spec") or {})
            for container in spec.get("containers") or []:
                if isinstance(container.get("image"), str):
                    found.add(_registry(container["image"]))
    return found


def manifests(inside_ip: str, *, extra_registries: set[str] = frozenset()) -> list[dict]:
    serving = _module_dir("knative.dev/serving") / "config" / "core"
    files = [serving / "100-namespace.yaml", *sorted((serving / "200-roles").glob("*.yaml")),
             serving / "200-serviceaccount.yaml", *sorted((serving / "300-resources").glob("*.yaml")),
             *sorted((_module_dir("knative.dev/networking") / "config").glob("*.yaml")),
             *sorted((_module_dir("knative.dev/caching") / "config").glob("*.yaml")),
             *sorted((serving / "configmaps").glob("*.yaml")),
             *sorted((serving / "deployments").glob("*.yaml")),   # their Services
             *sorted((serving / "webhooks").glob("*.yaml"))]
    docs = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") in SKIPPED_KINDS:
                continue
            docs.append(_adapt(doc, inside_ip, extra_registries))
    docs.append({"apiVersion": "v1", "kind": "Endpoints",
                 "metadata": {"name": "activator-service", "namespace": NAMESPACE},
                 "subsets": [{"addresses": [{"ip": inside_ip}],
                              "ports": [{"name": "http", "port": 8012}, {"name": "http2", "port": 8013},
                                        {"name": "http-metrics", "port": 9094},
                                        {"name": "http-profiling", "port": 8048},
                                        {"name": "https", "port": 8112}]}]})
    return docs


def _adapt(doc: dict, inside_ip: str, extra_registries: set[str]) -> dict:
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name")
    if kind == "ConfigMap" and name == "config-deployment":
        doc["data"]["queue-sidecar-image"] = QUEUE_IMAGE
        skipped = {"kind.local", "ko.local", "dev.local", *extra_registries}
        doc["data"]["registries-skipping-tag-resolving"] = ",".join(sorted(skipped))
    if kind == "ConfigMap" and name == "config-features":
        # GPU models pick their nodes: Knative refuses these PodSpec fields unless enabled
        # (its default), and a GPU platform enables them. simcluster does not check them.
        doc.setdefault("data", {}).update({flag: "enabled" for flag in GPU_PODSPEC_FEATURES})
    if kind == "Service" and name == "webhook":
        doc["spec"] = {"type": "ExternalName", "externalName": "localhost",
                       "ports": [{"name": "https-webhook", "port": WEBHOOK_PORT}]}
    if kind == "Service" and name == "activator-service":
        doc["spec"].pop("selector", None)   # the Endpoints below, not pods, back it
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in doc.get("webhooks") or []:
            hook["clientConfig"]["service"]["port"] = WEBHOOK_PORT
    return doc


def ingress_status(ingress: dict) -> dict:
    generation = ingress["metadata"].get("generation", 1)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    balancer = {"ingress": [{"domainInternal": INGRESS_DOMAIN}]}
    return {"observedGeneration": generation,
            "conditions": [{"type": kind, "status": "True", "lastTransitionTime": now}
                           for kind in ("LoadBalancerReady", "NetworkConfigured", "Ready")],
            "publicLoadBalancer": balancer, "privateLoadBalancer": balancer}


def _ready_for(ingress: dict) -> bool:
    status = ingress.get("status") or {}
    return status.get("observedGeneration") == ingress["metadata"].get("generation") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def ingress_ready_loop(api: Api, stop: threading.Event, *, interval: float = 0.2) -> None:
    path = "/apis/networking.internal.knative.dev/v1alpha1/ingresses"
    while not stop.wait(interval):
        try:
            listing = api.request("GET", path)
        except OSError:
            continue
        for ingress in (listing.body or {}).get("items", []) if isinstance(listing.body, dict) else []:
            if _ready_for(ingress):
                continue
            meta = ingress["metadata"]
            api.request("PATCH", f"/apis/networking.internal.knative.dev/v1alpha1/namespaces/"
                                 f"{meta['namespace']}/ingresses/{meta['name']}/status",
                        {"status": ingress_status(ingress)}, content_type="application/merge-patch+json")


def webhook_configured(api: Api) -> bool:
    """The webhook has written its CA bundle into every webhook configuration."""
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        listing = api.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")
        for config in (listing.body or {}).get("items", []):
            if not config["metadata"]["name"].endswith("knative.dev"):
                continue
            if not all(hook["clientConfig"].get("caBundle") for hook in config.get("webhooks") or []):
                return False
    return True


def autoscaler_leading(api: Api) -> bool:
    """The autoscaler holds its bucket's lease (it reconciles PodAutoscalers only then)."""
    lease = api.request("GET", "/apis/coordination.k8s.io/v1/namespaces/knative-serving/leases/"
                               "autoscaler-bucket-00-of-01")
    return lease.status == 200 and bool((lease.body.get("spec") or {}).get("holderIdentity"))


def describe(doc: dict) -> str:
    return json.dumps([doc.get("kind"), (doc.get("metadata") or {}).get("name")])
