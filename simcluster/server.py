"""The simulated cluster as a running HTTP server.

`ClusterServer` builds a `Simulation` from a scenario, serves the API with Werkzeug's
threaded server (one thread per connection: the web process, the Celery worker, beat,
tests and kubectl at once; connections kept alive between requests as kube-apiserver's
are; watches stream as chunked responses), and, with `speed`,
runs the controllers from a background thread every `settings.tick_seconds`.

With a manual clock (the default for tests) controllers run only on
`POST /simcluster/v1/advance`: after a write, advance(0) lets them react.
"""
from __future__ import annotations

import gc
import logging
import socket
import threading
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

from werkzeug.exceptions import ClientDisconnected
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler
from werkzeug.wsgi import LimitedStream

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
def _collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off while a scenario loads: parsing and storing
    50,000 pods allocates millions of dicts and lists that all live on, and the
    collector's passes over them were three quarters of the load time. JSON objects hold
    no cycles, so nothing is left uncollected. With `freeze`, what was made is moved out
    of the collector's generations before it is turned back on, so its first pass does
    not walk the loaded store either (for a process serving this one cluster)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def build_simulation(scenario=None, *, settings: SimSettings | None = None,
                     speed: float | None = None, freeze: bool = False, start: datetime | None = None) -> Simulation:
    """A Simulation holding `scenario` (path, YAML text, list of dicts or None), its
    controllers from `default_controllers()`, brought to rest once. `freeze`: what is
    loaded lives as long as the process (`gc.freeze`). `start`: the clock's first reading
    (default: now)."""
    with _collector_paused(freeze):
        loaded = scenarios.load(scenario) if scenario is not None else scenarios.Scenario(source="<empty>")
        sim = Simulation(clock=SimClock(start=start, speed=speed), settings=settings or loaded.settings,
                         controllers=default_controllers())
        for name in BUILTIN_NAMESPACES:
            scenarios.ensure_namespace(sim, name)
        scenarios.apply(sim, loaded)
        del loaded
        sim.advance(0)
    return sim


# An idle kept-alive connection closes after this long without a request, as Go's
# http.DefaultTransport (client-go's) drops its own idle connections after 90 s.
IDLE_CONNECTION_SECONDS = 90.0

_http_log = logging.getLogger("simcluster.http")


class _RequestHandler(WSGIRequestHandler):
    """HTTP/1.1 with kept-alive connections, as kube-apiserver serves: a client reading
    page after page (kubectl, client-go, the kubernetes package, urllib3 pools) sends
    them all on one connection instead of connecting, and having a thread started, per
    request.

    Werkzeug's handler closes the connection after every response (it cannot tell where
    an unread request body ends, so it reads whatever follows). This one keeps an
    HTTP/1.1 connection open after a response of known length (every response but a
    watch's stream) to a request whose body has a Content-Length, reading what the
    application left of that body before the next request. Anything else (a chunked
    request body, `Connection: close`, HTTP/1.0) is answered by Werkzeug's handler,
    which closes the connection, as do streamed responses (watches).

    Access lines go to the `simcluster.http` logger at debug level, not to stderr."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out as written, not held back until the client acknowledges
    # the previous segment (Nagle's algorithm against delayed ACKs: 40 ms per request).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.server.opened(self.connection)

    def finish(self) -> None:
        self.server.closed(self.connection)
        super().finish()

    def handle_one_request(self) -> None:
        # Waiting for a request (an idle connection) times out; serving one does not:
        # a watch may stream for half an hour, a slow client may take its time to read.
        self.connection.settimeout(IDLE_CONNECTION_SECONDS)
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(None)
        if parsed and self.server.stopped.is_set():
            # A request read after stop() is not served: on a kept-alive connection whose
            # thread had not yet gone back to reading, Linux still delivers what the client
            # sends after shutdown(SHUT_RD). The client sees the connection close, unanswered.
            self.close_connection = True
            return False
        return parsed

    def run_wsgi(self) -> None:
        length = self.headers.get("Content-Length", "0").strip()
        if self.close_connection or self.request_version != "HTTP/1.1" or not length.isdigit() \
                or "Transfer-Encoding" in self.headers:
            super().run_wsgi()   # answers with Connection: close
            return
        # (parse_request has answered an `Expect: 100-continue` already.)
        environ = self.environ = self.make_environ()
        body = environ["wsgi.input"] = LimitedStream(self.rfile, int(length))
        started: list = []        # [status, headers] once the application starts its response
        sent: list = []           # [bytes left of a known length, or None: chunked] once headers are out

        def write(data: bytes) -> None:
            if not sent:
                sent.append(self._send_headers(environ, *started))
            if not data:
                return
            if sent[0] is None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                sent[0] -= len(data)
                self.wfile.write(data)

        def start_response(status, headers, exc_info=None):
            if exc_info is not None and sent:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return write

        try:
            result = self.server.app(environ, start_response)
            try:
                for data in result:
                    write(data)
                write(b"")
            finally:
                if hasattr(result, "close"):
                    result.close()
            if sent[0] is None:
                self.wfile.write(b"0\r\n\r\n")
            elif sent[0] != 0:
                self.close_connection = True   # the body was not the length announced
            # What the application did not read of the request body comes before the next request.
            while not self.close_connection and body.read(1 << 16):
                pass
        except (ConnectionError, TimeoutError, ClientDisconnected):
            self.close_connection = True
        except Exception:
            _http_log.exception("error serving %s", self.requestline)
            self.close_connection = True
            if not sent:
                self._headers_buffer = []   # whatever part of a status line was made
                self.send_error(500)

    def _send_headers(self, environ, status: str, headers: list[tuple[str, str]]) -> int | None:
        """Status line and headers; returns the body's length, None when it goes chunked
        (and the connection closes after it)."""
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason)
        length = None
        for key, value in headers:
            self.send_header(key, value)
            if key.lower() == "content-length":
                length = int(value)
        if environ["REQUEST_METHOD"] == "HEAD" or int(code) < 200 or code in ("204", "304"):
            length = 0   # no body whatever the headers say
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
        self.end_headers()
        return length

    def log_request(self, code="-", size="-") -> None:
        _http_log.debug('"%s" %s %s', self.requestline, code, size)

    def log_error(self, format: str, *args) -> None:
        if format.startswith("Request timed out"):   # an idle connection closing
            _http_log.debug(format, *args)
        else:
            super().log_error(format, *args)


SHUTDOWN_POLL_SECONDS = 0.05   # how often the serving thread looks for stop() (seconds)


class _HttpServer(ThreadedWSGIServer):
    """Werkzeug's threaded server (a thread per connection), knowing its open
    connections so that stopping ends the idle ones."""

    def __init__(self, host: str, port: int, app) -> None:
        super().__init__(host, port, app, handler=_RequestHandler)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.stopped = threading.Event()   # set by ClusterServer.stop(): no further request is served

    def opened(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)

    def closed(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    def end_connections(self) -> None:
        """No further request on any open connection: one waiting for a request ends
        now, one serving a response ends once the response is sent."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RD)
            except OSError:   # already closed by its client
                pass


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
        self._http = _HttpServer(self.host, self._port, self.app)
        # serve_forever checks for shutdown once per poll interval (socketserver's default 0.5 s):
        # stop() waits that long, so a short interval keeps stopping quick.
        serve = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
                                 name="simcluster-http", daemon=True)
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
            self._http.stopped.set()
            self._http.shutdown()
            self._http.server_close()
            self._http.end_connections()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> "ClusterServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
