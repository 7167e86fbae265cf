"""docker-compose.yml publishes nothing beyond this machine and ships no secret of its own."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
SECRETS = ("DJANGO_SECRET_KEY", "METRICS_TOKEN", "POSTGRES_PASSWORD")


def test_every_published_port_is_bound_to_loopback():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    published = {name: svc["ports"] for name, svc in services.items() if svc.get("ports")}
    assert published, "the stack publishes the panel, Prometheus and the simulated cluster"
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_secrets_must_be_given_and_have_no_default():
    text = COMPOSE.read_text()
    for secret in SECRETS:
        uses = re.findall(r"\$\{" + secret + r"(:?[-?][^}]*)?\}", text)
        assert uses, f"{secret} is read from the environment"
        assert all(use.startswith(":?") for use in uses), f"{secret} has a default in docker-compose.yml: {uses}"
    assert "postgres:postgres@" not in text
