import sys
from pathlib import Path

# The prune feature reuses the pruning tests' Prometheus helpers (backfill + a real server).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pruning"))
