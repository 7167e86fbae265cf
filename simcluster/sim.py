"""The simulation: the store, the clock, the controllers and the timers that drive them.

Controllers are level-triggered like real ones: each `reconcile` looks at the store
and writes what is missing. `run_to_rest` calls them all until a whole round writes
nothing. Time-based behaviour (start-up delays, grace periods, the KPA's windows)
asks for a wake-up with `wake_at`, so `advance` jumps from timer to timer instead of
ticking: advancing an hour costs as much as the events in that hour.
"""
from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from .clock import SimClock
from .store import Store
from .validation import validate

log = logging.getLogger("simcluster")

# Controller rounds `run_to_rest` runs at most before it gives up on coming to rest.
MAX_ROUNDS = 100


class Controller(Protocol):
    name: str

    def reconcile(self, sim: "Simulation") -> None:
        """Bring the store one step closer to the desired state."""


@dataclass
class SimSettings:
    """The `simcluster.io/v1alpha1 Simulation` document of a scenario (spec fields)."""
    # Scheduler placement: "spread" (least allocated, like the default scheduler) or
    # "most-allocated" (bin-packing).
    placement: str = "spread"
    # Seconds from binding to Running+Ready; `simcluster.io/startup-seconds` overrides.
    startup_seconds: float = 5.0
    # Knative 1.15 by default, the version the real tier runs and was measured on: a
    # Revision annotation patch rolls the revision's pods and the PA does not follow it; a
    # direct PA patch stays and scales. ">= 1.21" models the newer rule read in Knative's
    # sources (the Revision's autoscaling annotations copied onto the PA), never run.
    knative_version: str = "1.15"
    # KServe honours `serving.kserve.io/stop` from 0.15 on.
    kserve_version: str = "0.15"
    # KPA stable window and scale-to-zero grace period, seconds.
    stable_window_seconds: float = 60.0
    scale_to_zero_grace_seconds: float = 30.0
    # Concurrency per pod when a revision has no `target` annotation.
    default_target_concurrency: float = 100.0
    # Wall-clock seconds between controller passes when the clock runs (--speed).
    tick_seconds: float = 0.2
    # Bearer tokens: token -> {user: NAME, groups: [..]} (see api/auth.py for who else is known).
    tokens: dict = field(default_factory=dict)
    # A request without credentials: "admin" (full access, like the old insecure port),
    # "rbac" (system:anonymous, authorized by RBAC) or "reject" (401).
    anonymous_access: str = "admin"
    # API groups this cluster does not serve (e.g. ["serving.kserve.io"]: Knative without
    # KServe). Their paths answer as kube-apiserver does for a group nobody installed:
    # 404 with the plain-text body "404 page not found", and discovery omits them.
    unserved_groups: list = field(default_factory=list)
    # kube-apiserver's --etcd-compaction-interval (300 upstream): every interval of simulated
    # time the history before the previous pass is forgotten, and older watch versions and
    # LIST continue tokens answer 410 Expired. 0: never (only the history's length bounds it).
    etcd_compaction_interval_seconds: float = 0.0
    # Real seconds the store keeps its history of writes (and the versions they replaced)
    # whatever the simulated clock does: 300, as etcd's compaction every 5 minutes. Older
    # watch versions and LIST continue tokens then answer 410. 0: only the history's
    # length (200,000 writes) bounds it.
    history_seconds: float = 300.0
    extra: dict = field(default_factory=dict)


class Simulation:
    def __init__(self, *, clock: SimClock | None = None, settings: SimSettings | None = None,
                 controllers: list[Controller] | None = None):
        self.clock = clock or SimClock()
        self.settings = settings or SimSettings()
        self.store = Store(self.clock, validator=validate, history_seconds=self.settings.history_seconds)
        self.controllers: list[Controller] = list(controllers or [])
        # Requested load per Knative revision: (namespace, revision) -> concurrency.
        self.load: dict[tuple[str, str], float] = {}
        self._timers: list[datetime] = []
        self._reconcile_lock = threading.RLock()

    # ---- timers --------------------------------------------------------------------
    def wake_at(self, moment: datetime) -> None:
        """Ask for a controller pass at `moment` on the simulated clock."""
        with self._reconcile_lock:
            heapq.heappush(self._timers, moment)

    def wake_after(self, seconds: float) -> None:
        self.wake_at(self.clock.now() + timedelta(seconds=seconds))

    def next_timer(self) -> datetime | None:
        return self._timers[0] if self._timers else None

    # ---- driving ---------------------------------------------------------------------
    def run_to_rest(self, max_rounds: int = MAX_ROUNDS) -> int:
        """Run every controller until a whole round writes nothing; returns the rounds."""
        with self._reconcile_lock, self.store.lock:
            for rounds in range(1, max_rounds + 1):
                before = self.store.resource_version
                for controller in self.controllers:
                    controller.reconcile(self)
                if self.store.resource_version == before:
                    return rounds
            log.warning("controllers did not come to rest after %d rounds", max_rounds)
            return max_rounds

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward, firing every timer due on the way, and come to rest."""
        with self._reconcile_lock:
            target = self.clock.now() + timedelta(seconds=seconds)
            rested = self.run_to_rest() < MAX_ROUNDS
            while self._timers and self._timers[0] <= target:
                moment = heapq.heappop(self._timers)
                # Timers asked for the same instant fire together.
                while self._timers and self._timers[0] <= moment:
                    heapq.heappop(self._timers)
                self.clock.set(moment)
                rested = False
                self.run_to_rest()
            # At rest at the target already (no time to move, no timer fired): another
            # round would read the same objects at the same time and write nothing.
            if not rested or self.clock.now() != target:
                self.clock.set(target)
                self.run_to_rest()
            return self.clock.now()

    def tick(self) -> None:
        """One pass of a running clock (--speed): fire due timers and come to rest."""
        with self._reconcile_lock:
            now = self.clock.now()
            while self._timers and self._timers[0] <= now:
                heapq.heappop(self._timers)
            self.run_to_rest()
