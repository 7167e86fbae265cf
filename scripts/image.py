"""Builds the product's image with podman, tagged by a hash of its build context.

    python scripts/image.py build     # the base when missing, then the image unless already built
    python scripts/image.py tag       # prints the tag the current tree builds (nothing is built)

The tag is `gpu-capacity:ctx-<hash>`: the SHA-256 of deploy/Dockerfile, .dockerignore and every
file the build context holds (the tree less what .dockerignore excludes). An image with that
tag was built from exactly these files, so a second build of an unchanged tree is skipped
(`podman image exists`). The same image is also tagged `gpu-capacity:local`, the name
docker-compose.yml uses.

The Dockerfile's base (`python:3.11-slim`) is used when podman has it or can pull it. Where
no registry serves it, it is made once per machine from Debian's packages (debootstrap,
bookworm: Python 3.11 like the official image) and imported under the base's name, so the
Dockerfile builds unchanged either way. podman's image store is the cache.

Podman runs with the runc runtime and explicit ulimits, since on this machine kind crun
refuses hybrid cgroups and the default RLIMIT_NOFILE cannot be set (see deploy/README.md).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
NAME = "gpu-capacity"
LOCAL_TAG = f"{NAME}:local"
PODMAN = ["podman", "--runtime", "runc"]
# Explicit limits: without them podman's default RLIMIT_NOFILE is refused on this machine kind.
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4000:4000"]
DEBIAN_SUITE = "bookworm"          # its python3 is 3.11, the version of python:3.11-slim
DEBIAN_PACKAGES = "python3,python3-pip,python3-venv,passwd,ca-certificates"
PULL_TIMEOUT_SECONDS = 120
# A label on a base made here, so `podman image inspect` tells it from the registry's image.
MADE_HERE_LABEL = "io.gpu-capacity.base=debootstrap"


class ImageError(RuntimeError):
    pass


def _ignore_patterns(root: Path) -> list[tuple[bool, str]]:
    """(negated, pattern) pairs of .dockerignore, in order (the last match wins)."""
    patterns = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        patterns.append((negated, pattern))
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Docker's rules (moby/patternmatcher): `*` and `?` stay inside one path element, `**`
    # spans any number of them; a pattern that matches a folder excludes all below it.
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out + "(?:/.*)?")


def context_files(root: Path = REPO) -> list[Path]:
    """The files podman sends as the build context, as paths relative to `root`."""
    rules = [(negated, _pattern_regex(pattern)) for negated, pattern in _ignore_patterns(root)]

    def excluded(rel: str) -> bool:
        out = False
        for negated, regex in rules:
            if regex.fullmatch(rel):
                out = not negated
        return out

    may_negate = any(negated for negated, _ in rules)
    files = []
    for folder, dirs, names in os.walk(root):
        rel_root = os.path.relpath(folder, root)
        rel = (lambda n: n) if rel_root == "." else (lambda n: f"{rel_root}/{n}")
        # A folder may be skipped whole only when no `!` rule could bring a file back.
        if not may_negate:
            dirs[:] = [d for d in dirs if not excluded(rel(d))]
        dirs.sort()
        files.extend(Path(rel(n)) for n in sorted(names) if not excluded(rel(n)))
    return files


def context_hash(root: Path = REPO) -> str:
    digest = hashlib.sha256()
    for path in [Path("deploy/Dockerfile"), Path(".dockerignore"), *context_files(root)]:
        full = root / path
        digest.update(str(path).encode() + b"\0")
        digest.update(os.readlink(full).encode() if full.is_symlink() else full.read_bytes())
        digest.update(b"\0" + str(os.stat(full, follow_symlinks=False).st_mode & 0o111).encode() + b"\0")
    return digest.hexdigest()[:16]


def image_tag() -> str:
    return f"{NAME}:ctx-{context_hash()}"


def _podman(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed (make system-deps installs it, as root)")
    return subprocess.run([*PODMAN, *args], check=check, **kwargs)


def image_exists(tag: str) -> bool:
    return _podman("image", "exists", tag, check=False).returncode == 0


def base_name() -> str:
    for line in DOCKERFILE.read_text().splitlines():
        if line.upper().startswith("FROM "):
            return line.split()[1]
    raise ImageError(f"{DOCKERFILE} has no FROM line")


def _qualified(name: str) -> str:
    """The name podman gives an unqualified Docker Hub image (python:3.11-slim)."""
    first = name.split("/")[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name if '/' in name else 'library/' + name}"


def base_ensure(name: str) -> str:
    """The Dockerfile's base in podman's store: present, pulled, or made from Debian's packages."""
    qualified = _qualified(name)
    if image_exists(qualified):
        return "present"
    try:
        pulled = _podman("pull", "--quiet", qualified, check=False, capture_output=True, text=True,
                         timeout=PULL_TIMEOUT_SECONDS)
        if pulled.returncode == 0:
            return "pulled"
        reason = (pulled.stderr.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired:
        reason = f"no answer in {PULL_TIMEOUT_SECONDS} s"
    print(f"image: cannot pull {qualified} ({reason}); making it from Debian {DEBIAN_SUITE} with debootstrap",
          file=sys.stderr)
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (make system-deps installs it, as root)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-capacity-base-") as work:
        root = Path(work) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={DEBIAN_PACKAGES}", DEBIAN_SUITE, str(root)],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        shutil.rmtree(root / "var" / "lib" / "apt" / "lists", ignore_errors=True)
        tarball = Path(work) / "base.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(tarball), "."], check=True)
        _podman("import", "--quiet",
                "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change", "ENV LANG=C.UTF-8",
                "--change", f"LABEL {MADE_HERE_LABEL}",
                "--change", 'CMD ["python3"]',
                str(tarball), qualified, stdout=subprocess.DEVNULL)
    print(f"image: made {qualified} from Debian {DEBIAN_SUITE} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return "made"


def image_build() -> str:
    """Builds the image unless one of this context's hash exists; returns its tag."""
    tag = image_tag()
    if image_exists(tag):
        _podman("tag", tag, LOCAL_TAG)
        print(f"image: {tag} is up to date", file=sys.stderr)
        return tag
    base = base_ensure(base_name())
    started = time.monotonic()
    _podman("build", "--isolation=chroot", "--network=host", *ULIMITS,
            # pip inside the build reaches the package index with the host's CA bundle
            "-v", "/etc/ssl/certs:/etc/ssl/certs:ro",
            "-f", str(DOCKERFILE), "-t", tag, "-t", LOCAL_TAG, str(REPO))
    size = _podman("image", "inspect", "--format", "{{.Size}}", tag, capture_output=True, text=True).stdout.strip()
    print(f"image: built {tag} in {time.monotonic() - started:.0f} s (base {base}); "
          f"size {int(size) / 1e6:.0f} MB", file=sys.stderr)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "tag", "base"])
    args = parser.parse_args(argv)
    try:
        if args.command == "tag":
            print(image_tag())
        elif args.command == "base":
            print(base_ensure(base_name()))
        else:
            print(image_build())
    except (ImageError, subprocess.CalledProcessError) as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
