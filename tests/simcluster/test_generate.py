"""The large-cluster scenario generator."""
from __future__ import annotations

import io
import json
from collections import defaultdict

import pytest
import yaml

from simcluster.generate import dump, generate, main


def documents(nodes=20, pods=200, **kw) -> list[dict]:
    return generate(nodes=nodes, pods=pods, seed=3, **kw)


def test_every_pod_is_bound_running_and_owned_by_a_replicaset_in_the_file():
    docs = documents()
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 200
    replicasets = {d["metadata"]["uid"]: d for d in docs if d["kind"] == "ReplicaSet"}
    nodes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Node"}
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert len(nodes) == 20
    per_rs = defaultdict(int)
    for pod in pods:
        owner = pod["metadata"]["ownerReferences"][0]
        rs = replicasets[owner["uid"]]
        assert owner["name"] == rs["metadata"]["name"] and owner["controller"] is True
        assert rs["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["nodeName"] in nodes
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["namespace"] in namespaces
        per_rs[owner["uid"]] += 1
    assert all(rs["spec"]["replicas"] == per_rs[uid] for uid, rs in replicasets.items())


def test_gpu_indices_never_overlap_and_stay_within_the_node():
    docs = documents(nodes=10, pods=300, gpu_fraction=1.0)
    capacity = {d["metadata"]["name"]: int(d["status"]["capacity"].get("nvidia.com/gpu", 0))
                for d in docs if d["kind"] == "Node"}
    used = defaultdict(set)
    for pod in (d for d in docs if d["kind"] == "Pod"):
        text = (pod["metadata"].get("annotations") or {}).get("simcluster.io/gpu-indices")
        if not text:
            continue
        indices = {int(i) for i in text.split(",")}
        wanted = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert len(indices) == wanted
        node = pod["spec"]["nodeName"]
        assert not used[node] & indices
        assert max(indices) < capacity[node]
        used[node] |= indices


def test_same_seed_same_cluster():
    assert documents() == documents()


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "0"], "--nodes"),
    (["--gpu-fraction", "1.5"], "--gpu-fraction"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_cli_writes_yaml_and_json_that_parse_to_the_same_objects(tmp_path):
    assert main(["--nodes", "5", "--pods", "40", "--seed", "1", "--out", str(tmp_path / "c.yaml")]) == 0
    assert main(["--nodes", "5", "--pods", "40", "--seed", "1", "--out", str(tmp_path / "c.json")]) == 0
    from_yaml = [d for d in yaml.safe_load_all((tmp_path / "c.yaml").read_text()) if d["kind"] != "Simulation"]
    listed = json.loads((tmp_path / "c.json").read_text())
    assert listed["kind"] == "List"
    assert listed["items"] == from_yaml


def test_dump_to_a_stream():
    out = io.StringIO()
    dump(documents(nodes=2, pods=3), out)
    assert "kind: Pod" in out.getvalue()


def test_smaller_gpu_pods_keep_filling_the_pools_after_whole_node_pods_no_longer_fit():
    docs = generate(nodes=50, pods=2000, seed=1)
    capacity = sum(int(d["status"]["capacity"].get("nvidia.com/gpu", 0)) for d in docs if d["kind"] == "Node")
    used = sum(int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
               for d in docs if d["kind"] == "Pod" for c in d["spec"]["containers"])
    sizes = {int(d["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))
             for d in docs if d["kind"] == "Pod"}
    assert {1, 2, 8} <= sizes
    assert used >= 0.95 * capacity, (used, capacity)   # the GPU pools end up (nearly) full
