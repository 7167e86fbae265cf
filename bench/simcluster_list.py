"""Benchmark: the simulated cluster with 1,000 nodes and 10,000 pods — start-up, peak
memory, and filtered pod LISTs over HTTP against their serialization floor.

    .venv/bin/python bench/simcluster_list.py [--nodes 1000] [--pods 10000] [--repeat 5]

(a) Start-up: `python -m simcluster serve --scenario FILE --manual-clock` in a child
    process, from spawn to "serving at" (imports, YAML/JSON parse, load, first
    controller pass included). Peak RSS of that child (getrusage RUSAGE_CHILDREN once it
    has exited). Targets: < 10 s, < 1 GiB.
(b) LIST of the pods over HTTP, filtered (1) by a label selector every pod matches and
    (2) by `spec.nodeName!=<one node>` (the field filter evaluated on all 10,000, ~all
    returned), best of --repeat; floor: `json.dumps` of the same objects, best of
    --repeat, in this process. Target: LIST / floor <= 3. A one-node `spec.nodeName=`
    LIST (the indexed path) is printed in milliseconds for information.
Prints figures; not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simcluster.generate import generate  # noqa: E402
from simcluster.kubeconfig import ADMIN_TOKEN  # noqa: E402

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "application/json"}


def start(scenario: Path, kubeconfig: Path) -> tuple[subprocess.Popen, str, float]:
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "simcluster", "serve", "--scenario", str(scenario),
                              "--manual-clock", "--kubeconfig-out", str(kubeconfig)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    elapsed = time.perf_counter() - began
    if "serving at" not in line:
        child.kill()
        raise SystemExit(f"the simulated cluster did not start: {line}{child.stderr.read()}")
    return child, line.split("serving at ")[1].split()[0], elapsed


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS)) as response:
        return response.read()


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    docs = generate(nodes=args.nodes, pods=args.pods)
    pods_in_scenario = sum(1 for d in docs if d.get("kind") == "Pod")
    with tempfile.TemporaryDirectory(prefix="simcluster-bench-") as tmp:
        scenario = Path(tmp) / "cluster.json"
        scenario.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs[1:]}))
        child, url, startup = start(scenario, Path(tmp) / "kubeconfig")
        try:
            pods_url = f"{url}/api/v1/pods"
            some_node = json.loads(fetch(f"{pods_url}?limit=1"))["items"][0]["spec"]["nodeName"]
            cases = [
                ("labelSelector capacity.io/component in (model,web)",
                 f"{pods_url}?labelSelector=capacity.io%2Fcomponent+in+%28model%2Cweb%29"),
                (f"fieldSelector spec.nodeName!={some_node}",
                 f"{pods_url}?fieldSelector=spec.nodeName%21%3D{some_node}"),
            ]
            print(f"scenario: {args.nodes} nodes, {pods_in_scenario} pods")
            print(f"(a) start-up: {startup:.2f} s (target < 10 s)")
            ratios = []
            for label, case_url in cases:
                fetch(case_url)   # warm-up
                list_time, body = best(lambda u=case_url: fetch(u), args.repeat)
                items = json.loads(body)["items"]
                floor, _ = best(lambda i=items: json.dumps(i), args.repeat)
                ratio = list_time / floor
                ratios.append(ratio)
                print(f"(b) LIST {label}: {len(items)} pods, {len(body) / 1e6:.1f} MB, "
                      f"{list_time * 1000:.0f} ms; json.dumps floor {floor * 1000:.0f} ms; "
                      f"ratio {ratio:.2f} (target <= 3)")
            one_node, body = best(lambda: fetch(f"{pods_url}?fieldSelector=spec.nodeName%3D{some_node}"),
                                  args.repeat)
            print(f"    LIST fieldSelector spec.nodeName={some_node}: {len(json.loads(body)['items'])} pods, "
                  f"{one_node * 1000:.1f} ms")
        finally:
            child.terminate()
            child.wait(timeout=30)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss   # KiB on Linux
    print(f"(a) peak RSS of the simulated cluster: {peak_kib / 1024:.0f} MiB (target < 1024 MiB)")
    ok = startup < 10 and peak_kib < 1024 * 1024 and all(r <= 3 for r in ratios)
    print("within targets" if ok else "OUTSIDE TARGETS")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
