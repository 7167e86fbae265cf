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
    base = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                          env={**base, "DJANGO_DEBUG": "1", **env}, timeout=120)
