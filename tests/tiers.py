"""The tiers a plain `pytest tests` leaves out, and how they join a parallel run.

tests/realcluster needs root, Go and the upstream control plane's build; tests/image needs
root, podman and the product's image. Each runs when asked for by path (`pytest
tests/realcluster`, `make test-real`, `make test-image`) or with `--all-tiers`, which
`make test` gives after building both. In a pytest-xdist run a tier's tests carry an
`xdist_group` mark, so the costly thing they share (the control plane, a module's running
containers) is started by one process only (`--dist loadgroup`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


def tier_collect(config, items, here: Path, group: Callable[[pytest.Item], str]) -> None:
    """Keep `here`'s items (grouped) when asked for, else deselect them."""
    mine = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    if not mine:
        return
    base = Path(config.invocation_params.dir)
    asked = config.getoption("all_tiers") or any(
        (base / str(arg).split("::")[0]).resolve().is_relative_to(here) for arg in config.args)
    if asked:
        for item in mine:
            item.add_marker(pytest.mark.xdist_group(group(item)))
        return
    config.hook.pytest_deselected(items=mine)
    items[:] = [item for item in items if item not in mine]
