from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def scrape(client, settings):
    """`scrape()` → {(sample name, frozenset(labels)): value} from GET /metrics (DEBUG on)."""
    settings.DEBUG = True
    settings.METRICS_TOKEN = ""

    def get() -> dict:
        response = client.get("/metrics")
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain; version=")
        samples = {}
        for family in text_string_to_metric_families(response.content.decode()):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples

    return get
