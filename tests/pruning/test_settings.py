"""The PRUNER_* settings as an operator sets them: a value that is not what it must be stops
the product at start-up, naming the variable; a plain number is read as written."""
from __future__ import annotations

import pytest

from tests.settings_check import manage_check, settings_read


@pytest.mark.parametrize(("name", "value", "wanted"), [
    # django-environ's float failed on these with "could not convert string to float: ''"
    ("PRUNER_IDLE_THRESHOLD", "nan", "the idle utilization, a fraction of 1: a number, not 'nan'"),
    # ... and read this one as 0.5
    ("PRUNER_IDLE_THRESHOLD", "0.5abc", "not '0.5abc'"),
    ("PRUNER_POWER_THRESHOLD_WATTS", "inf W", "not 'inf W'"),
    ("PRUNER_DURATION_MINUTES", "30m", "the idle window in minutes: a whole number, not '30m'"),
    ("PRUNER_RUN_MODE", "scale-dwn", "dry-run or scale-down, not 'scale-dwn'"),
    ("PRUNER_PROTECTED_NAMESPACES", "", "must name at least one namespace the pruner never touches"),
    ("PRUNER_PROTECTED_NAMESPACES", " , ", "must name at least one namespace the pruner never touches"),
])
def test_a_bad_pruner_setting_stops_the_start_naming_the_variable(name, value, wanted):
    proc = manage_check(**{name: value})
    assert proc.returncode != 0
    assert f"ImproperlyConfigured: {name} must " in proc.stderr and wanted in proc.stderr


def test_a_threshold_written_with_an_exponent_is_read_as_written():
    read = settings_read("PRUNER_IDLE_THRESHOLD", "PRUNER_POWER_THRESHOLD_WATTS",
                         PRUNER_IDLE_THRESHOLD="5e-3", PRUNER_POWER_THRESHOLD_WATTS="75")
    assert read == ["0.005", "75.0"]
