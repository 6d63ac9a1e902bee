"""JobTally: usual job ends are summed into one line per interval instead of a line per job."""

from __future__ import annotations

from actor_service.job_tally import JobTally
from tests.manual_clock import ManualClock


def test_jobs_are_summed_until_the_interval_has_passed_then_counting_starts_anew():
    clock = ManualClock(100.0)
    tally = JobTally(interval_s=60.0, clock=clock)
    clock.now += 20
    assert tally.add("completed", 32, 700, 350) is None
    clock.now += 20
    assert tally.add("released", 5, 100, 50) is None
    clock.now += 20
    line = tally.add("completed", 32, 800, 400)
    assert line == ("3 job(s) in the last 60 s (2 completed, 1 released): 69 episodes, 1600 env steps (27/s), "
                    "800 agent steps")
    clock.now += 30
    assert tally.add("completed", 1, 10, 5) is None
    assert tally.take() == "1 job(s) in the last 30 s (1 completed): 1 episodes, 10 env steps (0/s), 5 agent steps"
    assert tally.take() is None  # nothing since
