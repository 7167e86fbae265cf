"""The ORGS_* settings as an operator sets them: a bad value stops the product at start-up,
naming the variable; a plain number is read as written."""
from __future__ import annotations

import pytest

from tests.settings_check import manage_check, settings_read


@pytest.mark.parametrize(("name", "value", "wanted"), [
    # django-environ's float read these as 112 h, 1.51 h and 24 h
    ("ORGS_DORMANT_AFTER_HOURS", "1e12", "the idle hours before an org turns dormant: a number above 0 and at most "
                                         "87600, not '1e12'"),
    ("ORGS_DORMANT_AFTER_HOURS", "24h", "a number above 0 and at most 87600, not '24h'"),
    ("ORGS_DORMANT_AFTER_HOURS", "nan", "not 'nan'"),
    ("ORGS_DORMANT_AFTER_HOURS", "inf", "not 'inf'"),
    ("ORGS_DORMANT_AFTER_HOURS", "abc", "not 'abc'"),
    # these started, then every sweep raised
    ("ORGS_DORMANT_AFTER_HOURS", "0", "not '0'"),
    ("ORGS_DORMANT_AFTER_HOURS", "-5", "not '-5'"),
    ("ORGS_SWEEP_BUDGET", "-1", "the most orgs one dormancy sweep may mark dormant: a whole number at least 0, "
                                "not '-1'"),
    ("ORGS_SWEEP_BUDGET", "1.5", "a whole number at least 0, not '1.5'"),
    ("ORGS_ACTIVITY_THROTTLE_SECONDS", "-60", "the seconds between two activity writes of an org: a whole number at "
                                              "least 0 and at most 86400, not '-60'"),
])
def test_a_bad_orgs_setting_stops_the_start_naming_the_variable(name, value, wanted):
    proc = manage_check(**{name: value})
    assert proc.returncode != 0
    assert f"ImproperlyConfigured: {name} must be " in proc.stderr and wanted in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plain_numbers_are_read_as_written():
    read = settings_read("ORGS_DORMANT_AFTER.total_seconds()", "ORGS_SWEEP_BUDGET", "ORGS_ACTIVITY_THROTTLE_SECONDS",
                         ORGS_DORMANT_AFTER_HOURS="1.5e1", ORGS_SWEEP_BUDGET="0", ORGS_ACTIVITY_THROTTLE_SECONDS=" 0 ")
    assert read == ["54000.0", "0", "0"]
