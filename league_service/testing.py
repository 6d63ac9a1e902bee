"""Small builders for tests of the league and of code on top of it (results, a recording job launcher).

They build real messages and call nothing but the public league API: no fakes of the core itself.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable

from league_service.messages import EpisodeOutcome, JobResult, JobSpec, Outcome, PlayerOutcome


def battle_episode(home: str, away: str, outcome: Outcome, length: int = 10) -> EpisodeOutcome:
    """One two-player episode in which `home` had `outcome` (and `away` the reverse)."""
    return EpisodeOutcome(
        player_outcomes=(PlayerOutcome(home, outcome, 0.0), PlayerOutcome(away, outcome.reverse(), 0.0)),
        length=length,
    )


def battle_result(players: tuple[str, str], outcomes: Iterable[Outcome]) -> JobResult:
    """A finished battle job: one episode per outcome, each from players[0]'s side."""
    home, away = players
    return JobResult(
        launch_player=home,
        players=(home, away),
        episodes=tuple(battle_episode(home, away, o) for o in outcomes),
    )


def solo_result(player: str, returns: Iterable[float], length: int = 10) -> JobResult:
    return JobResult(
        launch_player=player,
        players=(player,),
        episodes=tuple(
            EpisodeOutcome((PlayerOutcome(player, Outcome.NONE, float(r)),), length) for r in returns
        ),
    )


class JobRecorder:
    """A launch_job_fn that queues every JobSpec for the test (or a worker thread) to take."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[JobSpec] = queue.Queue()

    def __call__(self, spec: JobSpec) -> None:
        self.jobs.put(spec)

    def take(self, n: int, timeout_s: float = 10.0) -> list[JobSpec]:
        """The next `n` jobs; raises queue.Empty if they do not come within timeout_s each."""
        return [self.jobs.get(timeout=timeout_s) for _ in range(n)]

    def drain(self) -> list[JobSpec]:
        specs = []
        while True:
            try:
                specs.append(self.jobs.get_nowait())
            except queue.Empty:
                return specs
