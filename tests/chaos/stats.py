"""What a chaos run counts and reports: the summary table, the unstepped gaps after kills
and their bounds, and the error a stuck wait raises."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from capacity.defrag.services import LEASE_SECONDS
from config.schedule import SCHEDULES

RESUME_EVERY_S = next(p.every_seconds for p in SCHEDULES if p.task == "capacity.tasks.defrag_jobs_resume")
# How long a killed job may stay unstepped (product seconds). A pool process's message is
# redelivered at once and takes its own lease back: within one lease. A whole worker's
# unacknowledged message waits for the broker's visibility timeout, so the resume beat
# re-queues the job once its lease has run out: a lease plus one beat period, plus the
# fast-forward's 5 s step and a beat tick.
GAP_BOUND_S = {"pool": LEASE_SECONDS, "whole": LEASE_SECONDS + RESUME_EVERY_S + 10.0}


class ChaosStuck(Exception):
    """A wait ran past its deadline: recorded as a violation, the scenario moves on."""


@dataclass
class Stats:
    seed: int
    scenarios: int = 0
    kills: Counter = field(default_factory=Counter)        # "pool" / "whole"
    aborts: int = 0
    drains: int = 0
    activities: int = 0
    prune_acted: int = 0     # scale-downs that took effect (decisions succeeded)
    restores: int = 0        # of those, restored from the panel
    runbook_actions: int = 0  # redeploys and unblocks done from the panel
    campaigns: Counter = field(default_factory=Counter)        # by how each ended: "done" / "aborted"
    campaign_nodes: Counter = field(default_factory=Counter)   # their nodes, by final state
    panel_presses: int = 0   # panel buttons pressed (a press a fault failed is pressed again)
    faults: Counter = field(default_factory=Counter)       # from simcluster's injected counts
    violations: list[str] = field(default_factory=list)
    gaps: dict = field(default_factory=lambda: {"pool": [], "whole": []})   # product seconds after a kill
    longest_span: float = 0.0    # first kill to next step, across back-to-back kills
    forwarded_s: float = 0.0
    wall_s: float = 0.0

    def table(self) -> str:
        def longest(kind):
            return f"{max(self.gaps[kind]):.1f} s (n={len(self.gaps[kind])})" if self.gaps[kind] else "-"
        rows = [
            ("seed", str(self.seed)),
            ("scenarios run", str(self.scenarios)),
            ("worker kills (pool process / whole worker)", f"{self.kills['pool']} / {self.kills['whole']}"),
            ("aborts sent / drains sent", f"{self.aborts} / {self.drains}"),
            ("activity racing the sweep", str(self.activities)),
            ("prune scale-downs acted / restored", f"{self.prune_acted} / {self.restores}"),
            ("runbook actions done (panel presses)", f"{self.runbook_actions} ({self.panel_presses})"),
            ("campaigns done / aborted", f"{self.campaigns['done']} / {self.campaigns['aborted']}"),
            ("campaign nodes safe or drained / dropped / aborted / returned",
             f"{self.campaign_nodes['safe'] + self.campaign_nodes['drained']} / {self.campaign_nodes['dropped']} / "
             f"{self.campaign_nodes['aborted']} / {self.campaign_nodes['returned']}"),
            ("faults injected (5xx / 409 / 429 / watches cut)",
             f"{self.faults['internal_error']} / {self.faults['conflict']} / {self.faults['throttled']} / "
             f"{self.faults['watch_dropped']}"),
            ("requests delayed (latency)", str(self.faults["delayed"])),
            ("invariant violations", str(len(self.violations))),
            ("longest unstepped gap after a pool-process kill (bound)",
             f"{longest('pool')} ({GAP_BOUND_S['pool']:.0f} s)"),
            ("longest unstepped gap after a whole-worker kill (bound)",
             f"{longest('whole')} ({GAP_BOUND_S['whole']:.0f} s)"),
            ("longest unstepped span across back-to-back kills", f"{self.longest_span:.1f} s"),
            ("product time fast-forwarded", f"{self.forwarded_s:.0f} s"),
            ("wall time", f"{self.wall_s:.0f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)} | {v}" for k, v in rows]
        lines += [f"  violation: {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass
class PendingGap:
    """A job whose stepping process was killed, not stepped since. Another kill before it is
    stepped again (the worker that got its message, or the one that would run the resume)
    starts the bound again from that kill, and a whole-worker kill makes it a whole kill;
    `first_killed_at` keeps the whole unstepped span."""
    kind: str
    job_id: int
    killed_at: object        # product time of the latest kill
    killed_wall: float
    first_killed_at: object = None
