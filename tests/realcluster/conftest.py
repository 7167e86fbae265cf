"""The real control plane, brought up once per test session, and simcluster beside it.

`real_tier` starts `python -m realcluster up --with knative --with kserve` (upstream
kube-apiserver, controller-manager, scheduler, etcd, KWOK, Knative Serving 1.15 and KServe
0.14.1's controller in a private network namespace; needs root and the binaries of
`python -m realcluster build --with knative --with kserve`,
which `make test-real` runs first) on this directory's
scenario and stops it at the end of the session. `sim_tier` serves the same scenario on
simcluster with a manual clock. Tests share each cluster and take a namespace of their own.
On the real tier the product runs as deploy/rbac.yaml's ServiceAccount (`product_identity`),
so kube-apiserver's RBAC authorizer judges every call it makes; the tests set up and check
as admin.

These tests run only when asked for by path (`pytest tests/realcluster`, `make test-real`)
or with `--all-tiers` (`make test`): a plain `pytest tests` deselects them, since the real
tier needs root, Go and a build (tests/tiers.py).
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.tiers import tier_collect

from .backends import Backend

SCENARIO = Path(__file__).with_name("scenario.yaml")
REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_SECONDS = 120.0
PR_SET_PDEATHSIG = 1
READY_LINE = re.compile(r"realcluster ready in ([\d.]+) s at (\S+); kubeconfig (\S+); memory (\d+) MiB")


def pytest_collection_modifyitems(config, items) -> None:
    # One control plane per run: every test of the tier goes to the same process.
    tier_collect(config, items, Path(__file__).parent, lambda item: "realcluster")


@pytest.fixture(scope="session")
def real_tier(tmp_path_factory):
    from realcluster.build import BuildError, binaries

    if os.geteuid() != 0:
        pytest.fail("the real tier runs in its own network namespace, which needs root")
    try:
        binaries(("knative", "kserve"))
    except BuildError as exc:
        pytest.fail(f"{exc} (make test-real builds them first)")
    state = tmp_path_factory.mktemp("realcluster")
    kubeconfig = state / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "realcluster", "up", "--with", "knative", "--with", "kserve", "--scenario", str(SCENARIO),
         "--kubeconfig-out", str(kubeconfig), "--state-dir", str(state / "run")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # If pytest is killed, the tier goes down with it (SIGTERM: in order).
        preexec_fn=lambda: ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
    output: list[str] = []
    ready = threading.Event()

    def read_output() -> None:   # drains the pipe for the whole session
        for line in process.stdout:
            output.append(line)
            if READY_LINE.search(line):
                ready.set()

    threading.Thread(target=read_output, daemon=True).start()
    deadline = time.monotonic() + UP_TIMEOUT_SECONDS
    while not ready.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            time.sleep(0.2)   # let the reader take the last lines
            pytest.fail("realcluster up did not become ready:\n" + "".join(output))
    def compact() -> None:
        subprocess.run([sys.executable, "-m", "realcluster", "compact", "--state-dir", str(state / "run")],
                       cwd=REPO, check=True, capture_output=True)

    backend = Backend("real", str(kubeconfig), compact=compact)
    backend.bring_up_log = "".join(output)
    yield backend
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def sim_tier(tmp_path_factory):
    from simcluster.control import SimControl
    from simcluster.testing import running_cluster

    kubeconfig = tmp_path_factory.mktemp("simcluster") / "kubeconfig"
    with running_cluster(str(SCENARIO), kubeconfig_out=kubeconfig) as url:
        control = SimControl(url)
        store = url.sim.store
        yield Backend("simcluster", str(kubeconfig), advance=control.advance,
                      clock=lambda: datetime.fromisoformat(control.clock().replace("Z", "+00:00")),
                      compact=lambda: store.compact(store.resource_version))


@pytest.fixture
def real_cluster(db, real_tier):
    """The real tier registered as the product's `default` Cluster: the product talks to it
    through `clusters.kube` exactly as to any cluster. Yields (cluster row, backend)."""
    from clusters.kube import forget_gateways
    from clusters.models import Cluster

    cluster, _ = Cluster.objects.update_or_create(
        name="default", defaults={"kubeconfig_path": real_tier.kubeconfig_path, "kube_context": "",
                                  "in_cluster": False})
    yield cluster, real_tier
    forget_gateways()


@pytest.fixture(params=["simcluster", "real"])
def tier(request) -> Backend:
    """The same feature test on each backend: simcluster, then the real control plane."""
    return request.getfixturevalue("sim_tier" if request.param == "simcluster" else "real_tier")


@pytest.fixture(scope="session")
def product_identity(real_tier, tmp_path_factory):
    """The ServiceAccount of deploy/rbac.yaml on the real tier, installed with kubectl, and
    a kubeconfig with its token minted by kube-apiserver (see identity.py)."""
    from .identity import identity_install

    return identity_install(real_tier, tmp_path_factory.mktemp("identity"))


@pytest.fixture
def tier_cluster(db, tier, request):
    """`tier` registered as the product's `default` Cluster. Yields (cluster row, backend).

    On the real tier the product runs as deploy/'s ServiceAccount (`product_identity`), so
    the apiserver's RBAC authorizer judges each of its calls by deploy/'s ClusterRole; the
    backend the test sets up and checks with stays admin. On simcluster the product keeps
    the admin kubeconfig (tests/deploy/test_least_privilege.py runs it under simcluster's RBAC)."""
    from clusters.kube import forget_gateways
    from clusters.models import Cluster

    kubeconfig = tier.kubeconfig_path
    if tier.name == "real":
        kubeconfig = request.getfixturevalue("product_identity").kubeconfig_path
    forget_gateways()
    cluster, _ = Cluster.objects.update_or_create(
        name="default", defaults={"kubeconfig_path": kubeconfig, "kube_context": "",
                                  "in_cluster": False})
    yield cluster, tier
    forget_gateways()
