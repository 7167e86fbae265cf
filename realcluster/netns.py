"""The private network namespace the tier runs in, and the relay that lets the host in.

KWOK gives pods private-range IPs, and the controllers (Endpoints, later Knative's
autoscaler) dial them. This machine must send nothing to any non-loopback address, so
the whole tier lives in a namespace of its own, where 10.0.0.0/8 sits on `lo`: every
pod IP and the apiserver's advertised address (10.0.0.1) stay inside it.

The host reaches the apiserver through a relay: a TCP socket listening on the host's
127.0.0.1 is opened *before* this process leaves the host namespace (a socket belongs
to the namespace it was made in), and each connection accepted there is piped to
10.0.0.1:6443 inside. TLS passes through untouched.
"""
from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading

CLONE_NEWNET = 0x40000000
NAMESPACE_CIDR = "10.0.0.1/8"


class NamespaceError(RuntimeError):
    pass


def host_listener(port: int = 0) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


def enter_private_namespace() -> None:
    """Move this (single-threaded) process into a new network namespace with only `lo`,
    up, holding 127.0.0.1/8 and 10.0.0.1/8. Children started afterwards inherit it."""
    if threading.active_count() != 1:
        raise NamespaceError("leaving the host network namespace needs a single-threaded process")
    if os.geteuid() != 0:
        raise NamespaceError("the real tier runs in its own network namespace, which needs root "
                             "(CAP_SYS_ADMIN); run it as root, e.g. in the CI container")
    if _libc().unshare(CLONE_NEWNET) != 0:
        raise NamespaceError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    _setup_lo()


class _Connection:
    """Both directions of one relayed connection; the sockets close when both are done."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.sockets = (client, upstream)
        self.open_directions = 2
        self.lock = threading.Lock()

    def direction_done(self) -> None:
        with self.lock:
            self.open_directions -= 1
            if self.open_directions:
                return
        for sock in self.sockets:
            sock.close()


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _setup_lo() -> None:
    for command in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", NAMESPACE_CIDR, "dev", "lo"]):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise NamespaceError(f"`{' '.join(command)}` failed in the new namespace: {result.stderr.strip()}")


class NestedNamespace:
    """A second private namespace for a program that must bind a port another one holds
    (Knative's autoscaler and controller both bind :8080, as separate pods would). Only
    the calling thread enters it, long enough to open a relay listener on
    10.0.0.1:`port` and start the program; the relay then pipes each connection to the
    same address in the tier's namespace (the apiserver)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener: socket.socket | None = None
        self._home: int | None = None

    def __enter__(self) -> "NestedNamespace":
        libc = _libc()
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        if libc.unshare(CLONE_NEWNET) != 0:
            raise NamespaceError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
        _setup_lo()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((NAMESPACE_CIDR.split("/")[0], self.port))
        self.listener.listen(64)
        return self

    def __exit__(self, *exc) -> None:
        # IMPORTANT: back home before the relay thread starts (threads inherit the namespace).
        if _libc().setns(self._home, CLONE_NEWNET) != 0:
            raise NamespaceError(f"setns back to the tier's namespace failed: {os.strerror(ctypes.get_errno())}")
        os.close(self._home)
        relay_start(self.listener, (NAMESPACE_CIDR.split("/")[0], self.port))


def _pipe(source: socket.socket, sink: socket.socket, connection: _Connection) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass
        connection.direction_done()


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return   # listener closed: the tier is going down
        try:
            upstream = socket.create_connection(target, timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        connection = _Connection(client, upstream)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(source, sink, connection), daemon=True).start()


def relay_start(listener: socket.socket, target: tuple[str, int]) -> threading.Thread:
    thread = threading.Thread(target=_serve, args=(listener, target), name="apiserver-relay", daemon=True)
    thread.start()
    return thread
