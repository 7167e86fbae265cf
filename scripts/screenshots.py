"""Regenerate docs/screenshots/: the dashboard, GPU map, runbook, a prune run, its decisions,
the savings page, and a campaign with its abort confirmation at 1366×768, in Debian's Chromium.

It runs the panel's browser tests, which starts everything the pages need on its own —
a simulated cluster with DCGM history, a real Prometheus, a throwaway PostgreSQL
database and Django's live server — and, with SCREENSHOTS_DIR set, saves each page
after checking it. Usage: `make screenshots` (or `python scripts/screenshots.py [DIR]`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/browser/test_pages_1366.py", "tests/browser/test_campaign_1366.py"]


def main(argv: list[str]) -> int:
    target = Path(argv[0]).resolve() if argv else ROOT / "docs" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.png"):
        old.unlink()
    env = {**os.environ, "SCREENSHOTS_DIR": str(target)}
    code = subprocess.call([sys.executable, "-m", "pytest", *TESTS, "-q", "-x"], cwd=ROOT, env=env)
    saved = sorted(p.name for p in target.glob("*.png"))
    if code != 0:
        print(f"screenshots: the page checks failed (pytest exit {code}); {len(saved)} page(s) saved in {target}",
              file=sys.stderr)
        return code
    print(f"screenshots: {len(saved)} page(s) saved in {target}: {', '.join(saved)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
