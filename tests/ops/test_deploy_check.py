"""Secure settings with DEBUG off: `manage.py check --deploy` is clean; secrets come from the environment."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a deployment decides; everything else must be secure by default.
DEPLOYMENT_ONLY = ("DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DJANGO_HTTPS",
                   "DJANGO_SECURE_SSL_REDIRECT", "DJANGO_SECURE_HSTS_SECONDS", "DJANGO_SECURE_HSTS_PRELOAD",
                   "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "METRICS_TOKEN")


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in DEPLOYMENT_ONLY}
    # A demo running from this checkout leaves var/demo.env, which manage.py reads when no
    # secret key is set; these checks are of a deployment, so they get a VAR_DIR of their own.
    base["VAR_DIR"] = str(ROOT / "var" / "deploy-check")
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_with_production_settings():
    proc = _manage("check", "--deploy", "--fail-level", "WARNING",
                   DJANGO_SECRET_KEY=secrets.token_urlsafe(50), DJANGO_ALLOWED_HOSTS="capacity.example.com")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "System check identified no issues" in proc.stdout
    assert "WARNINGS" not in proc.stdout + proc.stderr


def test_without_a_secret_key_debug_off_refuses_to_start():
    proc = _manage("check", DJANGO_ALLOWED_HOSTS="capacity.example.com")
    assert proc.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in proc.stderr


def test_the_demo_runs_with_debug_and_no_secret():
    proc = _manage("check", DJANGO_DEBUG="1")
    assert proc.returncode == 0, proc.stderr


def test_production_settings_values():
    proc = _manage("shell", "-c", "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
                   "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.DEBUG, s.ALLOWED_HOSTS)",
                   DJANGO_SECRET_KEY=secrets.token_urlsafe(50), DJANGO_ALLOWED_HOSTS="a.example.com,b.example.com")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "True True True 31536000 False ['a.example.com', 'b.example.com']"
