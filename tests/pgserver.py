"""A private PostgreSQL server for one test session.

PostgreSQL refuses to run as root ("cannot be run as root"), and CI and our machines run
as root with no server started. So the server is initialised and run as the `postgres`
system user (Debian's package creates it) when we are root, as ourselves otherwise, in a
data directory of its own with trust authentication on 127.0.0.1 only, on the port
given. Nothing of the machine's own cluster (`/etc/postgresql`, port 5432) is touched.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60  # pg_ctl -w waits this long for the server to accept connections


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started; the message says why."""


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


@dataclass
class PrivateServer:
    datadir: Path
    port: int
    pg_ctl: str
    prefix: tuple[str, ...]

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.datadir / "data"), "-m", "fast", "-w", "stop"],
                       capture_output=True, check=False, timeout=START_TIMEOUT_S)
        shutil.rmtree(self.datadir, ignore_errors=True)


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S + 30)
    if done.returncode != 0:
        raise PostgresUnavailable(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-800:]}")


def start_private_postgres(*, port: int) -> PrivateServer:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise PostgresUnavailable("no initdb/pg_ctl found (make test installs Debian's postgresql)")
    prefix: tuple[str, ...] = ()
    datadir = Path(tempfile.mkdtemp(prefix="gpu-capacity-pg-"))
    if os.geteuid() == 0:
        try:
            import pwd

            owner = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PostgresUnavailable("running as root and there is no `postgres` user to run the server as") from exc
        os.chown(datadir, owner.pw_uid, owner.pw_gid)
        prefix = ("runuser", "-u", "postgres", "--")
    server = PrivateServer(datadir=datadir, port=port, pg_ctl=pg_ctl, prefix=prefix)
    try:
        _run([*prefix, initdb, "-D", str(datadir / "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8",
              "--no-sync"], "initdb")
        options = f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        _run([*prefix, pg_ctl, "-D", str(datadir / "data"), "-o", options, "-l", str(datadir / "log"),
              "-w", "-t", str(START_TIMEOUT_S), "start"], "pg_ctl start")
    except (PostgresUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        log = datadir / "log"
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        shutil.rmtree(datadir, ignore_errors=True)
        raise PostgresUnavailable(f"{exc}{' | server log: ' + tail if tail else ''}") from exc
    return server
