"""Settings, all read from the environment (django-environ).

Defaults give an embedded set-up that needs no services: SQLite under `var/`, an
in-process cache and a filesystem Celery broker when no Redis URL is set.
"""
from __future__ import annotations

import math
import re
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from clusters.labels import SERVING_GROUP_LABEL  # plain constants, no Django import

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)


def _plain(number: float) -> str:
    """A bound as an operator writes it: 31536000, 0.1 (not :g's 3.1536e+07)."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _env_number(name: str, *, default: float | None, kind: type, low: float | None, high: float | None = None,
                above: bool = False, what: str) -> float | None:
    """A number from the environment (unset or empty: `default`), refused by name with
    ImproperlyConfigured unless it is a plain, finite `kind` (int: a whole number) at least
    `low` (`above`: more than `low`) and at most `high`. Not env.float/env.int: django-environ's
    float keeps only the digits, signs and separators of the text ("1e12" read as 112,
    "1.5e1" as 1.51, "24h" as 24) and fails on "nan" with an error naming no variable; its
    int fails on "abc" with a bare ValueError naming no variable."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    # isfinite: NaN fails every comparison and inf passes a missing bound; neither is a setting.
    if value is None or not math.isfinite(value) \
            or (low is not None and not ((value > low) if above else (value >= low))) \
            or (high is not None and not value <= high):
        bounds = " and ".join(([f"{'above' if above else 'at least'} {_plain(low)}"] if low is not None else [])
                              + ([f"at most {_plain(high)}"] if high is not None else []))
        bounds = f" {bounds}" if bounds else ""
        raise ImproperlyConfigured(f"{name} must be {what}: a {'whole ' if kind is int else ''}number{bounds}, "
                                   f"not {raw!r}")
    return value


# The words an on/off setting may be (any case). Not env.bool: django-environ reads every
# word it does not know ("ture", "yes please", "2") as False, silently.
_FLAG_WORDS = {"true": True, "1": True, "yes": True, "on": True,
               "false": False, "0": False, "no": False, "off": False}


def _env_flag(name: str, *, default: bool) -> bool:
    """An on/off setting from the environment (unset or empty: `default`), refused by name
    with ImproperlyConfigured unless it is one of `_FLAG_WORDS`."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        return _FLAG_WORDS[raw.lower()]
    except KeyError:
        raise ImproperlyConfigured(f"{name} must be on or off: one of true/false, 1/0, yes/no, on/off "
                                   f"(any case), not {raw!r}") from None


DEBUG = _env_flag("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. With DJANGO_DEBUG off the secret key must come from the "
            "environment (50+ random characters: python -c 'import secrets; print(secrets.token_urlsafe(50))'). "
            "For a local demo set DJANGO_DEBUG=1 instead (make demo does).")
    SECRET_KEY = "django-insecure-demo-key-only-valid-with-DJANGO_DEBUG"
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])  # https://panel.example.com

# --- HTTPS: on by default when DEBUG is off (`manage.py check --deploy` is clean) ----------
# DJANGO_HTTPS=0 only where the panel is really served over plain HTTP (tests, a laptop).
HTTPS = _env_flag("DJANGO_HTTPS", default=not DEBUG)
SECURE_SSL_REDIRECT = _env_flag("DJANGO_SECURE_SSL_REDIRECT", default=HTTPS)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
# Seconds browsers keep to HTTPS (with HTTPS on, 1 year by default, what the HSTS preload list
# asks for; 0: no header); at most ten years, so a slip of the keyboard cannot pin browsers for ever.
SECURE_HSTS_SECONDS = _env_number("DJANGO_SECURE_HSTS_SECONDS", default=31_536_000 if HTTPS else 0, kind=int,
                                  low=0, high=315_360_000, what="the seconds browsers keep to HTTPS (HSTS)")
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=HTTPS)
SECURE_HSTS_PRELOAD = _env_flag("DJANGO_SECURE_HSTS_PRELOAD", default=HTTPS)
if _env_flag("DJANGO_TRUST_X_FORWARDED_PROTO", default=False):
    # Only behind a TLS-terminating proxy that sets (and strips any client's) X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
# Seconds a panel login lasts (default one shift, 8 h): a minute to a year.
SESSION_COOKIE_AGE = _env_number("DJANGO_SESSION_COOKIE_AGE", default=8 * 3600, kind=int, low=60, high=31_536_000,
                                 what="the seconds a panel login lasts")

# --- The control plane's own observability (config/observability.py, config/health.py) ---
# Bearer token for /metrics; unset = /metrics open with DEBUG on, 403 with DEBUG off.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# Seconds per readiness check: above 0, at most a minute (the kubelet's probe gives up long before;
# deploy/web.yaml waits 5 s).
READYZ_TIMEOUT_SECONDS = _env_number("READYZ_TIMEOUT_SECONDS", default=2.0, kind=float, low=0, above=True, high=60,
                                     what="the seconds each readiness check may take")

INSTALLED_APPS = [
    "admin_interface",
    "colorfield",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "heroicons",  # the panel's icons as inline SVG (no emoji font needed)
    "clusters",
    "orgs",
    "pruning",
    "capacity",
    "audit",  # the one audit trail every app writes through audit.services.audit
    "savings",  # GPU-hours saved per cluster, computed from the other apps' records
    "demo",  # demo-only controls; they refuse to run unless DEMO_MODE is set
]
X_FRAME_OPTIONS = "SAMEORIGIN"  # django-admin-interface shows related-object popups in frames
SILENCED_SYSTEM_CHECKS = ["security.W019"]

MIDDLEWARE = [
    # IMPORTANT: first, before any Host check or HTTPS redirect (probes and scrapes reach
    # a pod by IP over plain HTTP; see config/health.py).
    "config.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The panel's CSS/JS under gunicorn, from STATIC_ROOT (`collectstatic` in the image).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",  # django-admin-interface's language chooser
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Every time the panel shows carries its zone ("2026-11-24 20:15:03 UTC"): config/formats/en.
FORMAT_MODULE_PATH = ["config.formats"]
STATIC_URL = "static/"
# The image collects them at build time outside VAR_DIR (STATIC_ROOT=/app/static), since the
# manifests mount an empty, writable volume over VAR_DIR.
STATIC_ROOT = Path(environ.Env().str("STATIC_ROOT", default=str(VAR_DIR / "static")))

# LOG_FORMAT=json: one JSON object per line (config/logformat.py); default human text.
LOG_FORMAT = env.str("LOG_FORMAT", default="text").lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be 'text' or 'json', not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "config.logformat.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
# Celery's worker replaces the root logger's handlers unless told not to: keep JSON lines JSON.
CELERY_WORKER_HIJACK_ROOT_LOGGER = LOG_FORMAT != "json"

# --- Redis: the cross-process activity throttle and the Celery broker ----------------
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # A dead Redis must not stall activity recording: fail fast, fall back to the DB.
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
else:
    # Without Redis, a folder shared by the processes of one host (the demo's web, workers and
    # beat): the GPU reading a worker keeps is then the one /metrics and the pages see. Unset,
    # each process keeps its own.
    CACHE_DIR = env.str("CACHE_DIR", default="")
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": CACHE_DIR}
              if CACHE_DIR else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# The panel's theme (django-admin-interface) is kept per process, not in Redis: a Redis that
# is down must not turn every panel page into an error page while operators need the panel.
CACHES["admin_interface"] = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                             "LOCATION": "admin-interface", "TIMEOUT": 300}

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "celery-queue"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(VAR_DIR / "celery-processed"),
        # kombu's default is ./control, relative to wherever a command was started.
        "control_folder": str(VAR_DIR / "celery-control"),
        "store_processed": False,
    }
else:
    # Priorities 0..9 on Redis, where 0 is served FIRST (kombu polls the priority lists in
    # order): the disabling of scale to zero jumps the queue (orgs.tasks.HIGH_PRIORITY).
    # visibility_timeout: a message a worker took but has not acknowledged (acks_late) goes
    # back to the queue after this many seconds. It must exceed the longest task and any
    # countdown (a defrag step task runs ~20 s and re-queues itself at most a minute ahead),
    # or Redis hands the same message to a second worker; kombu's default is one hour,
    # which left a job unstepped that long after its worker was killed. Leases in the
    # job row keep two workers from stepping one job even when a message is delivered twice.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"priority_steps": list(range(10)), "visibility_timeout": 300}
# Which queue each task runs on (config/queues.py; the README's queue table): beat's
# fan-outs, per-cluster sweeps, org applies and long operations never wait behind each other.
from config import queues as _queues  # noqa: E402 - a plain table, no Django import

CELERY_TASK_ROUTES = _queues.ROUTES
CELERY_TASK_DEFAULT_QUEUE = _queues.SWEEP
# Declared, so a worker started without -Q consumes them all and a
# message queued before an upgrade on `celery` is still run. Each its own routing key: on
# a shared routing key a direct exchange would copy one message into every queue.
CELERY_TASK_QUEUES = tuple(_queues.queue(name) for name in (*_queues.ALL, _queues.LEGACY))
CELERY_TASK_DEFAULT_PRIORITY = 5  # unprioritised messages would otherwise land in 0, the fastest lane
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# A task whose worker process died (OOM, SIGKILL, a rolling deploy) is re-queued rather than
# dropped: with acks_late alone Celery acknowledges the message of a lost pool child, and a
# defrag job would wait for the once-a-minute resume. Every task is safe to redo (steps
# re-read and record before moving on).
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = _env_flag("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULER = "config.beat:ClockedDatabaseScheduler"
# How long beat sleeps at most between checks, in seconds (tests with a fast clock lower it):
# above 0, at most an hour (beat notices a schedule edited in the admin only when it wakes).
CELERY_BEAT_MAX_INTERVAL = _env_number("CELERY_BEAT_MAX_INTERVAL", default=60.0, kind=float, low=0, above=True,
                                       high=3600, what="the most seconds beat sleeps between checks")
# Beat writes a schedule's last run (django-celery-beat's PeriodicTask.last_run_at) as it
# sends it, not every 3 minutes (Celery's default sync): /metrics exports that time and the
# alert on a periodic job not run within twice its interval reads it (deploy/alerts.yaml),
# which for a 10 s schedule must not lag by minutes. One small UPDATE per task sent.
CELERY_BEAT_SYNC_EVERY = 1
# The port a Celery worker serves its own /metrics on (config/observability.py; unset: none).
CELERY_METRICS_PORT = _env_number("CELERY_METRICS_PORT", default=None, kind=int, low=1, high=65_535,
                                  what="the port a worker serves its metrics on")
CELERY_METRICS_ADDR = env.str("CELERY_METRICS_ADDR", default="0.0.0.0")
CELERY_TIMEZONE = "UTC"

# --- The injected clock (config/clock.py) ---------------------------------------------
# A file holding a number of seconds to add to the wall clock; tests move time with it.
CLOCK_OFFSET_FILE = env.str("CLOCK_OFFSET_FILE", default="")
# Set by `make demo` only: enables the demo controls (demo_clock, demo_load).
DEMO_MODE = _env_flag("DEMO_MODE", default=False)

# --- The default cluster ------------------------------------------------------------
DEFAULT_CLUSTER_NAME = env.str("CLUSTER_NAME", default="default")
KUBECONFIG = env.str("KUBECONFIG", default="")
KUBE_CONTEXT = env.str("KUBE_CONTEXT", default="")
KUBE_IN_CLUSTER = _env_flag("KUBE_IN_CLUSTER", default=False)
PROMETHEUS_URL = env.str("PROMETHEUS_URL", default="")
# The *name* of the variable holding the token for the default cluster; never the token.
PROMETHEUS_TOKEN_ENV = env.str("PROMETHEUS_TOKEN_ENV", default="PROMETHEUS_TOKEN")
# Gateway retries (clusters/kube.py), all inside one call, so inside one task: attempts in
# all (1: no retry; at most 20), the first wait and the cap on any wait in seconds (0..60: a
# worker sleeps through them; the cap not below the first wait).
KUBE_RETRY_ATTEMPTS = _env_number("KUBE_RETRY_ATTEMPTS", default=5, kind=int, low=1, high=20,
                                  what="the attempts in all of a Kubernetes API request")
KUBE_RETRY_BACKOFF = _env_number("KUBE_RETRY_BACKOFF", default=0.2, kind=float, low=0, high=60,
                                 what="the seconds before the first retry of a Kubernetes API request")
KUBE_RETRY_BACKOFF_MAX = _env_number("KUBE_RETRY_BACKOFF_MAX", default=10.0, kind=float, low=0, high=60,
                                     what="the most seconds between two attempts of a Kubernetes API request")
if KUBE_RETRY_BACKOFF_MAX < KUBE_RETRY_BACKOFF:
    raise ImproperlyConfigured(f"KUBE_RETRY_BACKOFF_MAX must be at least KUBE_RETRY_BACKOFF (the cap on the waits "
                               f"between retries cannot be below the first wait), not {_plain(KUBE_RETRY_BACKOFF_MAX)} s "
                               f"with KUBE_RETRY_BACKOFF at {_plain(KUBE_RETRY_BACKOFF)} s")
# Seconds one Kubernetes API request may take: above 0, at most 300 (the broker's
# visibility_timeout above: a task still waiting then is handed to a second worker).
KUBE_REQUEST_TIMEOUT = _env_number("KUBE_REQUEST_TIMEOUT", default=30.0, kind=float, low=0, above=True, high=300,
                                   what="the seconds one Kubernetes API request may take")


# --- Orgs: activity, dormancy and scale to zero -------------------------------------
# Idle hours before an org turns dormant: above 0 (the sweep refuses a period of 0 or less),
# at most ten years.
ORGS_DORMANT_AFTER = timedelta(hours=_env_number("ORGS_DORMANT_AFTER_HOURS", default=24.0, kind=float, low=0,
                                                 above=True, high=87_600,
                                                 what="the idle hours before an org turns dormant"))
# At most one database write per org per window, across all processes (seconds; 0: every call writes).
ORGS_ACTIVITY_THROTTLE_SECONDS = _env_number("ORGS_ACTIVITY_THROTTLE_SECONDS", default=60, kind=int, low=0,
                                             high=86_400, what="the seconds between two activity writes of an org")
# The throttle keeps the first write of a window and drops the rest, so the recorded activity
# lags the last real one by up to a window: with a dormancy period no longer than that, an org
# in constant use could be swept to sleep between two recorded writes.
if ORGS_DORMANT_AFTER.total_seconds() <= ORGS_ACTIVITY_THROTTLE_SECONDS:
    raise ImproperlyConfigured(
        f"ORGS_DORMANT_AFTER_HOURS must be longer than ORGS_ACTIVITY_THROTTLE_SECONDS (activity is recorded once "
        f"per window, so an org in constant use would look idle for up to a window), not "
        f"{_plain(ORGS_DORMANT_AFTER.total_seconds() / 3600)} h with ORGS_ACTIVITY_THROTTLE_SECONDS at "
        f"{ORGS_ACTIVITY_THROTTLE_SECONDS} s")
# How many orgs one sweep may switch to dormant (a budget, so a clock jump cannot cool all; 0: none).
ORGS_SWEEP_BUDGET = _env_number("ORGS_SWEEP_BUDGET", default=100_000, kind=int, low=0, high=None,
                                what="the most orgs one dormancy sweep may mark dormant")

# --- Savings: money beside GPU-hours ------------------------------------------------------
# The currency the panel's GPU prices are in (an ISO 4217 code: three capital letters).
SAVINGS_CURRENCY = env.str("SAVINGS_CURRENCY", default="USD").strip() or "USD"   # empty is unset
if not re.fullmatch(r"[A-Z]{3}", SAVINGS_CURRENCY):
    raise ImproperlyConfigured(f"SAVINGS_CURRENCY must be a three-letter currency code such as USD or EUR, "
                               f"not {SAVINGS_CURRENCY!r}")

# --- Pruning: the idle-GPU pruner ----------------------------------------------------
PRUNER_RUN_MODE = env.str("PRUNER_RUN_MODE", default="dry-run")
if PRUNER_RUN_MODE not in ("dry-run", "scale-down"):
    raise ImproperlyConfigured(f"PRUNER_RUN_MODE must be dry-run or scale-down, not {PRUNER_RUN_MODE!r}")
# Plain numbers, refused by name when they are not; their ranges are checked (and named) by
# the pruner's own parameters when a run starts.
PRUNER_DURATION_MINUTES = _env_number("PRUNER_DURATION_MINUTES", default=30, kind=int, low=None,
                                      what="the idle window in minutes")
PRUNER_IDLE_THRESHOLD = _env_number("PRUNER_IDLE_THRESHOLD", default=0.01, kind=float, low=None,
                                    what="the idle utilization, a fraction of 1")
PRUNER_GRACE_SECONDS = _env_number("PRUNER_GRACE_SECONDS", default=300, kind=int, low=None,
                                   what="the grace period in seconds")
PRUNER_MAX_SCALE_DOWNS = _env_number("PRUNER_MAX_SCALE_DOWNS", default=20, kind=int, low=None,
                                     what="the most owners scaled down per run")
PRUNER_LABEL_SCHEME = env.str("PRUNER_LABEL_SCHEME", default="auto")  # auto, pod, exported
# Watts: a GPU drawing more is not idle whatever its utilization (unset: power not looked at).
PRUNER_POWER_THRESHOLD_WATTS = _env_number("PRUNER_POWER_THRESHOLD_WATTS", default=None, kind=float, low=None,
                                           what="the power draw in watts above which a GPU is busy")
PRUNER_OWNER_KINDS = env.list("PRUNER_OWNER_KINDS", default=[])  # e.g. Deployment,InferenceService; empty: all
PRUNER_PROTECTED_NAMESPACES = env.list("PRUNER_PROTECTED_NAMESPACES",
                                       default=["kube-system", "kube-public", "kube-node-lease"])
if not [n for n in PRUNER_PROTECTED_NAMESPACES if n.strip()]:
    raise ImproperlyConfigured("PRUNER_PROTECTED_NAMESPACES must name at least one namespace the pruner never "
                               "touches (unset: kube-system, kube-public, kube-node-lease)")
# Days a prune run's skip rows are kept (the run keeps its counts per reason); pruned by the beat.
PRUNER_SKIP_RETENTION_DAYS = _env_number("PRUNER_SKIP_RETENTION_DAYS", default=7.0, kind=float, low=0, above=True,
                                         high=3650, what="the days a prune run's skip rows are kept")

# --- Capacity: defrag jobs (empty a GPU node safely) ---------------------------------
# A job's defaults: its timeout and the seconds between two checks. The same bounds as an
# operator's own choice in the panel (capacity.defrag.services.TIMEOUT_RANGE, POLL_RANGE), so
# the default never fails a job start.
CAPACITY_DEFRAG_TIMEOUT_SECONDS = _env_number("CAPACITY_DEFRAG_TIMEOUT_SECONDS", default=1800, kind=int, low=1,
                                              high=86_400, what="the seconds a defrag job may run")
CAPACITY_DEFRAG_POLL_SECONDS = _env_number("CAPACITY_DEFRAG_POLL_SECONDS", default=10.0, kind=float, low=0.1,
                                           high=3600, what="the seconds between two checks of a defrag job")
# Defrag jobs running at once in one cluster, each emptying a node (0: no new job starts).
CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER = _env_number("CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER", default=2, kind=int,
                                                      low=0, high=100,
                                                      what="the most defrag jobs running at once in a cluster")
# How long an abort waits for replacements to become ready before it stops as abort-stuck,
# naming what holds the room and leaving the choice (keep or delete the orphans) to the operator.
CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS = _env_number("CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS", default=300, kind=int,
                                                     low=1, high=86_400,
                                                     what="the seconds an abort waits for replacements")
# How often an abort-stuck job is checked again on its own: its orphans end once they can
# (their revision scaled to zero, or their replacements ready), so none holds its GPUs until
# someone happens to look. 10 s is the resume beat that queues it; a day is the longest
# an orphan that could end may go on holding its GPUs.
CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS = _env_number("CAPACITY_DEFRAG_ABORT_RECHECK_SECONDS", default=300, kind=int,
                                                    low=10, high=86_400,
                                                    what="the seconds between two checks of an abort-stuck job")
# --- Capacity: consolidation campaigns --------------------------------------------------
# The most of one Knative revision's ready pods a campaign's running defrag jobs may be moving
# at once (0 < fraction <= 1). A revision no running job moves may always move one node's pods.
CAPACITY_CAMPAIGN_REVISION_FRACTION = _env_number("CAPACITY_CAMPAIGN_REVISION_FRACTION", default=0.5, kind=float,
                                                  low=0, above=True, high=1,
                                                  what="the fraction of a revision's ready pods a campaign moves at once")
# Seconds between two passes of a running campaign (its defrag jobs keep their own poll).
CAPACITY_CAMPAIGN_POLL_SECONDS = _env_number("CAPACITY_CAMPAIGN_POLL_SECONDS", default=10.0, kind=float, low=0.1,
                                             high=3600, what="the seconds between two passes of a campaign")
# Seconds one reading of a cluster serves its dashboard and GPU map (the pages say how old
# it is); 0 reads the cluster for every page. At 5,000 nodes a reading takes about two
# seconds; longer than the dashboard's own 10 s reload, so an open page reads at most every
# other reload.
CAPACITY_MAP_CACHE_SECONDS = _env_number("CAPACITY_MAP_CACHE_SECONDS", default=15, kind=int, low=0, high=300,
                                         what="the seconds one reading of a cluster serves its pages")
# How the cluster's kube-scheduler scores nodes (NodeResourcesFit scoringStrategy type): the
# defrag advice places each replacement where that scheduler would. LeastAllocated is
# kube-scheduler's default (spreads onto the emptiest node, often an empty one: emptying a
# node then frees nothing); MostAllocated for clusters configured to bin-pack. The values
# are capacity.gpumap.advice.Scoring's.
# Days of history kept of the campaign proposals (advice, not records of acts): a pool's latest
# proposal is kept whatever its age; older ones go after this many days. Above 0, at most a year.
CAPACITY_CAMPAIGN_PROPOSAL_DAYS = _env_number("CAPACITY_CAMPAIGN_PROPOSAL_DAYS", default=3.0, kind=float, low=0,
                                              above=True, high=366, what="the days campaign proposals are kept")
# The least minutes between two campaigns a pool starts on its own under a policy with no
# schedule (always open); a scheduled policy starts at most one each time its schedule fires.
CAPACITY_CAMPAIGN_AUTO_GAP_MINUTES = _env_number("CAPACITY_CAMPAIGN_AUTO_GAP_MINUTES", default=60, kind=int, low=1,
                                                 high=10_080, what="the minutes between two automatic campaigns "
                                                                   "of an always-open pool policy")
CAPACITY_SCHEDULER_SCORING = env.str("CAPACITY_SCHEDULER_SCORING", default="LeastAllocated")
if CAPACITY_SCHEDULER_SCORING not in ("LeastAllocated", "MostAllocated"):
    raise ImproperlyConfigured(f"CAPACITY_SCHEDULER_SCORING must be LeastAllocated (kube-scheduler's default) or "
                               f"MostAllocated (a bin-packing scheduler), not {CAPACITY_SCHEDULER_SCORING!r}")

# --- Capacity: binpack deletion costs and the model-serving runbook --------------------
# Pods sharing a value of this label form one group, ranked as a whole (Kthena's own
# ModelServing pods are grouped by modelserving.volcano.sh/group-name regardless).
BINPACK_GROUP_LABEL = env.str("BINPACK_GROUP_LABEL", default=SERVING_GROUP_LABEL)
# Overwrite costs an operator set by hand (pods without our marker annotation).
BINPACK_OVERRIDE_MANUAL = _env_flag("BINPACK_OVERRIDE_MANUAL", default=False)
# Pods patched per run, a budget (0: a run plans and writes nothing; the rest waits for the next).
BINPACK_MAX_WRITES = _env_number("BINPACK_MAX_WRITES", default=10_000, kind=int, low=0,
                                 what="the most pods one binpack run patches")
# Cost patches in flight at once (1..32): a first costing of a large cluster is thousands
# of writes; a few at a time keep the API server busy without flooding it.
BINPACK_WRITE_CONCURRENCY = _env_number("BINPACK_WRITE_CONCURRENCY", default=8, kind=int, low=1, high=32,
                                        what="the cost patches in flight at once")
# The runbook's "delete the old revision" stops that revision's pods with this grace period,
# in seconds (1..300; Knative's own is the revision timeout, 300 s), so the Pending
# revision gets the GPUs at once. Not 0: a forced delete frees the GPU in the API while
# the old container may still hold it.
RUNBOOK_UNBLOCK_GRACE_SECONDS = _env_number("RUNBOOK_UNBLOCK_GRACE_SECONDS", default=5, kind=int, low=1, high=300,
                                            what="the grace period in seconds of the old revision's pods")
# Resource defaults per model framework (KServe modelFormat name; "default" for the rest).
# A ResourceSpec in the admin overrides any of them for one model.
RUNBOOK_RESOURCE_DEFAULTS = {
    "default": {"gpu_count": 1, "gpu_product": "", "cpu_request": "4", "cpu_limit": "8",
                "memory_request": "16Gi", "memory_limit": "32Gi"},
    "vllm": {"gpu_count": 1, "gpu_product": "", "cpu_request": "8", "cpu_limit": "16",
             "memory_request": "64Gi", "memory_limit": "64Gi"},
    "pytorch": {"gpu_count": 1, "gpu_product": "", "cpu_request": "4", "cpu_limit": "8",
                "memory_request": "32Gi", "memory_limit": "32Gi"},
    "sklearn": {"gpu_count": 0, "gpu_product": "", "cpu_request": "1", "cpu_limit": "2",
                "memory_request": "2Gi", "memory_limit": "4Gi"},
}
