"""Benchmark: the cluster dashboard and the GPU map at 1,000 nodes / 10,000 pods and at 5x
that (5,000 / 50,000), and the snapshot they are drawn from.

    .venv/bin/python bench/dashboard_render.py [--scales 1,5] [--runs 5] [--pages] [--redis-url URL]

The simulated cluster (`simcluster.generate`) runs in its own process, as an API server
does. Per scale, min/median/max over --runs:
- floor: the same LIST calls the pages make (nodes and pods, paged by SNAPSHOT_PAGE_SIZE,
  following `continue`), over one keep-alive urllib3 pool, decoded as the snapshot decodes
  them (msgspec, into just the fields its views read) and nothing more, with Python's cyclic
  collector paused as the product pauses it: the least any view of the cluster must do with
  the libraries the product uses;
- dashboard and GPU map (first page), "read": the cluster read for the page (the kept
  reading dropped first: what the first viewer after CAPACITY_MAP_CACHE_SECONDS waits);
- dashboard and GPU map, "kept": served from the reading kept for
  CAPACITY_MAP_CACHE_SECONDS (what everyone else, and the page's own reload, gets; the
  dashboard keeps its totals apart from the map's rows);
- with --redis-url (a cache shared with the workers, as in production): dashboard and GPU
  map, "older reading": the kept reading just past CAPACITY_MAP_CACHE_SECONDS, served while
  the page queues its background refresh (the product's clock moved ahead; the refresh
  message goes to an in-process broker and is never run, so each run queues one);
- snapshot_take alone (same floor), and its memory at this scale (tracemalloc, a run of
  its own: the peak while it runs, and what the snapshot keeps).
Each run measures the floor and the page back to back, so the per-run ratios are printed
too (target: every one <= 2).

--pages: snapshot_take per page size (500 ... 10,000 and unpaged): time and peak memory,
how SNAPSHOT_PAGE_SIZE was chosen.

The web requests go through Django's test client in this process (the middleware, the
permission check, the templates), on a throw-away SQLite database, with the templates
rendered as in production (not instrumented for tests: that copies every template's context
onto the response and keeps the page's objects alive after it); Django's cache is the
settings' (local memory), or Redis at --redis-url (only this bench's keys are written, and
dropped at the end). Prints figures; not a test. Leaves nothing behind (a temporary folder
holds the scenario, the kubeconfig and the database).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import subprocess
import sys
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

import _django

_redis = sys.argv[sys.argv.index("--redis-url") + 1] if "--redis-url" in sys.argv[:-1] else None
_folder = _django.setup("dashboard-bench", env={"REDIS_URL": _redis} if _redis else None)

import orjson  # noqa: E402
import urllib3  # noqa: E402
from _runs import Report, bench_arguments, paired, per_run, raw_lists, scales_of  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402

from clusters import kube  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.selectors import SNAPSHOT_PAGE_SIZE, snapshot_take  # noqa: E402
from capacity.gpumap.selectors import read_shared, readings_forget, refresh_forget  # noqa: E402
from config import clock  # noqa: E402
from config.celery import app as celery_app  # noqa: E402
from simcluster.generate import generate  # noqa: E402
from simcluster.kubeconfig import ADMIN_TOKEN  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE_NODES, BASE_PODS = 1000, 10000
PAGE_SIZES = (500, 1000, 2000, 5000, 10000, None)
ahead = [0]   # seconds the product's clock runs ahead of the real one (older_prepare)


@contextlib.contextmanager
def served(scale: int, workdir: Path):
    """The generated cluster in a child `python -m simcluster serve`; yields (url, kubeconfig)."""
    scenario, kubeconfig = workdir / f"scenario-{scale}x.json", workdir / f"kubeconfig-{scale}x"
    scenario.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List",
                                       "items": [d for d in generate(nodes=BASE_NODES * scale,
                                                                     pods=BASE_PODS * scale)
                                                 if d["kind"] != "Simulation"]}))   # not a Kubernetes object
    child = subprocess.Popen([sys.executable, "-m", "simcluster", "serve", "--scenario", str(scenario),
                              "--manual-clock", "--kubeconfig-out", str(kubeconfig)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if "serving at" not in line:
            raise SystemExit(f"the simulated cluster did not start: {line}{child.stderr.read()}")
        while not kubeconfig.exists():
            time.sleep(0.05)
        yield line.split("serving at ")[1].split()[0], kubeconfig
    finally:
        child.terminate()
        child.wait(timeout=60)
        scenario.unlink(missing_ok=True)


def floor_lists(pool: urllib3.PoolManager, url: str, page_size: int | None) -> int:
    """The floor: the pages' LIST calls, decoded as the snapshot decodes them; returns the
    objects read."""
    return raw_lists(pool, url, ("/api/v1/nodes", "/api/v1/pods"), page_size=page_size,
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def snapshot_memory(gateway: kube.KubeGateway, page_size: int | None) -> tuple[float, float, int]:
    """(peak MiB while snapshot_take runs, MiB the snapshot keeps, pods) — Python allocations."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    snapshot = snapshot_take(gateway, now=datetime.now(timezone.utc), page_size=page_size)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (peak - before) / 2**20, (kept - before) / 2**20, len(snapshot.pods)


def one_scale(scale: int, runs: int, report: Report, pages: bool, client: Client) -> None:
    with served(scale, _folder) as (url, kubeconfig):
        cluster, _ = Cluster.objects.update_or_create(name=f"big-{scale}x",
                                                      defaults={"kubeconfig_path": str(kubeconfig)})
        gateway = kube.gateway_for(cluster)
        pool = urllib3.PoolManager(maxsize=1)
        floor = lambda: floor_lists(pool, url, SNAPSHOT_PAGE_SIZE)   # noqa: E731
        dashboard_path, map_path = f"/capacity/clusters/{cluster.name}/", f"/capacity/clusters/{cluster.name}/gpu-map/"

        def page(path: str, *, kept: bool | None):
            """One page; `kept`: must it come from a kept reading (True), from reading the
            cluster (False, the kept one dropped first), or either (None)."""
            if kept is False:
                readings_forget(cluster=cluster)
            calls = sum(gateway.calls.values())
            response = client.get(path, secure=True)
            assert response.status_code == 200, (path, response.status_code)
            assert b'id="data-age"' in response.content
            read = sum(gateway.calls.values()) > calls
            if kept is not None and read is kept:
                raise SystemExit(f"{path}: expected {'a kept reading' if kept else 'the cluster read'}, got the other")
            return response

        def older_prepare(path: str) -> None:
            """A kept reading (read now if there is none), no refresh queued, and the
            product's clock just past the reading's serving time."""
            ahead[0] = 0
            page(path, kept=None)
            refresh_forget(cluster=cluster)
            ahead[0] = settings.CAPACITY_MAP_CACHE_SECONDS + 1

        def older_page(path: str) -> None:
            response = page(path, kept=True)
            if b"A newer reading was asked for" not in response.content:
                raise SystemExit(f"{path}: an older reading was served without its refresh queued")

        # Warm up: connections, templates, the server's first pages.
        floor(), page(dashboard_path, kept=False), page(map_path, kept=False)
        floor_label = f"same LISTs raw (urllib3 + the typed decode, pages of {SNAPSHOT_PAGE_SIZE}, collector paused)"
        for name, path in (("dashboard", dashboard_path), ("GPU map", map_path)):
            for kept in (False, True):
                # A kept reading is made (untimed) when the last one has expired: under
                # load, five runs of the floor at 5x can outlast it.
                floors, samples = paired(runs, floor, lambda: page(path, kept=kept),
                                         prepare=(lambda: page(path, kept=None)) if kept else None)
                report.add(scale, f"{name}, {'kept reading' if kept else 'cluster read'}", samples,
                           floor=floor_label, floor_samples=floors, note=per_run(samples, floors, target=2))
            if read_shared():
                try:
                    floors, samples = paired(runs, floor, lambda: older_page(path), prepare=lambda: older_prepare(path))
                finally:
                    ahead[0] = 0
                report.add(scale, f"{name}, older reading (refresh queued)", samples, floor=floor_label,
                           floor_samples=floors, note=per_run(samples, floors, target=2))
        floors, samples = paired(runs, floor, lambda: snapshot_take(gateway, now=datetime.now(timezone.utc)))
        report.add(scale, "snapshot_take", samples, floor=floor_label, floor_samples=floors,
                   note=per_run(samples, floors, target=2))
        peak, kept, count = snapshot_memory(gateway, SNAPSHOT_PAGE_SIZE)
        report.add(scale, "snapshot_take peak memory", [peak], unit="MiB",
                   note=f"{count:,} pods; the snapshot keeps {kept:.0f} MiB")
        if pages:
            for size in PAGE_SIZES:
                samples = [0.0] * runs
                for i in range(runs):
                    began = time.perf_counter()
                    snapshot_take(gateway, now=datetime.now(timezone.utc), page_size=size)
                    samples[i] = time.perf_counter() - began
                peak, kept, _ = snapshot_memory(gateway, size)
                report.add(scale, f"snapshot_take, pages of {size or 'all (unpaged)'}", samples,
                           note=f"peak {peak:.0f} MiB, keeps {kept:.0f} MiB")
        readings_forget(cluster=cluster)
        pool.clear()
        kube.forget_gateways()


def main() -> int:
    parser = bench_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--pages", action="store_true",
                        help="also time snapshot_take and its peak memory per page size")
    parser.add_argument("--redis-url", help="Django's cache on this Redis (shared with workers, as in production): "
                                            "also times a page served from an older reading while it queues a refresh")
    args = parser.parse_args()
    scales = scales_of(args)
    # Refreshes the pages queue stay in this process and are never run (see the docstring).
    celery_app.conf.broker_url, celery_app.conf.broker_transport_options = "memory://", {}
    real_now = clock.now
    clock.now = lambda: real_now() + timedelta(seconds=ahead[0])
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
    client = Client()
    client.force_login(user)
    print(f"dashboard_render: cache {settings.CACHES['default']['BACKEND'].rsplit('.', 1)[-1]}, "
          f"readings kept {settings.CAPACITY_MAP_CACHE_SECONDS} s, snapshot pages of {SNAPSHOT_PAGE_SIZE}", flush=True)
    report = Report("dashboard_render", runs=args.runs)
    for scale in scales:
        one_scale(scale, args.runs, report, args.pages, client)
    report.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
