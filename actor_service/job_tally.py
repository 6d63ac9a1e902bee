"""What an actor logs about its jobs: one line a minute, not two a job.

An actor of the default league ends a job every fraction of a second; a line per job made its log grow by
~13 MB an hour in a `league run` (logs there are plain files, never rotated). Jobs that end in the usual way
are summed up here and logged once per `interval_s`; a job that ends any other way (released, failed, refused,
with an error) still gets its own line at once. Every job's line is there at DEBUG (`--log-level DEBUG`), and so
is every mid-job reload of a newer version (one per learner publish: ~30 lines a minute per actor otherwise).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("actor_service.actor")

SUMMARY_INTERVAL_S = 60.0


@dataclass
class JobTally:
    interval_s: float = SUMMARY_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    since: float = field(default=-1.0)
    statuses: Counter[str] = field(default_factory=Counter)
    episodes: int = 0
    env_steps: int = 0
    agent_steps: int = 0

    def __post_init__(self) -> None:
        if self.since < 0:
            self.since = self.clock()

    def add(self, status: str, episodes: int, env_steps: int, agent_steps: int) -> str | None:
        """Count one ended job; returns the summary line once `interval_s` has passed since the last one."""
        self.statuses[status] += 1
        self.episodes += episodes
        self.env_steps += env_steps
        self.agent_steps += agent_steps
        now = self.clock()
        if now - self.since < self.interval_s:
            return None
        return self.take(now)

    def take(self, now: float | None = None) -> str | None:
        """The summary of what was counted since the last one (None: nothing), and start counting anew."""
        now = self.clock() if now is None else now
        if not self.statuses:
            return None
        seconds = max(now - self.since, 1e-9)
        jobs = sum(self.statuses.values())
        how = ", ".join(f"{n} {status}" for status, n in sorted(self.statuses.items()))
        line = (f"{jobs} job(s) in the last {seconds:.0f} s ({how}): {self.episodes} episodes, {self.env_steps} env "
                f"steps ({self.env_steps / seconds:,.0f}/s), {self.agent_steps} agent steps")
        self.since = now
        self.statuses.clear()
        self.episodes = self.env_steps = self.agent_steps = 0
        return line
