"""docker-compose.yml publishes nothing beyond this machine, ships no secret of its own, and
`docker-compose config` accepts it (tests/image/test_compose_services.py runs its services)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
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


def _compose_config(path: Path) -> subprocess.CompletedProcess:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed (make system-deps installs it, as root)")
    env = {**os.environ, **{secret: "set-by-the-test" for secret in SECRETS}}
    return subprocess.run(["docker-compose", "-f", str(path), "config"], capture_output=True, text=True, env=env,
                          cwd=path.parent, timeout=60)


def test_docker_compose_config_accepts_the_file():
    checked = _compose_config(COMPOSE)
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    assert {"migrate", "web", "worker-beat", "worker-sweep", "worker-apply", "worker-long", "beat",
            "simcluster"} <= set(services)


def test_docker_compose_config_refuses_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    command: python manage.py migrate --noinput",
                                                  "    commands: python manage.py migrate --noinput"))
    checked = _compose_config(broken)
    assert checked.returncode != 0 and "commands" in checked.stderr
