"""docs/architecture.md is the map of the code: every module or folder it names must exist."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
# A path in backticks or in the diagram: folders end with "/", modules with ".py".
PATH = re.compile(r"(?<![\w/.<])((?:[a-z_]+/)+(?:[a-z_]+\.py)?|[a-z_]+\.py)(?![\w<])")


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text) if not m.group(1).startswith(("api/", "tests/capacity/test_"))}


def test_every_module_the_architecture_names_exists():
    names = named_paths(DOC.read_text())
    assert len(names) > 30, "the map names the modules it speaks of"
    # A bare module name ("models.py") is a layer's name, not a path. A lone folder ("defrag/"
    # in the diagram's capacity box) is an app or a package of one.
    apps = [ROOT, *(d for d in ROOT.iterdir() if d.is_dir())]
    missing = sorted(n for n in names if "/" in n and not (
        (ROOT / n).exists() if "/" in n.rstrip("/") else any((a / n).is_dir() for a in apps)))
    assert not missing, f"docs/architecture.md names modules that are gone: {missing}"


def test_the_check_sees_a_missing_module():
    assert named_paths("see `capacity/nothing_here.py`") == {"capacity/nothing_here.py"}
    assert not (ROOT / "capacity/nothing_here.py").exists()
