"""Building the upstream binaries from pinned Go modules, cached outside the repository.

Each Go module directory under `realcluster/go/` (committed: go.mod, go.sum, tools.go)
pins one set of upstream modules; its programs are compiled with `go build` into
`<cache>/bin/<key>/`, where `key` hashes the go.mod, go.sum and link flags. A finished
build leaves a stamp there, so a second `build` with nothing changed is a file check,
and a build after a pin change reuses Go's own content-addressed caches (module and
build cache, shared across keys): a warm rebuild takes seconds.

The cache root is `$REALCLUSTER_CACHE`, default `~/.cache/gpu-capacity-realtier`.
Builds run under `nice -n 19` (a test machine has few cores), with `GOTOOLCHAIN=local`
(only the installed Go; nothing is fetched but modules) and `GOFLAGS=-mod=mod`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GO_DIR = Path(__file__).resolve().parent / "go"

KUBERNETES_VERSION = "v1.32.13"
# Every staging module of k8s.io/kubernetes is published as k8s.io/<name> v0.<minor>.<patch>;
# the module proxy refuses k8s.io/endpointslice v0.32.13, and v0.32.12 builds with the rest.
STAGING_VERSION = "v0.32.13"
STAGING_OVERRIDES = {"k8s.io/endpointslice": "v0.32.12"}
ETCD_VERSION = "v3.5.16"       # Debian's etcd-server is 3.4, too old for Kubernetes 1.32
KWOK_VERSION = "v0.7.0"
# Knative 1.15: the newest Serving the module proxy serves that builds (v0.51.0 needs a
# knative.dev/pkg the proxy refuses). Minimum Kubernetes 1.28.
KNATIVE_SERVING_VERSION = "v0.42.2"
# KServe 0.14.1: the release written against Knative Serving v0.42.2 (its go.mod requires
# exactly that), so its controller drives the Knative this tier runs.
KSERVE_VERSION = "v0.14.1"


class BuildError(RuntimeError):
    """A build that could not finish; the message says which step and why."""


@dataclass(frozen=True)
class GoModule:
    """One Go module directory and the programs built from it."""
    name: str                                  # directory under realcluster/go/
    requires: dict[str, str]                   # module -> version, the pins
    programs: dict[str, str]                   # binary name -> package path
    ldflags: tuple[str, ...] = ()
    # (module whose go.mod lists staging replaces, version every staging module is pinned to)
    staging_of: tuple[str, str] | None = None
    staging_overrides: dict[str, str] = field(default_factory=dict)
    replaces: dict[str, str] = field(default_factory=dict)   # module -> version, copied from upstream

    @property
    def dir(self) -> Path:
        return GO_DIR / self.name


def _kube_ldflags() -> tuple[str, ...]:
    # Without these the apiserver reports v0.0.0, and clients with a minimum
    # Kubernetes version (Knative's webhook) refuse to start.
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    values = {"gitVersion": KUBERNETES_VERSION, "gitMajor": major, "gitMinor": minor,
              "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z"}
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return tuple(flags)


CORE = GoModule(
    name="core",
    requires={"k8s.io/kubernetes": KUBERNETES_VERSION, "go.etcd.io/etcd/server/v3": ETCD_VERSION},
    programs={
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "etcd": "go.etcd.io/etcd/server/v3",
    },
    ldflags=_kube_ldflags(),
    staging_of=("k8s.io/kubernetes", STAGING_VERSION),
    staging_overrides=STAGING_OVERRIDES,
)
# KWOK v0.7.0 is written against the 0.33 client libraries; forcing the control plane's
# 0.32 pins on it would not compile, so it is its own module.
KWOK = GoModule(
    name="kwok",
    requires={"sigs.k8s.io/kwok": KWOK_VERSION},
    programs={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.lstrip('v')}",),
)
# Knative Serving is written against the 0.29 client libraries: a module of its own too.
KNATIVE = GoModule(
    name="knative",
    requires={"knative.dev/serving": KNATIVE_SERVING_VERSION},
    programs={f"knative-{name}": f"knative.dev/serving/cmd/{name}"
              for name in ("controller", "autoscaler", "webhook", "activator")},
    # Serving's own go.mod pins it so; a replace in a dependency does not carry over.
    replaces={"github.com/gorilla/websocket": "v1.5.0"},
)
# KServe: its CRDs (config/crd in the module) and its controller manager, against the
# 0.30 client libraries and Knative Serving v0.42.2: a module of its own.
KSERVE = GoModule(
    name="kserve",
    requires={"github.com/kserve/kserve": KSERVE_VERSION},
    programs={"kserve-manager": "github.com/kserve/kserve/cmd/manager"},
)
MODULES = (CORE, KWOK)
OPTIONAL_MODULES = {"knative": KNATIVE, "kserve": KSERVE}


def cache_root() -> Path:
    return Path(os.environ.get("REALCLUSTER_CACHE") or Path.home() / ".cache" / "gpu-capacity-realtier")


def go_env() -> dict[str, str]:
    root = cache_root()
    env = dict(os.environ)
    env.update({
        "GOMODCACHE": str(root / "gomodcache"),
        "GOCACHE": str(root / "gocache"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=mod",
        "CGO_ENABLED": "0",
    })
    return env


def _go(args: list[str], *, cwd: Path, log) -> str:
    # The machine image installs Go under /usr/local/go, which a non-login shell's PATH may lack.
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if Path(p).exists()), None)
    if go is None:
        raise BuildError("the Go toolchain is not installed (`go` is not on PATH); "
                         "realcluster builds its binaries from upstream Go modules")
    command = ["nice", "-n", "19", go, *args]
    log(f"  $ go {' '.join(args)}   (in {cwd.relative_to(GO_DIR.parent.parent)})")
    result = subprocess.run(command, cwd=cwd, env=go_env(), capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-30:])
        raise BuildError(f"`go {' '.join(args)}` in {cwd} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def _module_json(module: GoModule) -> dict | None:
    path = module.dir / "go.mod"
    if not path.exists():
        return None
    return json.loads(_go(["mod", "edit", "-json"], cwd=module.dir, log=lambda _msg: None))


def _pins_hold(module: GoModule, parsed: dict | None, staging: dict[str, str]) -> bool:
    if parsed is None:
        return False
    required = {r["Path"]: r["Version"] for r in parsed.get("Require") or []}
    replaced = {r["Old"]["Path"]: r["New"].get("Version") for r in parsed.get("Replace") or []}
    return (all(required.get(path) == version for path, version in module.requires.items())
            and replaced == staging)


def _staging_replaces(module: GoModule, log) -> dict[str, str]:
    """Every module k8s.io/kubernetes replaces with ./staging/..., pinned to its published
    version (read from that release's own go.mod)."""
    if module.staging_of is None:
        return {}
    owner, version = module.staging_of
    info = json.loads(_go(["mod", "download", "-json", f"{owner}@{module.requires[owner]}"],
                          cwd=module.dir, log=log))
    replaces = {}
    for line in Path(info["GoMod"]).read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            replaces[parts[0]] = module.staging_overrides.get(parts[0], version)
    if not replaces:
        raise BuildError(f"{owner}@{module.requires[owner]}'s go.mod lists no staging modules; "
                         "cannot pin them")
    return replaces


def go_mod_write(module: GoModule, *, log=print) -> bool:
    """Make `module`'s go.mod pin what `module` says; True when it was (re)written.
    A go.mod that already holds the pins is left as it is (it is committed, tidied)."""
    module.dir.mkdir(parents=True, exist_ok=True)
    staging = {**_staging_replaces(module, log), **module.replaces}
    if _pins_hold(module, _module_json(module), staging):
        return False
    log(f"writing {module.dir / 'go.mod'}: " + ", ".join(f"{p} {v}" for p, v in module.requires.items())
        + (f", {len(staging)} modules replaced" if staging else ""))
    lines = [f"module gpu-capacity/realcluster/{module.name}", "", "go 1.23.0", "", "require ("]
    lines += [f"\t{path} {version}" for path, version in module.requires.items()]
    lines += [")", ""]
    if staging:
        lines += ["replace ("]
        lines += [f"\t{path} => {path} {version}" for path, version in sorted(staging.items())]
        lines += [")", ""]
    (module.dir / "go.mod").write_text("\n".join(lines))
    (module.dir / "go.sum").unlink(missing_ok=True)
    _go(["mod", "tidy"], cwd=module.dir, log=log)
    return True


def module_key(module: GoModule) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((module.dir / name).read_bytes())
    digest.update("\0".join(module.ldflags).encode())
    digest.update("\0".join(f"{k}={v}" for k, v in sorted(module.programs.items())).encode())
    return digest.hexdigest()[:16]


def bin_dir(module: GoModule) -> Path:
    return cache_root() / "bin" / f"{module.name}-{module_key(module)}"


def _modules(optional: tuple[str, ...]) -> tuple[GoModule, ...]:
    unknown = set(optional) - set(OPTIONAL_MODULES)
    if unknown:
        raise BuildError(f"unknown optional module {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(sorted(OPTIONAL_MODULES))}")
    return MODULES + tuple(OPTIONAL_MODULES[name] for name in optional)


def binaries(optional: tuple[str, ...] = ()) -> dict[str, Path]:
    """Program name -> built binary; BuildError naming what is missing when not built."""
    found = {}
    for module in _modules(optional):
        directory = bin_dir(module)
        if not (directory / ".complete").exists():
            raise BuildError(f"{module.name} binaries are not built for the current pins "
                             f"(expected in {directory}); run `python -m realcluster build`")
        found.update({name: directory / name for name in module.programs})
    return found


def build(*, force: bool = False, optional: tuple[str, ...] = (), log=print) -> dict[str, Path]:
    """Build every module's programs (cached); returns program name -> binary path."""
    started = time.monotonic()
    for module in _modules(optional):
        go_mod_write(module, log=log)
        directory = bin_dir(module)
        if (directory / ".complete").exists() and not force:
            log(f"{module.name}: cached in {directory}")
            continue
        directory.mkdir(parents=True, exist_ok=True)
        for name, package in module.programs.items():
            step = time.monotonic()
            _go(["build", "-trimpath", "-ldflags", " ".join(("-s", "-w", *module.ldflags)),
                 "-o", str(directory / name), package], cwd=module.dir, log=log)
            log(f"{module.name}: built {name} in {time.monotonic() - step:.1f} s")
        (directory / ".complete").write_text(json.dumps(sorted(module.programs)))
    log(f"realcluster binaries ready ({time.monotonic() - started:.1f} s)")
    return binaries(optional)


def main(args) -> int:
    try:
        built = build(force=args.force, optional=tuple(args.with_modules))
    except BuildError as exc:
        print(f"realcluster build: {exc}", file=sys.stderr)
        return 1
    for name, path in sorted(built.items()):
        print(f"  {name}: {path}")
    return 0
