"""The panel at 1,000 nodes (prints figures; not a test).

The cluster dashboard on the generated 1,000-node / 10,000-pod scenario against its floor,
measured in the same run: fetching that cluster's nodes and pods raw — one unpaged LIST
each over HTTP, decoded from JSON with orjson and nothing more (the least any view of
the fleet must do). Target: dashboard ≤ 2× the floor. The GPU map's first page is shown
too.

    .venv/bin/python bench/dashboard_render.py [--nodes 1000] [--pods 10000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

import _django

_django_folder = _django.setup("dashboard-bench")

import orjson  # noqa: E402

from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from clusters.models import Cluster  # noqa: E402
from simcluster.generate import generate  # noqa: E402
from simcluster.testing import ClusterServer  # noqa: E402


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    setup_test_environment()
    kubeconfig = _django_folder / "kubeconfig"   # removed with the bench's folder at exit
    server = ClusterServer(generate(nodes=args.nodes, pods=args.pods), kubeconfig_out=str(kubeconfig))
    server.start()
    try:
        Cluster.objects.update_or_create(name="big", defaults={"kubeconfig_path": str(kubeconfig)})
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
        client = Client()
        client.force_login(user)

        def floor():
            for path in ("/api/v1/nodes", "/api/v1/pods"):
                with urllib.request.urlopen(server.url + path) as response:
                    orjson.loads(response.read())

        def dashboard():
            response = client.get("/capacity/clusters/big/", secure=True)
            assert response.status_code == 200, response.status_code
            return response

        def gpu_map():
            response = client.get("/capacity/clusters/big/gpu-map/", secure=True)
            assert response.status_code == 200, response.status_code

        dashboard()   # warm up: the gateway, templates, the simulated cluster's caches
        floor_best, floor_median = best_of(args.repeat, floor)
        dash_best, dash_median = best_of(args.repeat, dashboard)
        map_best, map_median = best_of(args.repeat, gpu_map)
        size = len(dashboard().content)
        print(f"cluster: {args.nodes} nodes, {args.pods} pods")
        print(f"floor (raw LIST nodes + pods, decoded):   best {floor_best:.3f}s  median {floor_median:.3f}s")
        print(f"dashboard:                              best {dash_best:.3f}s  median {dash_median:.3f}s  "
              f"({size / 1024:.0f} KiB of HTML)")
        print(f"GPU map page:                           best {map_best:.3f}s  median {map_median:.3f}s")
        print(f"ratio dashboard / floor: {dash_best / floor_best:.2f} (target <= 2)")
        print(f"ratio GPU map / floor:   {map_best / floor_best:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
