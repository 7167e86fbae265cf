"""The product's image, built by scripts/image.py and run with podman as the manifests run it.

`image_tag` builds the image unless one of the current build context's hash exists (seconds
when warm). `stack` starts, once per module, from that image and against the tests'
PostgreSQL (a database of its own) and Redis (a database number of its own), all over the
host's loopback (`--network=host`): a simulated cluster, `migrate`, gunicorn, a Celery
worker per queue and beat, each with the command, the read-only root filesystem and the
writable volumes its manifest in deploy/ gives it (an emptyDir is a tmpfs here).

These tests run only when asked for by path (`pytest tests/image`, `make test-image`) or
with `--all-tiers` (`make test`): a plain `pytest tests` deselects them, since they need
root, podman and the image build (tests/tiers.py).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
import requests
import yaml
from containers import (DEPLOY, IMAGE, POLL_LIMIT_S, Podman, empty_dirs, free_port, manifest_container, sql,
                        wait_for)

from tests.celery_workers import redis_database_claimed
from tests.tiers import tier_collect

def pytest_collection_modifyitems(config, items) -> None:
    # A module's containers are started once: its tests stay in one process.
    tier_collect(config, items, Path(__file__).parent, lambda item: f"image-{item.module.__name__}")


@pytest.fixture(scope="session")
def image_tag() -> str:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (make system-deps installs it, as root)")
    try:
        return IMAGE.image_build()
    except (IMAGE.ImageError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"the image does not build: {exc}")


@pytest.fixture(scope="module")
def database(request, postgres_url):
    """A database of this module's own on the tests' PostgreSQL server; its URL."""
    if not postgres_url:
        pytest.fail("the image tests need the tests' PostgreSQL")
    name = f"image_{request.module.__name__.rsplit('.', 1)[-1]}_{os.getpid()}"
    admin = postgres_url.replace("postgres://", "postgresql://", 1).rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def broker(redis_url):
    """The containers' broker: a Redis database number of this module's own."""
    with redis_database_claimed(redis_url, ttl_seconds=1800) as url:
        yield url


class Stack:
    def __init__(self, podman: Podman, database: str, web_url: str, kubeconfig: Path, migrate: str,
                 metrics_ports: dict[str, int]):
        self.podman, self.database, self.web_url, self.kubeconfig, self.migrate_output = (
            podman, database, web_url, kubeconfig, migrate)
        self.metrics_ports = metrics_ports      # worker container name -> its CELERY_METRICS_PORT

    def sql(self, query: str, *params):
        return sql(self.database, query, *params)

    def wait_for(self, predicate, what: str, limit_s: float = POLL_LIMIT_S):
        return wait_for(predicate, what, self.podman.logs, limit_s)

    def manage(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """`python manage.py ...` in the web container, as an operator runs a command there."""
        return self.podman.exec("web", "python", "manage.py", *args, env=env)


def cluster_scenario() -> list[dict]:
    """Three GPU nodes with a model at min-scale 3 (org-a, for defrag) and an org `acme` with a
    pynode (for the dormancy sweep), on Knative 1.21."""
    from defrag_cluster import knative_service, scenario

    docs = scenario(knative_service(min_scale=3), namespaces=("org-a", "acme"))
    for doc in docs:
        if doc["kind"] == "Namespace" and doc["metadata"]["name"] == "acme":
            doc["metadata"]["labels"] = {"capacity.io/org": "acme"}
    docs.append({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "knative-serving", "labels": {"app.kubernetes.io/version": "1.21.0"}}})
    docs.append({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                 "metadata": {"name": "pynode", "namespace": "acme", "labels": {"capacity.io/component": "pynode"}},
                 "spec": {"template": {"metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "1"}},
                                       "spec": {"containers": [{"image": "pynode:1"}]}}}})
    return docs


@pytest.fixture(scope="module")
def stack(image_tag, database, broker, tmp_path_factory):
    from defrag_cluster import Kube

    from simcluster.kubeconfig import write_kubeconfig

    work = tmp_path_factory.mktemp("image")
    (work / "scenario").mkdir()
    (work / "scenario" / "cluster.yaml").write_text(yaml.safe_dump_all(cluster_scenario()))
    sim_port, web_port = free_port(), free_port()
    kubeconfig = write_kubeconfig(work / "kube" / "config", f"http://127.0.0.1:{sim_port}")
    kubeconfig.chmod(0o644)                       # read by uid 10001 in the containers
    env = {
        "DATABASE_URL": database, "REDIS_URL": broker, "KUBECONFIG": "/kube/config",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_HTTPS": "false", "METRICS_TOKEN": secrets.token_urlsafe(16), "LOG_FORMAT": "json",
        "LOG_LEVEL": "INFO", "PRUNER_RUN_MODE": "dry-run",
    }
    podman = Podman(image_tag, f"gpu-capacity-test-{os.getpid()}", env)
    kube_mount = f"{kubeconfig.parent}:/kube:ro"
    try:
        # The simulated cluster from the image too (docker-compose runs it so), clock at 50x:
        # a pod's 5 s start-up takes 0.1 s.
        podman.start("simcluster", ["python", "-m", "simcluster", "serve", "--scenario", "/scenario/cluster.yaml",
                                    "--host", "127.0.0.1", "--port", str(sim_port), "--speed", "50"],
                     mounts=[f"{work / 'scenario'}:/scenario:ro"])
        kube = Kube(str(kubeconfig))

        def model_up() -> bool:
            try:
                return kube.actual_scale() == 3
            except Exception:  # noqa: BLE001 - not answering yet
                return False

        wait_for(model_up, "the simulated cluster answers and the model runs 3 pods", podman.logs)

        web, web_pod = manifest_container(DEPLOY / "web.yaml", "gpu-capacity-web")
        migrate = web_pod["initContainers"][0]
        done = podman.run("migrate", migrate["command"], tmpfs=empty_dirs(migrate, web_pod), mounts=[kube_mount])
        assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr}"
        # An operator's first command: the default cluster (KUBECONFIG) and its orgs.
        synced = podman.run("sync-orgs", ["python", "manage.py", "sync_orgs"], mounts=[kube_mount])
        assert synced.returncode == 0, f"sync_orgs failed:\n{synced.stdout}\n{synced.stderr}"
        # gunicorn as web.yaml runs it, bound to a free loopback port instead of :8000.
        command = [arg for arg in web["command"] if not arg.startswith("--bind=")] + [f"--bind=127.0.0.1:{web_port}"]
        podman.start("web", command, tmpfs=empty_dirs(web, web_pod), mounts=[kube_mount])
        metrics_ports = {}
        for queue in ("beat", "sweep", "apply", "long"):
            worker, pod = manifest_container(DEPLOY / "worker.yaml", f"gpu-capacity-worker-{queue}")
            worker_env = {item["name"]: item["value"] for item in worker.get("env", [])}
            metrics_ports[f"worker-{queue}"] = free_port()           # host network: one port each
            worker_env["CELERY_METRICS_PORT"] = str(metrics_ports[f"worker-{queue}"])
            podman.start(f"worker-{queue}", worker["command"], tmpfs=empty_dirs(worker, pod), mounts=[kube_mount],
                         env=worker_env)
        beat, beat_pod = manifest_container(DEPLOY / "beat.yaml", "gpu-capacity-beat")
        podman.start("beat", beat["command"], tmpfs=empty_dirs(beat, beat_pod), mounts=[kube_mount])

        web_url = f"http://127.0.0.1:{web_port}"

        def answers() -> bool:
            try:
                return requests.get(f"{web_url}/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(answers, "gunicorn answers /healthz", podman.logs)
        yield Stack(podman, database, web_url, kubeconfig, done.stdout, metrics_ports)
    finally:
        podman.remove_all()
