from __future__ import annotations

import pytest

from prometheus_fixtures import PrometheusServer


@pytest.fixture
def prometheus_factory(tmp_path):
    """`make(history=[Series…], scrape_configs=[…])` → a started `PrometheusServer`."""
    servers: list[PrometheusServer] = []

    def make(history=None, *, scrape_configs=None, scrape_interval="15s", tls=None) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}", scrape_configs=scrape_configs,
                                  scrape_interval=scrape_interval, tls=tls)
        if history:
            server.backfill(history)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()
