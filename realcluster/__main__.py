"""`python -m realcluster build|up|down ...`"""
from __future__ import annotations

import argparse
import sys

DEFAULT_STATE_DIR = "var/realcluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realcluster",
                                     description="A real Kubernetes control plane built from upstream Go modules.")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the upstream binaries (cached outside the repository)")
    build.add_argument("--force", action="store_true", help="run go build even when a cached build exists")
    build.add_argument("--with", dest="with_modules", action="append", default=[], choices=["knative", "kserve"],
                       help="also build an optional set: knative (Serving's controller, autoscaler, "
                            "webhook, activator; run by `up --with knative`), kserve (KServe's CRDs and "
                            "controller manager; run by `up --with kserve`)")
    up = sub.add_parser("up", help="run the control plane in its own network namespace (root) until Ctrl-C")
    up.add_argument("--scenario", help="a simcluster scenario (YAML or kubectl -o json dump) to load")
    up.add_argument("--kubeconfig-out", required=True, help="write a kubeconfig for clients on this host here")
    up.add_argument("--port", type=int, default=0, help="the host's 127.0.0.1 port of the apiserver (0: any free one)")
    up.add_argument("--with", dest="with_sets", action="append", default=[], choices=["knative", "kserve"],
                    help="also run an optional set: knative (Serving's controller, autoscaler, webhook and "
                         "activator, out of cluster; build it with `build --with knative`), kserve (KServe's "
                         "CRDs and controller; needs knative; build it with `build --with kserve`)")
    up.add_argument("--controllers", default="*",
                    help="kube-controller-manager's --controllers (default *: all); e.g. "
                         "'*,-replicaset-controller' to load pods already owned by ReplicaSets")
    up.add_argument("--node-lease-seconds", type=int, default=40,
                    help="KWOK's node Lease duration (default 40; renewed every quarter of it); above 50 the "
                         "controller-manager's node-monitor grace period is as long")
    up.add_argument("--state-dir", default=DEFAULT_STATE_DIR,
                    help=f"etcd data, certificates, component logs (default {DEFAULT_STATE_DIR})")
    down = sub.add_parser("down", help="stop the tier that `up` started in --state-dir")
    down.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    compact = sub.add_parser("compact", help="compact etcd's history now, as the apiserver does every 5 minutes "
                                             "(watches from older versions then get 410 Expired)")
    compact.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    if args.command == "build":
        from .build import main as build_main
        return build_main(args)
    if args.command == "up":
        if not 0 <= args.port <= 65535:
            parser.error("--port must be between 0 and 65535")
        if not 10 <= args.node_lease_seconds <= 3600:
            parser.error("--node-lease-seconds must be between 10 and 3600")
        from .cluster import up_main
        return up_main(args)
    if args.command == "compact":
        from .cluster import compact_main
        return compact_main(args)
    from .cluster import down_main
    return down_main(args)


if __name__ == "__main__":
    sys.exit(main())
