"""Every number and every on/off switch read from the environment, as an operator sets them:
a value that is not a plain number in its range, or not one of the on/off words, stops the
product at start-up naming the variable; a good value is read as written; empty is unset."""
from __future__ import annotations

import pytest

from tests.settings_check import manage_check, settings_read


def refused(proc, name: str, wanted: str) -> None:
    assert proc.returncode != 0
    assert f"ImproperlyConfigured: {name} must " in proc.stderr and wanted in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("name", "value", "wanted"), [
    # django-environ's float failed on this with an error naming no variable
    ("READYZ_TIMEOUT_SECONDS", "nan", "the seconds each readiness check may take: a number above 0 and at most 60, "
                                      "not 'nan'"),
    ("KUBE_REQUEST_TIMEOUT", "inf", "not 'inf'"),
    # ... and read these as 112 s, 24 s and 0.5 days
    ("KUBE_REQUEST_TIMEOUT", "1e12", "the seconds one Kubernetes API request may take: a number above 0 and at "
                                     "most 300, not '1e12'"),
    ("CAPACITY_DEFRAG_TIMEOUT_SECONDS", "24h", "the seconds a defrag job may run: a whole number at least 1 and at "
                                               "most 86400, not '24h'"),
    ("PRUNER_SKIP_RETENTION_DAYS", "0.5abc", "the days a prune run's skip rows are kept: a number above 0 and at "
                                             "most 3650, not '0.5abc'"),
    # django-environ's int raised a bare ValueError naming no variable
    ("KUBE_RETRY_ATTEMPTS", "abc", "the attempts in all of a Kubernetes API request: a whole number at least 1 and "
                                   "at most 20, not 'abc'"),
    ("DJANGO_SECURE_HSTS_SECONDS", "1e12", "a whole number at least 0 and at most 315360000, not '1e12'"),
    ("DJANGO_SESSION_COOKIE_AGE", "8h", "the seconds a panel login lasts: a whole number at least 60"),
    ("CAPACITY_DEFRAG_MAX_RUNNING_PER_CLUSTER", "2.5", "a whole number at least 0 and at most 100, not '2.5'"),
    # ... and took negatives: a budget of -1 would have written all but one change
    ("BINPACK_MAX_WRITES", "-1", "the most pods one binpack run patches: a whole number at least 0, not '-1'"),
    ("KUBE_RETRY_BACKOFF", "-0.5", "a number at least 0 and at most 60, not '-0.5'"),
    ("CAPACITY_MAP_CACHE_SECONDS", "-1", "a whole number at least 0 and at most 300, not '-1'"),
    # zero where a run needs more than nothing
    ("KUBE_RETRY_ATTEMPTS", "0", "at least 1 and at most 20, not '0'"),
    ("CELERY_BEAT_MAX_INTERVAL", "0", "the most seconds beat sleeps between checks: a number above 0 and at most "
                                      "3600, not '0'"),
    ("RUNBOOK_UNBLOCK_GRACE_SECONDS", "0", "a whole number at least 1 and at most 300, not '0'"),
    # the ranges that were checked by hand before, kept
    ("PRUNER_SKIP_RETENTION_DAYS", "0", "a number above 0 and at most 3650, not '0'"),
    ("CAPACITY_DEFRAG_ABORT_DEADLINE_SECONDS", "86401", "a whole number at least 1 and at most 86400, not '86401'"),
    ("BINPACK_WRITE_CONCURRENCY", "33", "the cost patches in flight at once: a whole number at least 1 and at most "
                                        "32, not '33'"),
    # read by the worker with int() when it was ready, after the start
    ("CELERY_METRICS_PORT", "70000", "the port a worker serves its metrics on: a whole number at least 1 and at "
                                     "most 65535, not '70000'"),
])
def test_a_bad_number_stops_the_start_naming_the_variable(name, value, wanted):
    refused(manage_check(**{name: value}), name, wanted)


@pytest.mark.parametrize("env", [
    {"KUBE_RETRY_BACKOFF_MAX": "0.1"},   # below the default first wait, 0.2 s
    {"KUBE_RETRY_BACKOFF": "5", "KUBE_RETRY_BACKOFF_MAX": "1"},
])
def test_a_backoff_cap_below_the_first_backoff_names_both(env):
    proc = manage_check(**env)
    backoff = env.get("KUBE_RETRY_BACKOFF", "0.2")
    refused(proc, "KUBE_RETRY_BACKOFF_MAX", f"KUBE_RETRY_BACKOFF_MAX must be at least KUBE_RETRY_BACKOFF (the cap on "
                                            f"the waits between retries cannot be below the first wait), not "
                                            f"{env['KUBE_RETRY_BACKOFF_MAX']} s with KUBE_RETRY_BACKOFF at {backoff} s")


@pytest.mark.parametrize(("hours", "throttle"), [("0.01", "60"), ("1", "3600")])
def test_a_dormancy_period_within_one_activity_window_is_refused_naming_both(hours, throttle):
    proc = manage_check(ORGS_DORMANT_AFTER_HOURS=hours, ORGS_ACTIVITY_THROTTLE_SECONDS=throttle)
    refused(proc, "ORGS_DORMANT_AFTER_HOURS", f"ORGS_DORMANT_AFTER_HOURS must be longer than "
                                              f"ORGS_ACTIVITY_THROTTLE_SECONDS (activity is recorded once per window, "
                                              f"so an org in constant use would look idle for up to a window), not "
                                              f"{hours} h with ORGS_ACTIVITY_THROTTLE_SECONDS at {throttle} s")


def test_a_dormancy_period_just_over_one_activity_window_starts():
    proc = manage_check(ORGS_DORMANT_AFTER_HOURS="0.02", ORGS_ACTIVITY_THROTTLE_SECONDS="60")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("name", "value"), [
    ("DJANGO_DEBUG", "ture"),
    ("DJANGO_HTTPS", "yes please"),
    ("KUBE_IN_CLUSTER", "2"),
    ("BINPACK_OVERRIDE_MANUAL", "enabled"),
])
def test_an_unknown_word_for_a_switch_stops_the_start_naming_the_variable(name, value):
    # django-environ read each of these as False, silently
    refused(manage_check(**{name: value}), name,
            f"{name} must be on or off: one of true/false, 1/0, yes/no, on/off (any case), not {value!r}")


# variable: the setting it sets
SWITCHES = {"DJANGO_HTTPS": "HTTPS", "DJANGO_SECURE_HSTS_PRELOAD": "SECURE_HSTS_PRELOAD",
            "BINPACK_OVERRIDE_MANUAL": "BINPACK_OVERRIDE_MANUAL", "CELERY_TASK_ALWAYS_EAGER": "CELERY_TASK_ALWAYS_EAGER"}


@pytest.mark.parametrize(("words", "read"), [
    (("TRUE", "1", " yes ", "On"), "True"),
    (("False", "0", "NO", "off"), "False"),
])
def test_every_on_off_word_is_read_in_any_case(words, read):
    assert settings_read(*SWITCHES.values(), **dict(zip(SWITCHES, words))) == [read] * len(SWITCHES)


def test_good_numbers_are_read_as_written():
    read = settings_read("KUBE_REQUEST_TIMEOUT", "CELERY_BEAT_MAX_INTERVAL", "KUBE_RETRY_BACKOFF",
                         "KUBE_RETRY_BACKOFF_MAX", "KUBE_RETRY_ATTEMPTS", "SECURE_HSTS_SECONDS", "BINPACK_MAX_WRITES",
                         "CELERY_METRICS_PORT",
                         KUBE_REQUEST_TIMEOUT="7.5", CELERY_BEAT_MAX_INTERVAL="1.5e1",
                         KUBE_RETRY_BACKOFF="2", KUBE_RETRY_BACKOFF_MAX="2",   # a cap equal to the first wait
                         KUBE_RETRY_ATTEMPTS="1", DJANGO_SECURE_HSTS_SECONDS="63072000", BINPACK_MAX_WRITES=" 0 ",
                         CELERY_METRICS_PORT="9808")
    assert read == ["7.5", "15.0", "2.0", "2.0", "1", "63072000", "0", "9808"]


def test_an_empty_value_is_the_default():
    read = settings_read("KUBE_REQUEST_TIMEOUT", "KUBE_RETRY_ATTEMPTS", "CAPACITY_MAP_CACHE_SECONDS",
                         "PRUNER_SKIP_RETENTION_DAYS", "CELERY_METRICS_PORT", "HTTPS", "BINPACK_OVERRIDE_MANUAL",
                         KUBE_REQUEST_TIMEOUT="", KUBE_RETRY_ATTEMPTS=" ", CAPACITY_MAP_CACHE_SECONDS="",
                         PRUNER_SKIP_RETENTION_DAYS="", CELERY_METRICS_PORT="",
                         DJANGO_HTTPS="", BINPACK_OVERRIDE_MANUAL=" ")
    # DJANGO_HTTPS defaults to not DEBUG, and these checks run with DJANGO_DEBUG=1
    assert read == ["30.0", "5", "15", "7.0", "None", "False", "False"]


@pytest.mark.parametrize(("name", "bounds"), [
    ("CAPACITY_DEFRAG_POLL_SECONDS", "POLL_RANGE"),
    ("CAPACITY_DEFRAG_TIMEOUT_SECONDS", "TIMEOUT_RANGE"),
])
def test_a_defrag_default_has_the_bounds_a_job_start_checks(name, bounds):
    """A default outside what defrag_job_start accepts would fail every job started with it."""
    from capacity.defrag import services

    low, high = getattr(services, bounds)
    refused(manage_check(**{name: "-1"}), name, f"at least {low:g} and at most {high:g}, not '-1'")


@pytest.mark.parametrize("value", ["dollars", "usd", "US$", "EURO"])
def test_a_currency_that_is_not_a_three_letter_code_stops_the_start(value):
    refused(manage_check(SAVINGS_CURRENCY=value), "SAVINGS_CURRENCY",
            f"a three-letter currency code such as USD or EUR, not {value!r}")


def test_the_currency_is_read_as_written_and_empty_is_usd():
    assert settings_read("SAVINGS_CURRENCY", SAVINGS_CURRENCY="EUR") == ["EUR"]
    assert settings_read("SAVINGS_CURRENCY", SAVINGS_CURRENCY=" ") == ["USD"]
