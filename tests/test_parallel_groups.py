"""`make test` runs the suite in pytest-xdist processes with `--dist loadgroup`: the tests of a
group (tests/tiers.py: the real control plane, an image module's containers; the demo) must
run in one process, or each process would start its own. A pytest or pytest-xdist release
that drops the grouping does so silently (the tests still pass, each paying for its own
control plane), so this runs a group of four tests in two processes and reads where they ran."""
from __future__ import annotations

import subprocess
import sys


def test_a_groups_tests_run_in_one_process_and_the_others_spread(tmp_path):
    (tmp_path / "test_grouped.py").write_text('''
import os
from pathlib import Path

import pytest

def _record(name):
    (Path(__file__).parent / name).write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("n", range(4))
def test_in_group(n):
    _record(f"grouped-{n}")

@pytest.mark.parametrize("n", range(8))
def test_free(n):
    import time
    time.sleep(0.2)   # long enough that both processes take some
    _record(f"free-{n}")
''')
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "-q", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    grouped = {(tmp_path / f"grouped-{n}").read_text() for n in range(4)}
    free = {(tmp_path / f"free-{n}").read_text() for n in range(8)}
    assert len(grouped) == 1, f"the group ran in processes {grouped}"
    assert len(free) == 2, f"the ungrouped tests ran only in {free}"
