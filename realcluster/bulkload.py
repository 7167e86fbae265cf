"""Loading a cluster-sized List (thousands of nodes, tens of thousands of pods) into the real
control plane quickly: many creates in flight at once, instead of scenario.py's one at a time.

    python -m realcluster.bulkload --kubeconfig K [--server URL] --docs LIST.json [--concurrency 48]

Objects go in as `scenario.manifest_for_real` makes them (KWOK nodes, server-set metadata
dropped), in dependency order: CRDs (until served), namespaces, nodes, then — once the
controller-manager has made each namespace's `default` ServiceAccount, which pod admission
needs — ReplicaSets, then pods. Pods come already bound (`spec.nodeName` as the List has it),
so the scheduler is not involved, and owned: each pod's ownerReference names its ReplicaSet
by the uid the apiserver gave it. Run the tier with the ReplicaSet controller off
(`up --controllers '*,-replicaset-controller'`), or it creates each ReplicaSet's pods itself
before the List's arrive and then deletes the surplus.

A create answered 409 (already there) counts as done, so a load can be rerun; 429 and 5xx
are retried. Prints one JSON line: objects created per kind, kinds skipped (not served) and
seconds per phase. Runs where the apiserver is reachable (inside the tier's network
namespace with `--server https://10.0.0.1:6443`, or through the host relay).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import yaml

from .client import Api
from .scenario import manifest_for_real

RETRIED = {429, 500, 502, 503, 504}
ATTEMPTS = 12
SERVED_TIMEOUT_SECONDS = 60.0
SERVICE_ACCOUNT_TIMEOUT_SECONDS = 120.0


class BulkLoadError(RuntimeError):
    pass


def _connection(kubeconfig: Path, server: str | None) -> tuple[str, str, ssl.SSLContext]:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    token = config["users"][0]["user"]["token"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return (server or cluster["server"]).rstrip("/"), token, context


class Loader:
    def __init__(self, server: str, token: str, context: ssl.SSLContext, concurrency: int):
        self.server, self.token, self.context, self.concurrency = server, token, context, concurrency
        self.api = Api(server, token=token)
        self.api.context = context
        self.created: Counter = Counter()
        self.existing: Counter = Counter()
        self.retries = 0

    def path(self, doc: dict) -> str | None:
        api_version, kind = doc["apiVersion"], doc["kind"]
        if (api_version, kind) not in self.api.resources():
            return None
        namespace = doc["metadata"].get("namespace") if self.api.namespaced(api_version, kind) else None
        return self.api.collection_path(api_version, kind, namespace)

    async def _create(self, session, path: str, doc: dict, *, want_body: bool):
        body = orjson.dumps(doc)
        for attempt in range(ATTEMPTS):
            async with session.post(self.server + path, data=body) as answer:
                raw = await answer.read()
                if answer.status in (200, 201):
                    self.created[doc["kind"]] += 1
                    return orjson.loads(raw) if want_body else None
                if answer.status == 409:
                    self.existing[doc["kind"]] += 1
                    if not want_body:
                        return None
                    async with session.get(f"{self.server}{path}/{doc['metadata']['name']}") as got:
                        return orjson.loads(await got.read())
                retry = answer.status in RETRIED or (
                    answer.status == 403 and b"serviceaccount" in raw)   # its namespace's is not made yet
                if not retry or attempt == ATTEMPTS - 1:
                    meta = doc["metadata"]
                    raise BulkLoadError(f"{doc['kind']} {meta.get('namespace', '')}/{meta['name']}: the apiserver "
                                        f"answered {answer.status}: {raw[:300].decode(errors='replace')}")
            self.retries += 1
            await asyncio.sleep(min(5.0, 0.2 * 2 ** attempt))
        return None

    async def create_all(self, jobs: list[tuple[str, dict]], *, want_body: bool = False) -> list:
        import aiohttp

        results: list = [None] * len(jobs)
        cursor = iter(range(len(jobs)))
        connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=self.context)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
            async def work():
                for i in cursor:
                    results[i] = await self._create(session, jobs[i][0], jobs[i][1], want_body=want_body)

            await asyncio.gather(*(work() for _ in range(self.concurrency)))
        return results

    def run(self, jobs: list[tuple[str, dict]], **kw) -> list:
        return asyncio.run(self.create_all(jobs, **kw))

    def wait_served(self, docs: list[dict]) -> None:
        deadline = time.monotonic() + SERVED_TIMEOUT_SECONDS
        while not all(self.path(d) for d in docs):
            if time.monotonic() > deadline:
                missing = sorted({f"{d['apiVersion']} {d['kind']}" for d in docs if not self.path(d)})
                raise BulkLoadError(f"not served within {SERVED_TIMEOUT_SECONDS:.0f} s: {', '.join(missing)}")
            time.sleep(0.5)
            self.api.resources(refresh=True)

    def wait_service_accounts(self, namespaces: set[str]) -> None:
        deadline = time.monotonic() + SERVICE_ACCOUNT_TIMEOUT_SECONDS
        while True:
            listing = self.api.request("GET", "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault").body
            have = {sa["metadata"]["namespace"] for sa in (listing or {}).get("items", [])}
            if namespaces <= have:
                return
            if time.monotonic() > deadline:
                raise BulkLoadError(f"{len(namespaces - have)} namespaces had no default ServiceAccount within "
                                    f"{SERVICE_ACCOUNT_TIMEOUT_SECONDS:.0f} s (is the controller-manager running?)")
            time.sleep(0.5)


def load(loader: Loader, docs: list[dict], *, log=lambda message: None) -> dict:
    phases: dict[str, float] = {}
    skipped: Counter = Counter()
    owner_of: list[tuple[str, str] | None] = []
    prepared = []
    for doc in docs:
        refs = (doc.get("metadata") or {}).get("ownerReferences") or []
        owner = next((r["name"] for r in refs if r.get("kind") == "ReplicaSet" and r.get("controller")), None)
        prepared.append(manifest_for_real(doc))
        owner_of.append(owner)

    def jobs_of(kinds: set[str] | None, exclude: set[str] = frozenset()) -> list[tuple[str, dict, int]]:
        out = []
        for i, doc in enumerate(prepared):
            kind = doc.get("kind")
            if (kinds is None and kind not in exclude) or (kinds is not None and kind in kinds):
                path = loader.path(doc)
                if path is None:
                    skipped[f"{doc.get('apiVersion')} {kind}"] += 1
                    continue
                out.append((path, doc, i))
        return out

    def phase(name: str, jobs, **kw):
        began = time.monotonic()
        result = loader.run([(p, d) for p, d, _ in jobs], **kw)
        phases[name] = round(time.monotonic() - began, 2)
        log(f"{name}: {len(jobs)} in {phases[name]:.1f} s")
        return result

    crds = [d for d in prepared if d.get("kind") == "CustomResourceDefinition"]
    phase("crds", jobs_of({"CustomResourceDefinition"}))
    if crds:
        began = time.monotonic()
        loader.wait_served([{"apiVersion": f"{c['spec']['group']}/{v['name']}", "kind": c["spec"]["names"]["kind"],
                             "metadata": {"namespace": "default"}}
                            for c in crds for v in c["spec"]["versions"] if v.get("served", True)])
        phases["crds served"] = round(time.monotonic() - began, 2)
    namespaces = {d["metadata"].get("namespace") for d in prepared if d.get("metadata", {}).get("namespace")}
    declared = {d["metadata"]["name"] for d in prepared if d.get("kind") == "Namespace"}
    for name in sorted(namespaces - declared - {"default", "kube-system", "kube-public", "kube-node-lease"}):
        prepared.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        owner_of.append(None)
    phase("namespaces", jobs_of({"Namespace"}))
    phase("nodes", jobs_of({"Node"}))
    began = time.monotonic()
    loader.wait_service_accounts(namespaces)
    phases["service accounts"] = round(time.monotonic() - began, 2)
    rs_jobs = jobs_of({"ReplicaSet"})
    made = phase("replicasets", rs_jobs, want_body=True)
    uids = {(body["metadata"]["namespace"], body["metadata"]["name"]): body["metadata"]["uid"] for body in made}
    pod_jobs = jobs_of({"Pod"})
    for _, doc, i in pod_jobs:
        uid = uids.get((doc["metadata"].get("namespace"), owner_of[i])) if owner_of[i] else None
        if uid:
            doc["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner_of[i],
                                                   "uid": uid, "controller": True, "blockOwnerDeletion": True}]
    phase("pods", pod_jobs)
    loader.api.resources(refresh=True)
    phase("others", jobs_of(None, exclude={"CustomResourceDefinition", "Namespace", "Node", "ReplicaSet", "Pod"}))
    return {"created": dict(loader.created), "existing": dict(loader.existing), "skipped": dict(skipped),
            "retries": loader.retries, "seconds": phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realcluster.bulkload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="the kubeconfig `up --kubeconfig-out` wrote")
    parser.add_argument("--server", help="the apiserver's URL if not the kubeconfig's (inside the tier's "
                                         "namespace: https://10.0.0.1:6443)")
    parser.add_argument("--docs", required=True, help="a JSON List (kind: List, items: [...]) to create")
    parser.add_argument("--concurrency", type=int, default=48, help="creates in flight (default 48)")
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 512:
        parser.error("--concurrency must be 1..512")
    try:
        docs = orjson.loads(Path(args.docs).read_bytes())
        items = docs["items"] if isinstance(docs, dict) else None
        if not isinstance(items, list):
            raise ValueError("not a List: no items")
    except (OSError, ValueError, KeyError) as exc:
        print(f"realcluster bulkload: {args.docs}: {exc}", file=sys.stderr)
        return 2
    began = time.monotonic()
    try:
        server, token, context = _connection(Path(args.kubeconfig), args.server)
        loader = Loader(server, token, context, args.concurrency)
        summary = load(loader, items, log=lambda m: print(f"realcluster bulkload: {m}", file=sys.stderr, flush=True))
    except (BulkLoadError, OSError, KeyError) as exc:
        print(f"realcluster bulkload: {exc}", file=sys.stderr)
        return 1
    summary["total_s"] = round(time.monotonic() - began, 2)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
