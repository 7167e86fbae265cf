"""The locked dependencies agree with pyproject.toml (offline: no index is asked).

uv.lock pins every distribution with its hashes; requirements/runtime.txt (the image) and
requirements/test.txt (`make install`) are its exports, which pip installs with
`--require-hashes`. A requirement added to pyproject.toml without `make lock`, or a
specifier the pin no longer meets, fails here with the requirement named.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
EXPORTS = {"runtime": ROOT / "requirements" / "runtime.txt", "test": ROOT / "requirements" / "test.txt"}


def _pyproject_requirements(pyproject: dict) -> dict[str, list[Requirement]]:
    project = pyproject["project"]
    runtime = [Requirement(text) for text in project["dependencies"]]
    return {"runtime": runtime, "test": runtime + [Requirement(text) for text in project["optional-dependencies"]["test"]]}


def _lock_versions(lock: dict) -> dict[str, str]:
    return {canonicalize_name(package["name"]): package["version"] for package in lock["package"]
            if "version" in package and package.get("source", {}).get("editable") is None
            and package.get("source", {}).get("virtual") is None}


def _export_pins(text: str) -> dict[str, tuple[Requirement, list[str]]]:
    """name -> (pinned requirement, its hashes) of a `uv export` requirements file."""
    pins = {}
    for entry in text.replace("\\\n", " ").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        requirement, *hashes = entry.split(" --hash=")
        parsed = Requirement(requirement.strip())
        pins[canonicalize_name(parsed.name)] = (parsed, [h.strip() for h in hashes])
    return pins


def lock_disagreements(pyproject: dict, lock: dict, exports: dict[str, str]) -> list[str]:
    """What stops the lock from installing what pyproject.toml asks for (empty when it agrees)."""
    problems = []
    locked = _lock_versions(lock)
    wanted = _pyproject_requirements(pyproject)
    for requirement in wanted["test"]:
        version = locked.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"uv.lock has no {requirement.name} ({requirement}): run `make lock`")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"uv.lock pins {requirement.name} {version}, outside {requirement}: run `make lock`")
    for kind, text in exports.items():
        pins = _export_pins(text)
        for requirement in wanted[kind]:
            name = canonicalize_name(requirement.name)
            if name not in pins:
                problems.append(f"requirements/{kind}.txt has no {requirement.name}: run `make lock`")
            elif not requirement.specifier.contains(next(iter(pins[name][0].specifier)).version, prereleases=True):
                problems.append(f"requirements/{kind}.txt pins {pins[name][0]}, outside {requirement}: run `make lock`")
        for name, (pin, hashes) in pins.items():
            specifiers = list(pin.specifier)
            if len(specifiers) != 1 or specifiers[0].operator != "==":
                problems.append(f"requirements/{kind}.txt does not pin {pin.name} to one version: {pin}")
            elif locked.get(name) != specifiers[0].version:
                problems.append(f"requirements/{kind}.txt pins {pin.name} {specifiers[0].version}, uv.lock "
                                f"{locked.get(name)}: run `make lock`")
            if not hashes or not all(h.startswith("sha256:") for h in hashes):
                problems.append(f"requirements/{kind}.txt gives {pin.name} no sha256 hash")
    return problems


def _read() -> tuple[dict, dict, dict[str, str]]:
    return (tomllib.loads((ROOT / "pyproject.toml").read_text()), tomllib.loads((ROOT / "uv.lock").read_text()),
            {kind: path.read_text() for kind, path in EXPORTS.items()})


def test_lock_and_its_exports_agree_with_pyproject():
    pyproject, lock, exports = _read()
    assert lock_disagreements(pyproject, lock, exports) == []
    pins = {kind: _export_pins(text) for kind, text in exports.items()}
    # the image's set is the runtime closure: no test tool ships in it
    assert "pytest" not in pins["runtime"] and "pytest" in pins["test"]
    assert set(pins["runtime"]) < set(pins["test"])


def test_a_requirement_missing_from_the_lock_is_named():
    pyproject, lock, exports = _read()
    pyproject["project"]["dependencies"].append("left-pad-for-python>=1")
    problems = lock_disagreements(pyproject, lock, exports)
    assert "uv.lock has no left-pad-for-python (left-pad-for-python>=1): run `make lock`" in problems
    assert "requirements/runtime.txt has no left-pad-for-python: run `make lock`" in problems


def test_a_pin_outside_its_specifier_is_named():
    pyproject, lock, exports = _read()
    django = next(p for p in lock["package"] if p["name"] == "django")["version"]
    pyproject["project"]["dependencies"] = [
        f"Django>{django}" if text.startswith("Django") else text for text in pyproject["project"]["dependencies"]]
    problems = lock_disagreements(pyproject, lock, exports)
    assert f"uv.lock pins Django {django}, outside Django>{django}: run `make lock`" in problems
    assert any(p.startswith("requirements/runtime.txt pins django==") for p in problems)


def test_an_export_behind_the_lock_is_named():
    pyproject, lock, exports = _read()
    runtime = exports["runtime"]
    pin = next(line for line in runtime.splitlines() if line.startswith("gunicorn=="))
    exports["runtime"] = runtime.replace(pin, "gunicorn==23.0.0 \\")
    problems = lock_disagreements(pyproject, lock, exports)
    assert any(p.startswith("requirements/runtime.txt pins gunicorn 23.0.0, uv.lock ") for p in problems)
