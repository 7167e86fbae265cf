"""`python -m simcluster serve|generate ...`"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from .scenario import ScenarioError


def _serve(args) -> int:
    from .server import ClusterServer, build_simulation
    try:
        # Everything loaded lives as long as the server: moved out of the collector's
        # generations, so no collection (the first after loading, or one during a LIST)
        # walks 50,000 stored pods.
        sim = build_simulation(args.scenario, speed=None if args.manual_clock else args.speed, freeze=True)
    except ScenarioError as exc:
        print(f"simcluster: bad scenario: {exc}", file=sys.stderr)
        return 2
    server = ClusterServer(sim=sim, host=args.host, port=args.port, kubeconfig_out=args.kubeconfig_out)
    server.start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    clock = "manual clock (POST /simcluster/v1/advance)" if server.sim.clock.manual else f"speed {args.speed}x"
    print(f"simcluster serving at {server.url} ({clock})", flush=True)
    if args.kubeconfig_out:
        print(f"kubeconfig written to {args.kubeconfig_out}", flush=True)
    done.wait()
    server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:
        from .generate import main as generate
        return generate(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="python -m simcluster",
                                     description="A simulated GPU cluster that speaks the Kubernetes API.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a scenario over HTTP")
    serve.add_argument("--scenario", help="YAML scenario or kubectl -o json dump (default: an empty cluster)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    serve.add_argument("--kubeconfig-out", help="write a kubeconfig for this server here")
    clock = serve.add_mutually_exclusive_group()
    clock.add_argument("--speed", type=float, default=None,
                       help="run the simulated clock at this multiple of real time")
    clock.add_argument("--manual-clock", action="store_true",
                       help="time moves only on POST /simcluster/v1/advance (the default without --speed)")
    sub.add_parser("generate", help="write a large scenario (see: python -m simcluster generate --help)")
    args = parser.parse_args(argv)
    if args.speed is not None and args.speed <= 0:
        parser.error("--speed must be > 0")
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
