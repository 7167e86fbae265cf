"""Django for a benchmark script: a throw-away SQLite database, migrated, with the
settings' required environment set and no default cluster from the caller's KUBECONFIG.

    import _django
    _django.setup("defrag-bench", extra_paths=["tests/capacity"])
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(prefix: str, *, extra_paths: tuple[str, ...] | list[str] = (), env: dict[str, str] | None = None) -> Path:
    """Set up Django on a fresh SQLite file under a temporary folder, removed when the
    bench exits; returns that folder."""
    for path in [*reversed(extra_paths), ""]:
        entry = str(ROOT / path) if path else str(ROOT)
        if entry not in sys.path:
            sys.path.insert(0, entry)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)   # a bench leaves nothing in /tmp
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'db.sqlite3'}"
    os.environ["VAR_DIR"] = str(folder)   # nothing of a bench lands in the project's var/
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # The settings refuse to start without a key when DEBUG is off.
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)
    os.environ.pop("KUBECONFIG", None)
    os.environ.update(env or {})

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return folder


def postgres_server() -> str:
    """A PostgreSQL server's URL without a database name, for the benches that need one:
    BENCH_POSTGRES_URL, else the server on 127.0.0.1:5432 when one answers, else a private
    server started as the tests start theirs (tests/pgserver.py), stopped at exit."""
    import socket

    import psycopg

    if os.environ.get("BENCH_POSTGRES_URL"):
        return os.environ["BENCH_POSTGRES_URL"].rstrip("/")
    try:
        psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
        return "postgres://postgres@127.0.0.1:5432"
    except psycopg.OperationalError:
        pass
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.pgserver import start_private_postgres

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_private_postgres(port=port)
    atexit.register(server.stop)
    print(f"no PostgreSQL on 127.0.0.1:5432: started a private one on port {port}", flush=True)
    return server.url("postgres").rsplit("/", 1)[0]
