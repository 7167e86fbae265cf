"""`python -m tests.chaos --scenarios N [--seed S]`: a chaos soak, then its summary table.

It runs the pytest chaos test (which brings up PostgreSQL, Redis, the workers and the
simulated clusters) with the scenario count and seed given, and exits with its status.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=10, help="scenarios to run (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: drawn and printed)")
    args = parser.parse_args(argv)
    if args.scenarios < 1 or args.scenarios > 10_000:
        parser.error(f"--scenarios must be between 1 and 10000, got {args.scenarios}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10 ** 6)
    print(f"chaos seed {seed}", flush=True)
    import pytest

    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        summary = Path(tmp) / "summary.txt"
        os.environ.update(CHAOS_SCENARIOS=str(args.scenarios), CHAOS_SEED=str(seed), CHAOS_SUMMARY_FILE=str(summary))
        os.chdir(root)
        code = pytest.main([str(root / "tests" / "chaos" / "test_chaos.py"), "-q", "-x", "-p", "no:cacheprovider"])
        print("\nchaos summary\n" + (summary.read_text() if summary.exists() else "(no summary: the run did not start)"))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
