"""scripts/image.py's build context: what .dockerignore leaves in, and the hash that tags the image.

The tag must change with every file the build sees (else a changed tree runs an old image)
and only with those (else an unchanged tree is rebuilt).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_capacity_image", ROOT / "scripts" / "image.py")
image = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image)


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


IGNORE = ".*\n**/__pycache__\ntests\ndocs/*.md\n!docs/keep.md\n"


def test_the_context_follows_docker_ignore_rules(tmp_path):
    root = tree(tmp_path, {
        ".dockerignore": IGNORE, "deploy/Dockerfile": "FROM python:3.11-slim\n",
        "app/models.py": "", "app/__pycache__/models.cpython-311.pyc": "", "app/sub/__pycache__/x.pyc": "",
        ".env": "SECRET=1", ".git/HEAD": "", "tests/test_app.py": "", "newapp/apps.py": "",
        "docs/a.md": "", "docs/keep.md": "", "docs/deep/b.md": "",
    })
    assert sorted(map(str, image.context_files(root))) == [
        "app/models.py", "deploy/Dockerfile", "docs/deep/b.md", "docs/keep.md", "newapp/apps.py"]


def test_the_hash_changes_with_what_the_build_sees_and_only_with_that(tmp_path):
    root = tree(tmp_path, {".dockerignore": IGNORE, "deploy/Dockerfile": "FROM python:3.11-slim\n",
                           "app/models.py": "A = 1\n", "tests/test_app.py": ""})
    first = image.context_hash(root)
    assert image.context_hash(root) == first
    (root / "tests" / "test_app.py").write_text("changed")
    (root / ".venv").mkdir()
    assert image.context_hash(root) == first
    (root / "app" / "models.py").write_text("A = 2\n")
    second = image.context_hash(root)
    assert second != first
    (root / "app" / "new.py").write_text("")
    third = image.context_hash(root)
    assert third != second
    (root / "deploy" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    assert image.context_hash(root) != third


def test_every_package_of_the_repository_is_in_the_image_context():
    files = {str(path) for path in image.context_files()}
    packages = [p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests"]
    assert {"audit", "savings"} <= set(packages)
    for package in packages:
        assert f"{package}/__init__.py" in files, package
    assert "requirements/runtime.txt" in files and "manage.py" in files
    assert not any(name.startswith(("tests/", ".git/", ".venv/", "docs/")) for name in files)
