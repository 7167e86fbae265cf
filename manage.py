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


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    demo = demo_env_apply(os.environ, sys.stderr)
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # loads the settings: a missing variable is one line, not a traceback
    except ImproperlyConfigured as exc:
        hint = "" if demo else (f" (no demo runs here: `make demo` writes {demo_env_path(os.environ)}, "
                                "which manage.py uses while the demo runs)")
        sys.exit(f"manage.py: ImproperlyConfigured: {exc}{hint}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
