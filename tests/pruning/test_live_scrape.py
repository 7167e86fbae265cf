"""Prometheus scrapes the simulated cluster's DCGM exporter live; the pruner reads it."""
from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest

from clusters.kube import DEPLOYMENTS, KubeGateway
from clusters.prometheus import PrometheusGateway
from pruning.services import PruneParams, prune_run_execute
from simcluster.generate import namespace, node
from simcluster.testing import running_cluster

from pruning_world import GPU_MODEL, deployment

pytestmark = [pytest.mark.django_db, pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 8
MAX_GAP_S = 3
DATA_DEADLINE_S = 40.0   # bounded wait on the external Prometheus process


def test_pruner_reads_what_prometheus_scraped_from_the_exporter(prometheus_factory):
    docs = [node("gpu-0", pool="a10g", product=GPU_MODEL, gpus=8), namespace("team-a")]
    # A clock running at real speed: Prometheus stamps samples with wall time.
    with running_cluster(docs, manual_clock=False, speed=1.0) as server:
        gateway = KubeGateway.from_kubeconfig(str(server.kubeconfig_path))
        for name, util in (("idle", "0"), ("busy", "55")):
            gateway.create(DEPLOYMENTS, deployment(name, "team-a", util=util), namespace="team-a")
        target = urlparse(server.url).netloc
        prom_server = prometheus_factory(scrape_configs=[{
            "job_name": "dcgm", "honor_labels": True, "scrape_interval": "1s",
            "static_configs": [{"targets": [target]}]}], scrape_interval="1s")
        prom = PrometheusGateway(prom_server.url)
        deadline = time.monotonic() + DATA_DEADLINE_S
        # Wait until both pods have history covering the window plus the query's gap
        # look-back (MAX_GAP_S). A range of N seconds at a 1 s scrape holds N samples
        # (N + 1 only when a sample falls exactly on its start), so ask for a full span.
        span = WINDOW_S + MAX_GAP_S + 1
        query = f'min(count_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{span}s])) and ' \
                f'count(count by (pod) (DCGM_FI_DEV_GPU_UTIL{{pod!=""}})) == 2'
        while True:
            samples = prom.query(query)
            if samples and samples[0].value >= span:
                break
            assert time.monotonic() < deadline, "Prometheus scraped too little of the exporter in time"
            time.sleep(0.5)

        run = prune_run_execute(kube_gateway=gateway, prometheus=prom, now=server.sim.clock.now(),
                                params=PruneParams(window_seconds=WINDOW_S, step_seconds=1, max_gap_seconds=MAX_GAP_S,
                                                   grace_seconds=0))
        gateway.close()
    assert run.pods_seen == 2 and run.busy_pods == 1
    d = run.decisions.get()
    assert (d.decision, d.reason, d.owner_kind, d.owner_name) == ("prune", "idle", "Deployment", "idle")
