"""Starting a simulated cluster inside a test process.

    with running_cluster("simcluster/scenarios/demo.yaml") as url:
        ...   # talk to `url` with the kubernetes client; SimControl(url).advance(0)

`ClusterServer` (re-exported here) gives the same with `.sim` reachable, for helpers
that need the Simulation itself.
"""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .server import ClusterServer, build_simulation
from .sim import SimSettings

__all__ = ["ClusterServer", "RunningCluster", "build_simulation", "running_cluster"]


class RunningCluster(str):
    """The server's URL (a str, usable wherever a URL is), carrying the server:
    `.url`, `.sim`, `.server` and `.kubeconfig_path` for in-process helpers."""

    server: ClusterServer

    def __new__(cls, server: ClusterServer) -> "RunningCluster":
        running = super().__new__(cls, server.url)
        running.server = server
        return running

    @property
    def url(self) -> str:
        return str(self)

    @property
    def sim(self):
        return self.server.sim

    @property
    def kubeconfig_path(self) -> Path:
        return self.server.kubeconfig_path


@contextmanager
def running_cluster(scenario=None, *, manual_clock: bool = True, speed: float | None = None,
                    settings: SimSettings | None = None, kubeconfig_out: str | Path | None = None,
                    port: int = 0) -> Iterator[RunningCluster]:
    """Serve `scenario` (path, YAML text, list of dicts or None) on 127.0.0.1 and yield
    the URL (a `RunningCluster` str). The clock is manual unless `speed` is given
    (`manual_clock=False` alone means real time, speed 1). A kubeconfig is written to
    `kubeconfig_out`, or to a temporary file removed afterwards."""
    if speed is None and not manual_clock:
        speed = 1.0
    with tempfile.TemporaryDirectory(prefix="simcluster-") as tmp:
        server = ClusterServer(scenario, port=port, speed=speed, settings=settings,
                               kubeconfig_out=kubeconfig_out or Path(tmp) / "kubeconfig")
        server.start()
        try:
            yield RunningCluster(server)
        finally:
            server.stop()
