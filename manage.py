#!/usr/bin/env python
"""Django's command-line utility for the GPU capacity control plane.

Beside a running `make demo`, commands work from any shell with no settings: while
DJANGO_SECRET_KEY is not set, the demo's environment file (`var/demo.env`, or under
VAR_DIR; written by scripts/start_demo.py once the demo is up, removed when it stops)
is used — all of it, so a command never mixes the demo's database with another
cluster — and a note on stderr says so. A deployment always sets DJANGO_SECRET_KEY
(the settings refuse to start without it), so it never reads that file.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEMO_ENV_NAME = "demo.env"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def demo_env_path(environ) -> Path:
    return Path(environ.get("VAR_DIR") or ROOT / "var") / DEMO_ENV_NAME


def demo_env_read(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as scripts/start_demo.py writes them (no quoting)."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def demo_env_apply(environ, stderr) -> bool:
    """Use the running demo's environment when no secret key says this is a deployment."""
    if environ.get("DJANGO_SECRET_KEY"):
        return False
    path = demo_env_path(environ)
    try:
        values = demo_env_read(path)
    except FileNotFoundError:
        return False
    raw_pid = values.get("DEMO_PID", "")
    pid = int(raw_pid) if raw_pid.isdigit() else 0
    if not _pid_alive(pid):
        stderr.write(f"manage.py: ignoring {path}: the demo that wrote it (pid {pid}) no longer runs\n")
        return False
    replaced = sorted(k for k, v in values.items() if k in environ and environ[k] != v and k != "DEMO_PID")
    taken = [k for k, v in values.items() if environ.get(k) != v]
    environ.update(values)
    if taken:
        stderr.write(f"manage.py: using the demo's environment from {path} (demo pid {pid})"
                     + (f"; it replaces {', '.join(replaced)} from your shell" if replaced else "")
                     + ". Set DJANGO_SECRET_KEY to use your own settings instead.\n")
    return True


def _deployment_settings(environ) -> list[str]:
    """The product's settings the shell gives (DJANGO_SETTINGS_MODULE aside): a deployment's."""
    return [k for k in environ if (k.startswith("DJANGO_") and k != "DJANGO_SETTINGS_MODULE") or k == "DATABASE_URL"]


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    demo = demo_env_apply(os.environ, sys.stderr)
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # loads the settings: a missing variable is one line, not a traceback
    except ImproperlyConfigured as exc:
        if not demo and not _deployment_settings(os.environ):
            # A plain shell, neither beside a demo nor given a deployment's settings: lead with
            # that, and with what works (the settings' own hint, DJANGO_DEBUG=1, only leads
            # to a refused database connection).
            sys.exit(f"manage.py: no demo is running (no {demo_env_path(os.environ)}) and DJANGO_SECRET_KEY is "
                     "not set, so there are no settings to run with. Start the demo with `make demo` in the "
                     "repository (it prints the panel's address and password) and run this command again from "
                     "any shell; for a deployment, set its environment (DJANGO_SECRET_KEY, DATABASE_URL, ...).")
        sys.exit(f"manage.py: ImproperlyConfigured: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
