"""Podman containers of the product's image for tests/image: started as deploy/*.yaml and
docker-compose.yml run them, removed at the end of the module that started them."""
from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
POLL_LIMIT_S = 90.0
sys.path.insert(0, str(ROOT / "tests" / "capacity"))   # the defrag tests' cluster builders


def _image_module():
    spec = importlib.util.spec_from_file_location("gpu_capacity_image", ROOT / "scripts" / "image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IMAGE = _image_module()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manifest_container(path: Path, deployment: str) -> tuple[dict, dict]:
    """(container, pod spec) of the first container of a Deployment in a deploy/ manifest."""
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"] == deployment:
            spec = doc["spec"]["template"]["spec"]
            return spec["containers"][0], spec
    raise AssertionError(f"{path.name} has no Deployment {deployment}")


def empty_dirs(container: dict, pod: dict) -> list[str]:
    """Where the manifest mounts an emptyDir in this container (the only writable paths), as
    podman --tmpfs options: owned by the container's user (`U`), who may write there as the
    pod's fsGroup lets it on a kubelet's emptyDir."""
    scratch = {volume["name"] for volume in pod.get("volumes", []) if "emptyDir" in volume}
    return [f"{mount['mountPath']}:rw,nosuid,nodev,U"
            for mount in container.get("volumeMounts", []) if mount["name"] in scratch]


def wait_for(predicate, what: str, logs=lambda: "", limit_s: float = POLL_LIMIT_S):
    """Bounded polling: the containers run on their own."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"not within {limit_s:.0f} s: {what}\n{logs()}")


class Podman:
    """Containers of one test module, named with its prefix and removed at its end."""

    def __init__(self, image: str, prefix: str, env: dict[str, str]):
        self.image, self.prefix, self.env, self.names = image, prefix, env, []

    def _args(self, name: str, *, tmpfs: list[str], mounts: list[str], env: dict[str, str]) -> list[str]:
        # --read-only-tmpfs=false: podman's --read-only would otherwise add writable /tmp,
        # /var/tmp and /run that no manifest gives. Capabilities and privilege escalation as
        # the manifests' securityContext (drop ALL, allowPrivilegeEscalation: false).
        args = [*IMAGE.PODMAN, "run", "--name", f"{self.prefix}-{name}", "--hostname", name, "--network=host",
                *IMAGE.ULIMITS, "--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL",
                "--security-opt=no-new-privileges", "-e", f"HOSTNAME={name}"]
        for path in tmpfs:
            args += ["--tmpfs", path]
        for mount in mounts:
            args += ["-v", mount]
        for key, value in {**self.env, **env}.items():
            args += ["-e", f"{key}={value}"]
        return args

    def start(self, name: str, command: list[str], *, tmpfs=(), mounts=(), env=None) -> str:
        full = f"{self.prefix}-{name}"
        subprocess.run(self._args(name, tmpfs=list(tmpfs), mounts=list(mounts), env=env or {})
                       + ["--detach", self.image, *command], check=True, stdout=subprocess.DEVNULL)
        self.names.append(full)
        return full

    def run(self, name: str, command: list[str], *, tmpfs=(), mounts=(), env=None) -> subprocess.CompletedProcess:
        """A container run to its end (removed after), its output captured."""
        return subprocess.run(self._args(name, tmpfs=list(tmpfs), mounts=list(mounts), env=env or {})
                              + ["--rm", self.image, *command], capture_output=True, text=True, timeout=300)

    def exec(self, name: str, *command: str, env: dict | None = None) -> subprocess.CompletedProcess:
        extra = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        return subprocess.run([*IMAGE.PODMAN, "exec", *extra, f"{self.prefix}-{name}", *command],
                              capture_output=True, text=True, timeout=120)

    def log(self, name: str) -> str:
        out = subprocess.run([*IMAGE.PODMAN, "logs", f"{self.prefix}-{name}"], capture_output=True, text=True)
        return out.stdout + out.stderr

    def running(self, name: str) -> bool:
        out = subprocess.run([*IMAGE.PODMAN, "inspect", "--format", "{{.State.Running}}", f"{self.prefix}-{name}"],
                             capture_output=True, text=True)
        return out.stdout.strip() == "true"

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name.removeprefix(self.prefix + '-'))[-3000:]}"
                         for name in self.names)

    def remove_all(self) -> None:
        if self.names:
            subprocess.run([*IMAGE.PODMAN, "rm", "--force", "--time", "3", *self.names],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.names = []


def sql(database: str, query: str, *params):
    with psycopg.connect(database.replace("postgres://", "postgresql://", 1)) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount
