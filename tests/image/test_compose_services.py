"""Every service docker-compose.yml runs from the product's image runs from the built image with
the command compose gives it (read from `docker-compose config`, so as compose resolves it).

The containers share the host's loopback (`--network=host`): compose's service names
(postgres, redis, simcluster, prometheus) are given as 127.0.0.1 with `--add-host`, and
DATABASE_URL and REDIS_URL point at the tests' PostgreSQL and Redis instead of compose's own
(whose images no registry here serves). The `kube` volume is a podman volume, written by the
simulated cluster and read by the others, as in compose. The commands bind compose's ports
(8000 and 6443), which must be free on this machine.
"""
from __future__ import annotations

import os
import shlex
import socket
import subprocess

import pytest
import requests
import yaml
from containers import IMAGE, ROOT, Podman, wait_for

IMAGE_NAME = "gpu-capacity:local"
WORKERS = {"worker-beat": "beat", "worker-sweep": "sweep", "worker-apply": "apply", "worker-long": "long"}
SECRETS = ("DJANGO_SECRET_KEY", "METRICS_TOKEN", "POSTGRES_PASSWORD")

# The first test's set-up builds the image when `make image` has not (cold: minutes).
pytestmark = pytest.mark.timeout(900)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def compose_services():
    env = {**os.environ, **{secret: f"compose-test-{secret.lower()}" for secret in SECRETS}}
    checked = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], cwd=ROOT,
                             capture_output=True, text=True, env=env, timeout=60)
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    return {name: service for name, service in services.items() if service.get("image") == IMAGE_NAME}


@pytest.fixture(scope="module")
def compose_stack(image_tag, compose_services, database, broker):
    for port in (8000, 6443):
        if not _port_free(port):
            pytest.fail(f"port {port} is taken on 127.0.0.1: compose's commands bind it")
    prefix = f"gpu-capacity-compose-{os.getpid()}"
    volume = f"{prefix}-kube"
    subprocess.run([*IMAGE.PODMAN, "volume", "create", volume], check=True, stdout=subprocess.DEVNULL)
    hosts = [arg for name in ("postgres", "redis", "simcluster", "prometheus", "web")
             for arg in ("--add-host", f"{name}:127.0.0.1")]
    podman = ComposePodman(image_tag, prefix, {}, hosts)

    def start(name: str) -> None:
        service = compose_services[name]
        command = service["command"]
        command = shlex.split(command) if isinstance(command, str) else command
        env = {key: str(value) for key, value in (service.get("environment") or {}).items()}
        if "DATABASE_URL" in env:
            env["DATABASE_URL"] = database
        if "REDIS_URL" in env:
            env["REDIS_URL"] = broker
        mounts = [v.replace("kube:", f"{volume}:", 1) for v in service.get("volumes", [])]
        podman.start(name, command, mounts=mounts, env=env)

    try:
        start("simcluster")
        wait_for(lambda: not _port_free(6443), "the simulated cluster listens on 6443", podman.logs)
        migrate = compose_services["migrate"]
        command = shlex.split(migrate["command"])
        env = {**migrate["environment"], "DATABASE_URL": database, "REDIS_URL": broker}
        done = podman.run("migrate", command, env={k: str(v) for k, v in env.items()},
                          mounts=[f"{volume}:/kube:ro"])
        assert done.returncode == 0, f"compose's migrate failed:\n{done.stdout}\n{done.stderr}"
        for name in ("web", *WORKERS, "beat"):
            start(name)
        yield podman
    finally:
        podman.remove_all()
        subprocess.run([*IMAGE.PODMAN, "volume", "rm", "--force", volume], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


class ComposePodman(Podman):
    """The containers as compose runs them: a writable root filesystem (compose sets no
    read_only) and compose's host names on the loopback."""

    def __init__(self, image: str, prefix: str, env: dict[str, str], hosts: list[str]):
        super().__init__(image, prefix, env)
        self.hosts = hosts

    def _args(self, name, *, tmpfs, mounts, env):
        args = [*IMAGE.PODMAN, "run", "--name", f"{self.prefix}-{name}", "--hostname", name, "--network=host",
                *IMAGE.ULIMITS, *self.hosts]
        for mount in mounts:
            args += ["-v", mount]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        return args


def test_every_service_from_the_image_is_in_the_compose_file(compose_services):
    assert set(compose_services) == {"simcluster", "migrate", "web", "beat", *WORKERS}


def test_web_answers_on_composes_port_with_database_broker_and_cluster_ready(compose_stack):
    def ready():
        try:
            answer = requests.get("http://127.0.0.1:8000/readyz", timeout=10)
        except requests.RequestException:
            return None
        return answer if answer.status_code == 200 else None

    checks = wait_for(ready, "compose's web answers /readyz with 200", compose_stack.logs).json()["checks"]
    assert set(checks) == {"database", "broker"}, checks      # no cluster registered yet
    # The default cluster comes from KUBECONFIG on the kube volume the simulated cluster wrote.
    synced = compose_stack.exec("web", "python", "manage.py", "sync_orgs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    checks = ready().json()["checks"]
    assert len(checks) == 3 and all(check["status"] == "ok" for check in checks.values()), checks


@pytest.mark.parametrize("service", sorted(WORKERS))
def test_each_worker_consumes_its_queue(compose_stack, compose_services, service):
    wait_for(lambda: " ready." in compose_stack.log(service), f"{service} is ready", compose_stack.logs)
    queues = compose_services[service]["command"].split("-Q ", 1)[1].split()[0].split(",")
    assert WORKERS[service] in queues
    banner = compose_stack.log(service)
    for queue in queues:
        assert f".> {queue} " in banner, (queue, banner[-2000:])
    assert compose_stack.running(service)


def test_beat_starts_on_the_database_schedule(compose_stack):
    wait_for(lambda: "Sending due task capacity: defrag jobs resume" in compose_stack.log("beat"),
             "beat sends the defrag resume (every 10 s) from the database schedule", compose_stack.logs)
    assert compose_stack.running("beat")
