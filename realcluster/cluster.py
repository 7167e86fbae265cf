"""Bringing the real control plane up and down.

`up` runs, in this order and each only once the one before answers: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK, all inside a private network
namespace (see netns.py), then loads the scenario and waits for its nodes to be Ready.
Stopping goes the other way round — dependents before etcd, or the apiserver hangs on
its storage and the controllers on the apiserver.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from simcluster.controllers.scheduler import BIN_PACKING_SCHEDULER
from simcluster.scenario import ScenarioError

from . import netns
from .build import KNATIVE_SERVING_VERSION, BuildError, binaries
from .client import Api
from .kubeconfig import write_kubeconfig
from .pki import INSIDE_IP, Pki, PkiError, pki_create, serving_cert_issue
from .scenario import KWOK_ANNOTATION, KWOK_VALUE, LoadError, scenario_apply, scenario_read

APISERVER_PORT = 6443
ETCD_URL = "http://127.0.0.1:2379"
SERVICE_CIDR = "10.96.0.0/12"
POD_CIDR = "10.244.0.0/16"
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0


class UpError(RuntimeError):
    """The tier could not come up; the message names the component and its log."""


def _die_with_parent_argv(argv: list[str]) -> list[str]:
    # A component outliving a killed `up` would hold etcd's data and the namespace.
    # setpriv (util-linux) sets the death signal in the child, so no Python runs between
    # fork and exec (`up` has threads by the time Knative starts).
    return ["setpriv", "--pdeathsig", "TERM", "--", *argv]


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    env: dict | None = None
    # Knative's components drain for up to a minute on SIGTERM; nothing here needs it.
    stop_timeout: float = STOP_TIMEOUT_SECONDS
    process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        # Own process group: a terminal's Ctrl-C reaches only `up`, which stops the
        # components in order instead of all at once.
        self.process = subprocess.Popen(_die_with_parent_argv(self.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=self.env, start_new_session=True)
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        self.process.terminate()
        try:
            self.process.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Tier:
    state_dir: Path
    kubeconfig_out: Path
    port: int = 0
    components: list[Component] = field(default_factory=list)
    pki: Pki | None = None
    log: object = print
    with_knative: bool = False
    with_kserve: bool = False
    # kube-controller-manager's --controllers ("*": all of its default controllers)
    controllers: str = "*"
    # KWOK's node Lease duration; it renews each a quarter of that apart. Thousands of nodes
    # at 40 s are hundreds of writes a second: a large cluster on a small machine takes longer
    # ones, and the node lifecycle controller then waits as long before calling a node NotReady.
    node_lease_seconds: int = 40
    stop_event: threading.Event = field(default_factory=threading.Event)

    @property
    def optional_sets(self) -> tuple[str, ...]:
        return tuple(name for name, on in (("knative", self.with_knative), ("kserve", self.with_kserve)) if on)

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "up.pid"

    # --- bring-up -----------------------------------------------------------------------------
    def up(self, scenario_path: str | None) -> None:
        started = time.monotonic()
        scenario = scenario_read(scenario_path) if scenario_path else None   # bad input fails before anything runs
        try:
            bins = binaries(self.optional_sets)
        except BuildError as exc:
            raise UpError(str(exc)) from None
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        listener = netns.host_listener(self.port)
        host_url = f"https://127.0.0.1:{listener.getsockname()[1]}"
        netns.enter_private_namespace()
        self.log(f"network namespace ready (lo holds 127.0.0.1/8 and {netns.NAMESPACE_CIDR})")
        extra_tokens = scenario.settings.tokens if scenario else {}
        self.pki = pki = pki_create(self.state_dir / "pki", extra_tokens=extra_tokens)
        inside = f"https://{INSIDE_IP}:{APISERVER_PORT}"
        configs = {}
        for who in ("controller-manager", "scheduler", "kwok", "knative", "kserve"):
            configs[who] = write_kubeconfig(self.state_dir / f"{who}.kubeconfig", inside,
                                            ca_cert=pki.ca_cert, token=pki.tokens[who])
        admin = Api(inside, token=pki.tokens["admin"], ca_cert=pki.ca_cert)

        self._start("etcd", [str(bins["etcd"]), "--name", "realcluster",
                             "--data-dir", str(self.state_dir / "etcd"),
                             "--listen-client-urls", ETCD_URL, "--advertise-client-urls", ETCD_URL,
                             "--listen-peer-urls", "http://127.0.0.1:2380",
                             "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                             "--initial-cluster", "realcluster=http://127.0.0.1:2380",
                             # A test cluster lives minutes; fsync per write would only slow it.
                             "--unsafe-no-fsync", "--log-level", "warn"],
                    ready=lambda: Api(ETCD_URL).answers("/health"), started=started)
        self._start("kube-apiserver", [
            str(bins["kube-apiserver"]),
            "--etcd-servers", ETCD_URL,
            "--bind-address", "0.0.0.0", "--advertise-address", INSIDE_IP,
            "--secure-port", str(APISERVER_PORT),
            "--tls-cert-file", str(pki.serving_cert), "--tls-private-key-file", str(pki.serving_key),
            "--client-ca-file", str(pki.ca_cert),
            "--token-auth-file", str(pki.token_file),
            "--authorization-mode", "Node,RBAC",
            "--service-account-key-file", str(pki.sa_pub),
            "--service-account-signing-key-file", str(pki.sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--allow-privileged", "--profiling=false",
            "--cert-dir", str(self.state_dir / "pki"),
        ], ready=lambda: admin.answers("/readyz"), started=started)
        self._start("kube-controller-manager", [
            str(bins["kube-controller-manager"]),
            "--kubeconfig", str(configs["controller-manager"]),
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "10257",
            # Each controller acts as its own ServiceAccount, bound by the bootstrap RBAC
            # policy to exactly what it needs (as kubeadm runs it).
            "--use-service-account-credentials",
            "--service-account-private-key-file", str(pki.sa_key),
            "--root-ca-file", str(pki.ca_cert),
            "--cluster-cidr", POD_CIDR, "--service-cluster-ip-range", SERVICE_CIDR,
            "--controllers", self.controllers,
            *(["--node-monitor-grace-period", f"{self.node_lease_seconds}s"] if self.node_lease_seconds > 50 else []),
            "--profiling=false",
        ], ready=lambda: Api("https://127.0.0.1:10257").answers("/healthz"), started=started)
        scheduler_config = self.state_dir / "scheduler.yaml"
        scheduler_config.write_text(yaml.safe_dump(
            scheduler_config_for(scenario.settings.placement if scenario else "spread", configs["scheduler"])))
        self._start("kube-scheduler", [
            str(bins["kube-scheduler"]), "--config", str(scheduler_config),
            "--bind-address", "127.0.0.1", "--secure-port", "10259",
        ], ready=lambda: Api("https://127.0.0.1:10259").answers("/healthz"), started=started)
        self._start("kwok", [
            str(bins["kwok"]), "--kubeconfig", str(configs["kwok"]),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_VALUE}",
            "--cidr", POD_CIDR, "--node-ip", INSIDE_IP,
            "--server-address", "127.0.0.1:10247",
            # IMPORTANT: heartbeats through node Leases. Without them KWOK refreshes a node's
            # status only every ~50 s, the controller-manager's node-monitor grace period, and
            # the node lifecycle controller then marks every pod on the node Ready=False.
            "--node-lease-duration-seconds", str(self.node_lease_seconds),
        ], ready=lambda: Api("http://127.0.0.1:10247").answers("/healthz"), started=started)

        if self.with_knative:
            self._knative_up(bins, admin, configs["knative"], scenario, started)
        if self.with_kserve:
            self._kserve_up(bins, admin, configs["kserve"], started)

        if self.with_knative:
            from .knative import ingress_ready_loop
            # IMPORTANT: after the last component is forked (see the relay below).
            threading.Thread(target=ingress_ready_loop, args=(admin, self.stop_event), daemon=True,
                             name="knative-ingress").start()

        if scenario is not None:
            try:
                result = scenario_apply(admin, scenario)
            except LoadError as exc:
                raise UpError(str(exc)) from None
            for warning in result.warnings():
                self.log(f"warning: {warning}")
            nodes = self._wait_nodes_ready(admin)
            self.log(f"scenario {scenario.source}: {result.created} objects created, "
                     f"{nodes} KWOK nodes Ready ({time.monotonic() - started:.1f} s)")

        write_kubeconfig(self.kubeconfig_out, host_url, ca_cert=pki.ca_cert, token=pki.tokens["admin"])
        # IMPORTANT: the relay's threads start only now — leaving the host namespace and
        # forking components with a death signal both want a single-threaded process.
        netns.relay_start(listener, (INSIDE_IP, APISERVER_PORT))
        self.pid_file.write_text(str(os.getpid()))
        memory = ", ".join(f"{c.name} {c.rss_mib():.0f}" for c in self.components)
        total = sum(c.rss_mib() for c in self.components)
        self.log(f"realcluster ready in {time.monotonic() - started:.1f} s at {host_url}; "
                 f"kubeconfig {self.kubeconfig_out}; memory {total:.0f} MiB RSS ({memory})")

    def _start(self, name: str, argv: list[str], *, ready, started: float, env: dict | None = None,
               stop_timeout: float = STOP_TIMEOUT_SECONDS, namespace_port: int | None = None) -> None:
        component = Component(name, argv, self.state_dir / "logs" / f"{name}.log", env=env,
                              stop_timeout=stop_timeout)
        self.components.append(component)
        step = time.monotonic()
        if namespace_port is None:
            component.start()
        else:
            with netns.NestedNamespace(namespace_port):
                component.start()
        deadline = step + READY_TIMEOUT_SECONDS
        while not ready():
            if not component.alive():
                raise UpError(f"{name} exited with {component.process.returncode} before it was ready; "
                              f"its log ({component.log_path}) ends:\n{component.log_tail()}")
            if time.monotonic() > deadline:
                raise UpError(f"{name} was not ready within {READY_TIMEOUT_SECONDS:.0f} s; "
                              f"its log ({component.log_path}) ends:\n{component.log_tail()}")
            time.sleep(0.1)
        self.log(f"{name} ready (+{time.monotonic() - step:.1f} s, {time.monotonic() - started:.1f} s in)")

    def _knative_up(self, bins: dict, admin: Api, kubeconfig: Path, scenario, started: float) -> None:
        from . import knative

        step = time.monotonic()
        registries = knative.scenario_registries(scenario.objects if scenario else [])
        created = 0
        for doc in knative.manifests(INSIDE_IP, extra_registries=registries):
            path = admin.collection_path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            if path is None:   # a kind from a CRD created a moment ago
                admin.resources(refresh=True)
                path = admin.collection_path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            answer = admin.request("POST", path, doc)
            if answer.status not in (200, 201, 409):
                message = answer.body.get("message") if isinstance(answer.body, dict) else answer.body
                raise UpError(f"Knative install: {knative.describe(doc)}: the apiserver answered "
                              f"{answer.status}: {message}")
            created += answer.status != 409
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not all(admin.collection_path(v, k, "default") for v, k in knative.SERVED_KINDS):
            if time.monotonic() > deadline:
                raise UpError("Knative's CRDs were not served within "
                              f"{READY_TIMEOUT_SECONDS:.0f} s")
            time.sleep(0.2)
            admin.resources(refresh=True)
        self.log(f"Knative Serving {KNATIVE_SERVING_VERSION} installed: {created} objects "
                 f"(+{time.monotonic() - step:.1f} s, {time.monotonic() - started:.1f} s in)")
        for name in ("webhook", "controller", "autoscaler", "activator"):
            env = {**os.environ, **knative.component_env(name, kubeconfig=kubeconfig, pod_ip=INSIDE_IP)}
            port = knative.COMPONENTS[name]["METRICS_PROMETHEUS_PORT"]
            if name == "webhook":
                ready = lambda: knative.webhook_configured(admin)   # noqa: E731 - its CA bundles are in
            elif name == "autoscaler":
                ready = lambda: knative.autoscaler_leading(admin)   # noqa: E731 - it runs a nested namespace
            else:
                ready = (lambda p: lambda: Api(f"http://127.0.0.1:{p}").answers("/metrics"))(port)
            self._start(f"knative-{name}", [str(bins[f"knative-{name}"])], ready=ready, started=started,
                        env=env, stop_timeout=2.0,
                        # The autoscaler's stats server and the controller's probes both bind :8080.
                        namespace_port=APISERVER_PORT if name == "autoscaler" else None)

    def _kserve_up(self, bins: dict, admin: Api, kubeconfig: Path, started: float) -> None:
        import base64

        from . import kserve

        step = time.monotonic()
        tmp_dir = self.state_dir / "kserve-tmp"
        serving_cert_issue(self.pki, kserve.webhook_cert_dir(tmp_dir), name="kserve-webhook",
                           dns_names=kserve.WEBHOOK_DNS)
        ca_bundle = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        created = self._install(admin, kserve.manifests(ca_bundle=ca_bundle), what="KServe")
        self._wait_served(admin, kserve.SERVED_KINDS, what="KServe's CRDs")
        self.log(f"KServe {kserve.KSERVE_VERSION} installed: {created} objects "
                 f"(+{time.monotonic() - step:.1f} s, {time.monotonic() - started:.1f} s in)")
        self._start("kserve-controller", kserve.controller_argv(bins["kserve-manager"]),
                    ready=lambda: kserve.controller_ready(admin), started=started, stop_timeout=2.0,
                    env={**os.environ, **kserve.controller_env(kubeconfig=kubeconfig, tmp_dir=tmp_dir)})

    def _install(self, admin: Api, docs: list[dict], *, what: str) -> int:
        created = 0
        for doc in docs:
            path = admin.collection_path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            if path is None:   # a kind from a CRD created a moment ago
                admin.resources(refresh=True)
                path = admin.collection_path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            answer = admin.request("POST", path, doc)
            if answer.status not in (200, 201, 409):
                message = answer.body.get("message") if isinstance(answer.body, dict) else answer.body
                name = (doc.get("metadata") or {}).get("name")
                raise UpError(f"{what} install: {doc.get('kind')} {name}: the apiserver answered "
                              f"{answer.status}: {message}")
            created += answer.status != 409
        return created

    def _wait_served(self, admin: Api, kinds, *, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not all(admin.collection_path(v, k, "default") for v, k in kinds):
            if time.monotonic() > deadline:
                raise UpError(f"{what} were not served within {READY_TIMEOUT_SECONDS:.0f} s")
            time.sleep(0.2)
            admin.resources(refresh=True)

    def _wait_nodes_ready(self, api: Api) -> int:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        selector = f"?labelSelector=type%3Dkwok"
        while True:
            nodes = (api.request("GET", f"/api/v1/nodes{selector}").body or {}).get("items", [])
            not_ready = [n["metadata"]["name"] for n in nodes
                         if not any(c.get("type") == "Ready" and c.get("status") == "True"
                                    for c in (n.get("status") or {}).get("conditions", []))]
            if not not_ready:
                return len(nodes)
            if time.monotonic() > deadline:
                raise UpError(f"KWOK nodes not Ready within {READY_TIMEOUT_SECONDS:.0f} s: "
                              f"{', '.join(not_ready[:10])}")
            time.sleep(0.1)

    # --- stopping -----------------------------------------------------------------------------
    def down(self) -> None:
        self.stop_event.set()
        for component in reversed(self.components):
            component.stop()
            self.log(f"{component.name} stopped")
        self.pid_file.unlink(missing_ok=True)

    def failed_component(self) -> Component | None:
        return next((c for c in self.components if not c.alive()), None)


def scheduler_config_for(placement: str, kubeconfig: Path) -> dict:
    """Two profiles: `default-scheduler`, scored as the scenario's placement says
    (simcluster's "most-allocated" is the MostAllocated strategy below, "spread"
    upstream's default LeastAllocated), and `bin-packing-scheduler` (BIN_PACKING_SCHEDULER),
    always MostAllocated: the bin-packing profile GPU platforms run beside the default one,
    which simcluster serves under the same name."""
    most_allocated = {"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "MostAllocated", "resources": [
        {"name": "nvidia.com/gpu", "weight": 5}, {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]}}}
    default = {"schedulerName": "default-scheduler"}
    if placement == "most-allocated":
        default["pluginConfig"] = [most_allocated]
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [default, {"schedulerName": BIN_PACKING_SCHEDULER, "pluginConfig": [most_allocated]}],
    }
    return config


def up_main(args) -> int:
    tier = Tier(state_dir=Path(args.state_dir).resolve(), kubeconfig_out=Path(args.kubeconfig_out).resolve(),
                port=args.port, with_knative="knative" in args.with_sets or "kserve" in args.with_sets,
                with_kserve="kserve" in args.with_sets, controllers=getattr(args, "controllers", "*"),
                node_lease_seconds=getattr(args, "node_lease_seconds", 40),
                log=lambda message: print(f"realcluster: {message}", flush=True))
    stop = threading.Event()
    coming_up = True

    def on_signal(*_):
        stop.set()
        if coming_up:
            raise KeyboardInterrupt   # abandon the bring-up; what started is stopped below

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        tier.up(args.scenario)
    except (UpError, netns.NamespaceError, PkiError, ScenarioError, OSError) as exc:
        print(f"realcluster up: {exc}", file=sys.stderr, flush=True)
        tier.down()
        return 1
    except BaseException:
        tier.down()
        raise
    coming_up = False
    code = 0
    while not stop.wait(1.0):
        failed = tier.failed_component()
        if failed is not None:
            print(f"realcluster: {failed.name} exited with {failed.process.returncode}; stopping the tier. "
                  f"Its log ({failed.log_path}) ends:\n{failed.log_tail()}", file=sys.stderr, flush=True)
            code = 1
            break
    tier.down()
    print("realcluster: down", flush=True)
    return code


def down_main(args) -> int:
    pid_file = Path(args.state_dir) / "up.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        print(f"realcluster down: no running tier recorded in {pid_file}", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        print(f"realcluster down: the tier recorded in {pid_file} (pid {pid}) was not running", file=sys.stderr)
        return 1
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS * 6
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"realcluster: stopped (pid {pid})")
            return 0
        time.sleep(0.2)
    print(f"realcluster down: pid {pid} still running after {STOP_TIMEOUT_SECONDS * 6:.0f} s", file=sys.stderr)
    return 1


# Run inside the tier's network namespace, where etcd listens: its JSON gateway's
# maintenance status gives the current revision, and kv/compaction forgets what is older.
_COMPACT = """
import json, sys, urllib.request
def post(path, body):
    request = urllib.request.Request("%s" + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())
revision = int(post("/v3/maintenance/status", {})["header"]["revision"])
post("/v3/kv/compaction", {"revision": revision, "physical": True})
print(revision)
""" % ETCD_URL


def compact_main(args) -> int:
    """Compact etcd to its current revision: what the apiserver's compactor does every
    `--etcd-compaction-interval` (5 minutes), on demand, so that a check can see a watch
    from an older version answered 410 Expired."""
    pid_file = Path(args.state_dir) / "up.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        print(f"realcluster compact: no running tier recorded in {pid_file}", file=sys.stderr)
        return 1
    result = subprocess.run(["nsenter", "-t", str(pid), "-n", sys.executable, "-c", _COMPACT],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print(f"realcluster compact: {result.stderr.strip().splitlines()[-1] if result.stderr else 'failed'}",
              file=sys.stderr)
        return 1
    print(f"realcluster: etcd compacted at revision {result.stdout.strip()}")
    return 0
