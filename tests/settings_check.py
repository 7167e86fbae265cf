"""Run `manage.py check` with settings taken from the environment, as an operator starts
the product: does it refuse to start, and say why?"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def manage_check(**env: str) -> subprocess.CompletedProcess:
    """`manage.py check` with these environment variables (and DJANGO_DEBUG=1, so no
    production secrets are needed); its exit code and output."""
    return _manage(["check"], env)


def settings_read(*names: str, **env: str) -> list[str]:
    """The settings `names` as the product reads them with these environment variables,
    each printed with str()."""
    code = "from django.conf import settings as s; print(" + ", ".join(f"s.{n}" for n in names) + ")"
    proc = _manage(["shell", "-c", code], env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1].split()


def _manage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**base, "DJANGO_DEBUG": "1", **env}, timeout=120)
