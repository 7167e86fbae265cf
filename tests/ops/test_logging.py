"""LOG_FORMAT=json: one JSON object per line, from a real process configured by the settings."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from config.logformat import JsonFormatter

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = """
import django
django.setup()  # what every process does first: web, worker, beat, manage.py
import logging
log = logging.getLogger("capacity.demo")
log.warning("node %s cordoned", "gpu-node-1", extra={"cluster": "prod-a", "job_id": 7})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("step failed")
"""


def _run(log_format: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOG_FORMAT": log_format, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "config.settings"}
    return subprocess.run([sys.executable, "-c", SNIPPET], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_json_logs_are_one_object_per_line():
    proc = _run("json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    mine = [entry for entry in lines if entry["logger"] == "capacity.demo"]
    assert len(mine) == 2, proc.stderr
    warning, error = mine
    assert warning["level"] == "WARNING" and warning["message"] == "node gpu-node-1 cordoned"
    assert (warning["cluster"], warning["job_id"]) == ("prod-a", 7)
    assert warning["ts"].endswith("+00:00")
    assert error["level"] == "ERROR" and "ZeroDivisionError" in error["exc_info"]


def test_text_logs_by_default_are_for_humans():
    proc = _run("text")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING capacity.demo: node gpu-node-1 cordoned" in proc.stderr
    assert not proc.stderr.lstrip().startswith("{")


def test_an_unknown_log_format_is_a_clear_error():
    proc = _run("xml")
    assert proc.returncode != 0
    assert "LOG_FORMAT must be 'text' or 'json'" in proc.stderr


def test_extras_json_cannot_hold_are_logged_as_text():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "at %s", (object,), None)
    record.when = Path("/tmp")
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "at <class 'object'>" and entry["when"] == "/tmp"
