"""Benchmark: the simulated cluster at 1,000 nodes / 10,000 pods and at 5x that (5,000 /
50,000): start-up, peak memory, LISTs against their serialization floor, paged LISTs
against one unpaged LIST, and kubectl's paged `get pods -A`.

    .venv/bin/python bench/simcluster_list.py [--scales 1,5] [--runs 5]

(a) Start-up: `python -m simcluster serve --scenario FILE.json --manual-clock` in a child
    process, from spawn to "serving at" (imports, JSON parse, load, first controller
    pass), and that child's peak RSS (VmHWM). Targets at 50,000 pods: < 10 s, < 1 GiB.
(b) LIST of the pods over HTTP, filtered (1) by a label selector every pod matches and
    (2) by `spec.nodeName!=<one node>` (a field filter evaluated on every pod, ~all
    returned). Floor: orjson.dumps of the same objects in this process: the library
    the server serializes with, so the ratio is what the server adds (HTTP, filtering).
    The objects are moved out of this process's collector first (gc.freeze), as the
    server does with what it loaded, so neither side pays for collections over them.
    Each LIST sample is paired with a floor sample taken right before it (freeing a
    result is outside both clocks); the floor's own rows show its growth, which on a
    machine whose cache holds the 1x list (13 MB of JSON) but not the 5x one (65 MB)
    is above 5x too.
(c) Paged LIST (limit=500, following `continue`, as kubectl pages), all pages, against
    one unpaged LIST (the floor), by a client without rate limiting on one kept-alive
    connection (as the product's client and kubectl; the note says how many
    connections a pass opened), each decoded with orjson with the client's garbage
    collector paused. Each paged sample right after its floor. Target <= 1.3.
(e) Memory of the serving process (VmRSS) once LISTs have served every pod (each
    pod's JSON kept), and after binpack's pattern of writes on 1 pod in 5 (10,000 at
    50,000 pods): a GET, then a merge patch of two cost annotations. Targets at 50,000
    pods: <= ~0.7 GiB and <= ~0.8 GiB.
(d) kubectl (Debian's, 1.32) `get pods -A` as a user runs it (chunks of 500) against
    `--chunk-size=0` (one LIST, the floor), and with `--chunk-size=5000`. kubectl itself
    limits its requests to 5 per second after a burst of 10 (client-go's default rate
    limiter; `-v=6` prints "Waited ... due to client-side throttling"), whatever the
    server: 100 pages cost it at least 18 s, against a real kube-apiserver as here.
Prints figures; not a test. Leaves nothing behind (scenario files in a temporary folder).
"""
from __future__ import annotations

import argparse
import gc
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _runs import Report, bench_arguments, paired, per_run, scales_of, timed  # noqa: E402

from simcluster.generate import generate  # noqa: E402
from simcluster.kubeconfig import ADMIN_TOKEN  # noqa: E402

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "application/json"}
BASE_NODES, BASE_PODS = 1000, 10000
KUBECTL = shutil.which("kubectl")


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


def peak_rss_mib(child: subprocess.Popen) -> float:
    for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def rss_mib(child: subprocess.Popen) -> float:
    for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status")


def annotate(url: str, pods: list[tuple[str, str]]) -> None:
    """binpack's writes: read the pod, then merge-patch its cost at the version read."""
    for at, (namespace, name) in enumerate(pods):
        path = f"{url}/api/v1/namespaces/{namespace}/pods/{name}"
        version = orjson.loads(fetch(path))["metadata"]["resourceVersion"]
        patch = orjson.dumps({"metadata": {"resourceVersion": version, "annotations": {
            "controller.kubernetes.io/pod-deletion-cost": str(at % 1000),
            "capacity.io/binpack-deletion-cost": str(at % 1000)}}})
        _send("PATCH", path, patch, {"Content-Type": "application/merge-patch+json"})


def stop(child: subprocess.Popen) -> None:
    for connection in _CONNECTIONS.values():
        connection.close()
    _CONNECTIONS.clear()
    child.terminate()
    child.wait(timeout=60)


# One kept-alive connection per server, as kubectl and the product's client read page
# after page (http.client reads a body of known length in one call). A server that
# closes the connection after a response makes http.client connect again: counted.
_CONNECTIONS: dict[str, http.client.HTTPConnection] = {}
_CONNECTS = [0]


def _send(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> bytes:
    parts = urlsplit(url)
    connection = _CONNECTIONS.get(parts.netloc)
    if connection is None:
        connection = _CONNECTIONS[parts.netloc] = http.client.HTTPConnection(parts.netloc)
    if connection.sock is None:
        _CONNECTS[0] += 1
    connection.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body,
                       headers={**HEADERS, **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{method} {url}: {response.status} {data[:200]!r}")
    return data


def fetch(url: str) -> bytes:
    return _send("GET", url)


@contextmanager
def collector_paused():
    """The client's cyclic garbage collector off while it decodes: decoding one unpaged
    LIST of 50,000 pods makes millions of containers, and the collections they set off
    walk all of them again and again (seconds), which a page of 500 never does. Both
    sides of (c) decode with it paused, as the product's snapshot does."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def unpaged(url: str) -> int:
    with collector_paused():
        return len(orjson.loads(fetch(url))["items"])


def all_pages(url: str, limit: int) -> int:
    """Every page of a paged LIST, decoded; returns the pages read."""
    token, pages = None, 0
    with collector_paused():
        while True:
            body = orjson.loads(fetch(f"{url}?limit={limit}" + (f"&continue={token}" if token else "")))
            pages += 1
            token = body["metadata"].get("continue")
            if not token:
                return pages


def kubectl(kubeconfig: Path, *args: str) -> None:
    subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "get", "pods", "-A", *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def one_scale(scale: int, runs: int, report: Report, tmp: Path) -> None:
    nodes, pods = BASE_NODES * scale, BASE_PODS * scale
    docs = generate(nodes=nodes, pods=pods)
    scenario = tmp / f"cluster-{scale}x.json"
    scenario.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": docs[1:]}))
    del docs
    kubeconfig = tmp / "kubeconfig"
    print(f"scale {scale}x: {nodes} nodes, {pods} pods", flush=True)

    startups, peaks = [], []
    for _ in range(runs):
        child, url, elapsed = start(scenario, kubeconfig)
        try:
            startups.append(elapsed)
            peaks.append(peak_rss_mib(child))
        finally:
            stop(child)
    report.add(scale, "(a) start-up", startups, note="target < 10 s at 5x")
    report.add(scale, "(a) peak RSS", peaks, unit="MiB", note="target < 1024 MiB at 5x")

    child, url, _ = start(scenario, kubeconfig)
    try:
        pods_url = f"{url}/api/v1/pods"
        some_node = json.loads(fetch(f"{pods_url}?limit=1"))["items"][0]["spec"]["nodeName"]
        cases = [("(b) LIST label selector (all pods)",
                  f"{pods_url}?labelSelector=capacity.io%2Fcomponent+in+%28model%2Cweb%29"),
                 ("(b) LIST spec.nodeName!=<one node>", f"{pods_url}?fieldSelector=spec.nodeName%21%3D{some_node}")]
        for label, case_url in cases:
            fetch(case_url)   # warm-up
            items = orjson.loads(fetch(case_url))["items"]
            gc.collect()
            gc.freeze()
            try:
                # paired: a noisy neighbour on the shared cores hits both alike
                floor, samples = paired(runs, lambda i=items: orjson.dumps(i), lambda u=case_url: fetch(u))
            finally:
                gc.unfreeze()
            report.add(scale, label, samples, floor="orjson.dumps of the same pods", floor_samples=floor,
                       note=f"{len(items)} pods; {per_run(samples, floor)}")
            report.add(scale, label.replace("(b) LIST", "(b) floor for"), floor, note="orjson.dumps")
            del items
        connects = _CONNECTS[0]
        pages = all_pages(pods_url, 500)
        connects = _CONNECTS[0] - connects
        paged, whole = [], []
        for _ in range(runs):
            whole += timed(lambda: unpaged(pods_url), 1)
            paged += timed(lambda: all_pages(pods_url, 500), 1)
        report.add(scale, "(c) paged LIST by 500, all pages", paged, floor="one unpaged LIST",
                   floor_samples=whole,
                   note=f"{pages} pages ({connects} connections opened for them), decoded; "
                        f"{per_run(paged, whole, target=1.3)}")
        report.add(scale, "(e) RSS, every pod's JSON kept", [rss_mib(child)], unit="MiB",
                   note="target <= ~717 MiB (0.7 GiB) at 5x")
        with collector_paused():
            keys = [(p["metadata"]["namespace"], p["metadata"]["name"])
                    for p in orjson.loads(fetch(pods_url))["items"]][::5]
        annotate(url, keys)
        fetch(pods_url)
        report.add(scale, f"(e) RSS after {len(keys):,} cost patches", [rss_mib(child)], unit="MiB",
                   note="then a LIST; target <= ~819 MiB (0.8 GiB) at 5x")
        if KUBECTL:
            plain = timed(lambda: kubectl(kubeconfig, "--chunk-size=0"), runs)
            report.add(scale, "(d) kubectl get pods -A (chunks of 500)", timed(lambda: kubectl(kubeconfig), runs),
                       floor="--chunk-size=0", floor_samples=plain,
                       note=f"{pages} requests; kubectl's own limiter: 5/s after 10")
            report.add(scale, "(d) kubectl get pods -A --chunk-size=5000",
                       timed(lambda: kubectl(kubeconfig, "--chunk-size=5000"), runs),
                       floor="--chunk-size=0", floor_samples=plain)
        else:
            print("  kubectl not found: (d) not measured")
    finally:
        stop(child)


def main() -> int:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args()
    report = Report("simcluster_list", runs=args.runs)
    with tempfile.TemporaryDirectory(prefix="simcluster-bench-") as tmp:
        for scale in scales_of(args):
            one_scale(scale, args.runs, report, Path(tmp))
    report.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
