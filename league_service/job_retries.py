"""How the coordinator retries collect jobs that fail, and when it stops: pure policy and per-player books.

A collect job is attempted (leased) up to `max_attempts` times; an attempt fails when its actor finishes it
FAILED or its lease expires. Consecutive failed attempts of one launch player (across its jobs) are counted
until one of its jobs completes; once they reach `max_attempts`, every further job of that player waits an
exponentially growing delay before it is handed out, so a broken env or player costs one attempt per backoff
period instead of a worker's full speed. Semantics: LEASES.md ("Failing jobs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# FinishJob's error text is stored and shown; keep it bounded whatever a worker sends.
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class JobRetryPolicy:
    """`max_attempts` leases per collect job; then backoff_s, 2 x backoff_s, ... up to max_backoff_s."""

    max_attempts: int = 3
    backoff_s: float = 5.0
    max_backoff_s: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be an int >= 1, got {self.max_attempts!r}")
        if not (math.isfinite(self.backoff_s) and self.backoff_s >= 0):
            raise ValueError(f"backoff_s: must be a finite number >= 0, got {self.backoff_s!r}")
        if not (math.isfinite(self.max_backoff_s) and self.max_backoff_s >= self.backoff_s):
            raise ValueError(f"max_backoff_s: must be finite and >= backoff_s ({self.backoff_s}), "
                             f"got {self.max_backoff_s!r}")

    def delay_s(self, failures_in_a_row: int) -> float:
        """How long the player's next attempt waits after this many consecutive failed attempts."""
        if failures_in_a_row < self.max_attempts:
            return 0.0
        # 2 ** exponent overflows a float past ~1000: the cap is reached long before.
        exponent = min(failures_in_a_row - self.max_attempts, 64)
        return min(self.backoff_s * 2.0**exponent, self.max_backoff_s)


@dataclass(frozen=True)
class PlayerJobFailures:
    """One launch player's failure books (durable: a restart keeps backing off where it was)."""

    player_id: str
    # Failed attempts since the player's last completed job.
    failures_in_a_row: int = 0
    # Jobs given up (every attempt failed) since the league was created.
    jobs_given_up: int = 0
    last_error: str = ""
    last_failure_at: float = 0.0
    # The player's jobs are not handed out before this time (0: no backoff).
    held_until: float = 0.0

    def failed(self, error: str, now: float, policy: JobRetryPolicy, given_up: bool) -> PlayerJobFailures:
        failures = self.failures_in_a_row + 1
        delay = policy.delay_s(failures)
        return replace(
            self,
            failures_in_a_row=failures,
            jobs_given_up=self.jobs_given_up + (1 if given_up else 0),
            last_error=bounded_error(error),
            last_failure_at=now,
            held_until=now + delay if delay > 0 else 0.0,
        )

    def succeeded(self) -> PlayerJobFailures:
        return replace(self, failures_in_a_row=0, held_until=0.0)


def bounded_error(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` cut to `limit` characters, keeping its first line and its end (where a traceback's cause is)."""
    if len(text) <= limit:
        return text
    head = text.split("\n", 1)[0][: limit // 2]
    marker = "\n[...]\n"
    return head + marker + text[-(limit - len(head) - len(marker)):]
