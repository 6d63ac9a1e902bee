"""What `league run` watches in its status polls: the step rate, the env-step budget, collect jobs that keep
failing. Each is counted from the run's first poll, because a run resumed in the same --run-dir starts with
the counters its league already had."""

from __future__ import annotations

from collections import deque
from typing import Any


class StepRate:
    """Env steps per second over the last `window_s` or more of status polls.

    The first poll only sets the baseline: a run resumed in an existing --run-dir starts from the steps its
    league counted before (measured from 0, the first line showed over a million steps per second). Between two
    polls alone, the rate swung with whichever jobs finished in the gap: polls milliseconds apart (the last one
    before the --seconds budget, those near an --env-steps budget) showed 0/s or 55,000/s in a 4,000/s run.
    """

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._polls: deque[tuple[int, float]] = deque()

    def update(self, env_steps: int, now: float) -> float:
        polls = self._polls
        polls.append((env_steps, now))
        # The base: the newest poll at least window_s before this one (the oldest while none is that old).
        while len(polls) > 2 and now - polls[1][1] >= self.window_s:
            polls.popleft()
        if len(polls) < 2:
            return 0.0
        base_steps, base_time = polls[0]
        return (env_steps - base_steps) / max(now - base_time, 1e-9)


class StepBudget:
    """The run's env-step budget, counted like --seconds from this run's start.

    The league's counter carries the steps of earlier runs in the same --run-dir, so the first status poll sets
    the baseline. `wait_s` shortens the poll interval as the budget nears, so the run stops close to it
    instead of up to a whole interval of steps past it.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._start: int | None = None

    def steps(self, league_steps: int) -> int:
        """Steps of this run so far, given the league's counter."""
        if self._start is None:
            self._start = league_steps
        return league_steps - self._start

    def spent(self, league_steps: int) -> bool:
        return self.budget > 0 and self.steps(league_steps) >= self.budget

    def wait_s(self, league_steps: int, steps_per_s: float, interval_s: float) -> float:
        """How long to wait before the next poll: the interval, or less when the budget runs out sooner."""
        if self.budget <= 0 or steps_per_s <= 0:
            return interval_s
        left = max(0, self.budget - self.steps(league_steps))
        return min(interval_s, max(MIN_POLL_S, left / steps_per_s))


MIN_POLL_S = 0.1


class FailingJobsWatch:
    """Stops a run whose collect jobs are given up while none of its jobs completes.

    A job every actor fails the same way (a two-player env with no bots in a solo league, an env that needs a
    package the actors lack) is retried and then given up (LEASES.md), so the league keeps serving and nothing
    exits: without this the run would spend its whole budget training nothing. Counted from the run's first
    status poll, like the budgets.
    """

    def __init__(self) -> None:
        self._start: tuple[int, int] | None = None  # (jobs_finished, jobs_given_up) at the first poll

    def check(self, status: Any) -> str | None:
        """The reason to stop, or None while the run is healthy."""
        c = status.counters
        if self._start is None:
            self._start = (c.jobs_finished, c.jobs_given_up)
        finished, given_up = c.jobs_finished - self._start[0], c.jobs_given_up - self._start[1]
        if given_up == 0 or finished > 0:
            return None
        errors = [f"{p.player_id}: {_last_line(p.last_job_error)}" for p in status.players
                  if p.active and p.jobs_given_up and p.last_job_error.strip()]
        return (f"{given_up} collect job(s) given up after repeated failures and none finished; "
                + ("; ".join(errors) if errors else "see the actors' logs"))


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


STALL_WARN_S = 60.0
"""Env steps standing still this long (from the first poll) are said in the run's output."""


class StallWatch:
    """Says so when the league stops making progress, and again when it resumes.

    The supervisor restarts processes that die, but a league can stall with every process alive: a full disk
    (the learners' publishes fail and retry), a coordinator that cannot write its state. The run's output then
    only showed "0/s" while the reason was in a process's log. Progress is env steps (counted as collect jobs
    finish) or agent steps the learners report: a job of many env steps (`env.env_steps: 200000`) adds no env
    steps for minutes while its learner trains on what it streams, which is no stall.
    """

    def __init__(self, after_s: float = STALL_WARN_S) -> None:
        self.after_s = after_s
        self._progress: tuple[int, int] | None = None
        self._since = 0.0
        self._warned = False

    def check(self, env_steps: int, now: float, trained_steps: int = 0) -> str | None:
        progress = (env_steps, trained_steps)
        if self._progress is None or progress != self._progress:
            resumed = self._warned and self._progress is not None
            self._progress, self._since, self._warned = progress, now, False
            return "the league makes progress again" if resumed else None
        if not self._warned and now - self._since >= self.after_s:
            self._warned = True
            return (f"no env steps and no training for {now - self._since:.0f} s, every process running: the "
                    "processes' logs say why (a full disk, a learner failing to publish, ...)")
        return None
