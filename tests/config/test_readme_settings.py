"""The README's configuration table says what an operator may set: every variable it names
is read by `config/settings.py`, with the default it states and the range it states (a
value outside that range stops the start). Read from both files as written; no database."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Read by the library that owns it, not by config/settings.py (the README says so).
LIBRARY_OWNED = {"PROMETHEUS_MULTIPROC_DIR": "prometheus-client"}
NUMBER = r"[0-9][0-9_,.]*"


def _number(text: str) -> float:
    return float(text.replace("_", "").replace(",", ""))


def readme_rows() -> list[tuple[list[str], list[str], str]]:
    """(variables, default cells, meaning) of each row of the "Configuration" table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Configuration (environment)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("variable", "---"):
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", cells[0])
        defaults = [d.strip() for d in cells[1].split(",")] if "`" not in cells[1] else [cells[1]]
        rows.append((names, defaults, cells[2]))
    return rows


def readme_ranges(meaning: str) -> list[tuple[float | None, bool, float | None]]:
    """Each range the meaning states, in order: (low, above, high); None where it has no bound."""
    found = []
    pattern = (rf"\(({NUMBER})–({NUMBER})|above ({NUMBER}), at most ({NUMBER})|[(;] ?({NUMBER}) or more\)")
    for m in re.finditer(pattern, meaning):
        if m.group(1):
            found.append((_number(m.group(1)), False, _number(m.group(2))))
        elif m.group(3):
            found.append((_number(m.group(3)), True, _number(m.group(4))))
        else:
            found.append((_number(m.group(5)), False, None))
    return found


def _literal(node: ast.AST | None):
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp):   # 8 * 3600
            return eval(compile(ast.Expression(node), "settings", "eval"), {})   # noqa: S307 - numbers only
        return ...   # an expression of other settings (e.g. on when DEBUG is off)


def settings_reads() -> dict[str, dict]:
    """Every environment variable config/settings.py reads: how (number, flag, str, list, db)
    and, for numbers, the default and bounds it passes."""
    tree = ast.parse((ROOT / "config" / "settings.py").read_text(encoding="utf-8"))
    reads: dict[str, dict] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            continue
        func = node.func
        how = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if how not in ("_env_number", "_env_flag", "str", "list", "db", "bool", "int", "float"):
            continue
        if how != "_env_number" and not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                                         and func.value.id in ("env", "environ")) and how != "_env_flag":
            continue
        kw = {k.arg: k.value for k in node.keywords}
        reads.setdefault(node.args[0].value, {
            "how": how, "default": _literal(kw.get("default")), "low": _literal(kw.get("low")),
            "high": _literal(kw.get("high")), "above": bool(_literal(kw.get("above")) or False)})
    return reads


ROWS = readme_rows()
NAMES = [name for names, _, _ in ROWS for name in names]


def test_the_table_is_read():
    assert len(ROWS) >= 20 and "ORGS_DORMANT_AFTER_HOURS" in NAMES and "READYZ_TIMEOUT_SECONDS" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_variable_the_readme_names_is_read_by_the_settings(name):
    if name in LIBRARY_OWNED:
        assert LIBRARY_OWNED[name] in (ROOT / "README.md").read_text(encoding="utf-8")
        return
    assert name in settings_reads(), f"README's configuration table names {name}; config/settings.py never reads it"


def _numeric_rows():
    for names, defaults, meaning in ROWS:
        numbers = [n for n in names if settings_reads().get(n, {}).get("how") == "_env_number"]
        if numbers:
            yield pytest.param(names, defaults, meaning, id=",".join(names))


@pytest.mark.parametrize(("names", "defaults", "meaning"), list(_numeric_rows()))
def test_each_number_has_the_default_and_range_the_readme_states(names, defaults, meaning):
    reads = settings_reads()
    ranges = readme_ranges(meaning)
    numbers = [n for n in names if reads.get(n, {}).get("how") == "_env_number"]
    assert ranges, f"{names}: the README states no range in {meaning!r}"
    for i, name in enumerate(names):
        if name not in numbers:
            continue
        read = reads[name]
        stated = defaults[i] if i < len(defaults) else defaults[-1]
        default = re.match(rf"({NUMBER})", stated)
        if read["default"] is None:
            assert stated == "—", f"{name}: README's default is {stated!r}; settings have none"
        else:
            assert default, f"{name}: README's default is {stated!r}; settings say {read['default']}"
            assert _number(default.group(1)) == read["default"], \
                f"{name}: README's default is {stated!r}; settings say {read['default']}"
        low, above, high = ranges[i] if i < len(ranges) else ranges[-1]
        assert (read["low"], read["above"], read["high"]) == (low, above, high), \
            f"{name}: README says {'above' if above else 'at least'} {low}, at most {high}; settings say " \
            f"{'above' if read['above'] else 'at least'} {read['low']}, at most {read['high']}"
