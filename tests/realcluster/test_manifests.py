"""deploy/ on a real kube-apiserver, as an operator installs it (deploy/README.md).

`kubectl kustomize deploy/` renders the manifests; the namespace is created for real (a
dry run of it would leave the namespaced objects without one) and every object is then
applied with `kubectl apply --server-side --dry-run=server`. The apiserver runs each
through what a real apply meets short of storing it: schema validation and defaulting,
the RBAC escalation check on the ClusterRole, and PodSecurity admission, which in a
namespace enforcing `restricted` answers a Deployment whose pods it would refuse with a
warning (pkg/admission/plugin/podsecurity: controllers are warned, their pods refused).
kubectl prints such warnings on stderr, so a clean install is exit 0 and nothing there.
"""
from __future__ import annotations

import copy

import yaml

from .identity import DEPLOY, deploy_documents, kubectl

PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


def rendered(backend, tmp_path) -> list[dict]:
    result = kubectl(backend, "kustomize", str(DEPLOY), cache_dir=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def dry_run(backend, tmp_path, docs: list[dict]):
    return kubectl(backend, "apply", "--server-side", "--dry-run=server", "-f", "-",
                   stdin=yaml.safe_dump_all(docs, sort_keys=False), cache_dir=tmp_path)


def namespace_create(backend, tmp_path, docs: list[dict]) -> str:
    [namespace] = [d for d in docs if d["kind"] == "Namespace"]
    created = kubectl(backend, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(namespace),
                      cache_dir=tmp_path)
    assert created.returncode == 0 and created.stderr == "", created.stderr
    return namespace["metadata"]["name"]


def test_every_deploy_object_is_accepted_in_a_restricted_namespace_without_a_warning(real_tier, tmp_path):
    docs = rendered(real_tier, tmp_path)
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    expected = {(d["kind"].lower(), d["metadata"]["name"]) for d in deploy_documents(*(DEPLOY / f for f in listed))}
    assert {(d["kind"].lower(), d["metadata"]["name"]) for d in docs} == expected
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] not in (
        "Namespace", "ClusterRole", "ClusterRoleBinding")} == {"gpu-capacity"}

    namespace = namespace_create(real_tier, tmp_path, docs)
    assert real_tier.core.read_namespace(namespace).metadata.labels[PSS_ENFORCE] == "restricted"
    result = dry_run(real_tier, tmp_path, docs)

    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"the apiserver warned:\n{result.stderr}"
    # One line per object: `<kind>[.<group>]/<name> serverside-applied (server dry run)`.
    accepted = set()
    for line in result.stdout.splitlines():
        reference, _, outcome = line.partition(" ")
        assert outcome == "serverside-applied (server dry run)", line
        kind, _, name = reference.partition("/")
        accepted.add((kind.split(".")[0], name))
    assert accepted == expected


def test_a_deployment_whose_pods_break_the_restricted_standard_is_warned_about(real_tier, tmp_path):
    """The warning the test above finds absent: PodSecurity admission is on in the
    namespace and kubectl reports what it says."""
    docs = rendered(real_tier, tmp_path)
    namespace_create(real_tier, tmp_path, docs)
    [web] = [copy.deepcopy(d) for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-capacity-web"]
    web["metadata"]["name"] = "gpu-capacity-web-as-root"
    pod = web["spec"]["template"]["spec"]
    del pod["securityContext"]
    for container in pod["containers"] + pod["initContainers"]:
        del container["securityContext"]

    result = dry_run(real_tier, tmp_path, [web])

    assert result.returncode == 0, result.stderr
    assert 'would violate PodSecurity "restricted:latest"' in result.stderr, result.stderr
    assert "allowPrivilegeEscalation != false" in result.stderr and "runAsNonRoot != true" in result.stderr
