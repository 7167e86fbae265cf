"""`kubectl get` reads the server's Table: the columns kube-apiserver prints for events,
pods, nodes, Deployments and PDBs (pkg/printers/internalversion/printers.go)."""
from __future__ import annotations

NS = "team-a"


def table(kube, *args: str) -> tuple[list[str], list[str]]:
    lines = kube.kubectl("get", *args).stdout.splitlines()
    return lines[0], lines[1:]


def test_get_events_shows_last_seen_type_reason_object_and_message(kube):
    # An Event as the defrag job writes it about the node it cordons.
    kube.core.create_namespaced_event(NS, {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "gpu-2.defrag", "namespace": NS},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "gpu-2"},
        "reason": "DefragCordon", "message": "Cordoned gpu-2 for defrag job 7 (2 pods to move)  ",
        "type": "Normal", "source": {"component": "gpu-capacity"}, "reportingComponent": "gpu-capacity",
        "firstTimestamp": kube.control.clock(), "lastTimestamp": kube.control.clock(), "count": 1})
    kube.control.advance(150)
    header, rows = table(kube, "events", "-n", NS, "--field-selector", "reason=DefragCordon")
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    [row] = rows
    assert row.split()[:4] == ["2m30s", "Normal", "DefragCordon", "node/gpu-2"]
    assert row.endswith("Cordoned gpu-2 for defrag job 7 (2 pods to move)")

    header, [row] = table(kube, "events", "-n", NS, "-o", "wide", "--field-selector", "reason=DefragCordon")
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE",
                              "FIRST", "SEEN", "COUNT", "NAME"]
    assert "gpu-capacity" in row and row.split()[-2:] == ["1", "gpu-2.defrag"]


def test_get_pods_shows_a_crash_looping_container_and_its_restarts(kube):
    kube.core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm"},
                                         "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}})
    kube.control.advance(30)
    kube.core.patch_namespaced_pod_status("llm", NS, {"status": {"containerStatuses": [
        {"name": "main", "image": "vllm:1", "imageID": "", "ready": False, "restartCount": 4,
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}})
    header, [row] = table(kube, "pods", "-n", NS)
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split() == ["llm", "0/1", "CrashLoopBackOff", "4", "30s"]


def test_get_nodes_shows_status_roles_age_and_version(kube):
    kube.core.patch_node("gpu-1", {"metadata": {"labels": {"node-role.kubernetes.io/gpu-worker": ""}},
                                   "spec": {"unschedulable": True}})
    header, rows = table(kube, "nodes")
    assert header.split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    gpu1 = rows[0].split()
    assert gpu1[:3] == ["gpu-1", "Ready,SchedulingDisabled", "gpu-worker"]
    assert rows[1].split()[:3] == ["gpu-2", "Ready", "<none>"]


def test_get_deployments_and_pdbs_show_their_replica_columns(kube):
    kube.apps.create_namespaced_deployment(NS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}}}})
    kube.policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    kube.control.advance(30)
    header, [row] = table(kube, "deployments", "-n", NS, "-o", "wide")
    assert header.split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert row.split() == ["web", "2/2", "2", "2", "30s", "main", "vllm:1", "app=web"]
    header, [row] = table(kube, "pdb", "-n", NS)
    assert header.split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert row.split() == ["web", "1", "N/A", "1", "30s"]
