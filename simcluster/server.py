"""The simulated cluster as a running HTTP server.

`ClusterServer` builds a `Simulation` from a scenario, serves the API with Werkzeug's
threaded server (one thread per connection: the web process, the Celery worker, beat,
tests and kubectl at once; watches stream as chunked responses), and, with `speed`,
runs the controllers from a background thread every `settings.tick_seconds`.

With a manual clock (the default for tests) controllers run only on
`POST /simcluster/v1/advance`: after a write, advance(0) lets them react.
"""
from __future__ import annotations

import gc
import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from werkzeug.serving import WSGIRequestHandler, make_server

from . import scenario as scenarios
from .api import ApiServer
from .clock import SimClock
from .controllers import default_controllers
from .faults import Faults
from .kubeconfig import write_kubeconfig
from .sim import SimSettings, Simulation

log = logging.getLogger("simcluster")

# Namespaces every Kubernetes cluster has.
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a scenario loads: parsing and storing
    50,000 pods allocates millions of dicts and lists that all live on, and the
    collector's passes over them were three quarters of the load time. JSON objects hold
    no cycles, so nothing is left uncollected."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_simulation(scenario=None, *, settings: SimSettings | None = None,
                     speed: float | None = None) -> Simulation:
    """A Simulation holding `scenario` (path, YAML text, list of dicts or None), its
    controllers from `default_controllers()`, brought to rest once."""
    with _collector_paused():
        loaded = scenarios.load(scenario) if scenario is not None else scenarios.Scenario(source="<empty>")
        sim = Simulation(clock=SimClock(speed=speed), settings=settings or loaded.settings,
                         controllers=default_controllers())
        for name in BUILTIN_NAMESPACES:
            scenarios.ensure_namespace(sim, name)
        scenarios.apply(sim, loaded)
        del loaded
        sim.advance(0)
    return sim


class _RequestHandler(WSGIRequestHandler):
    """Access lines go to the `simcluster.http` logger at debug level, not to stderr."""

    def log_request(self, code="-", size="-") -> None:
        logging.getLogger("simcluster.http").debug('"%s" %s %s', self.requestline, code, size)


class ClusterServer:
    """`start()` serves in a background thread; `stop()` ends it and every open watch."""

    def __init__(self, scenario=None, *, host: str = "127.0.0.1", port: int = 0,
                 speed: float | None = None, settings: SimSettings | None = None,
                 kubeconfig_out: str | Path | None = None, sim: Simulation | None = None):
        self.sim = sim or build_simulation(scenario, settings=settings, speed=speed)
        self.faults = Faults()
        self.app = ApiServer(self.sim, faults=self.faults)
        self.host = host
        self._port = port
        self.kubeconfig_path: Path | None = Path(kubeconfig_out) if kubeconfig_out else None
        self._http = None
        self._threads: list[threading.Thread] = []
        self._stop_ticking = threading.Event()

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the server is not started")
        return f"http://{self.host}:{self._http.server_port}"

    def start(self) -> "ClusterServer":
        self._http = make_server(self.host, self._port, self.app, threaded=True,
                                 request_handler=_RequestHandler)
        self._http.daemon_threads = True
        serve = threading.Thread(target=self._http.serve_forever, name="simcluster-http", daemon=True)
        serve.start()
        self._threads.append(serve)
        if not self.sim.clock.manual:
            tick = threading.Thread(target=self._tick, name="simcluster-clock", daemon=True)
            tick.start()
            self._threads.append(tick)
        if self.kubeconfig_path:
            write_kubeconfig(self.kubeconfig_path, self.url)
        return self

    def _tick(self) -> None:
        while not self._stop_ticking.wait(self.sim.settings.tick_seconds):
            try:
                self.sim.tick()
            except Exception:   # keep the clock running; the log says what broke
                log.exception("controller pass failed")

    def stop(self) -> None:
        self._stop_ticking.set()
        self.app.stopping.set()
        with self.sim.store.lock:
            self.sim.store.changed.notify_all()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> "ClusterServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
