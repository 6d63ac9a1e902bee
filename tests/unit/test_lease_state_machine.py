"""Property test: random get / finish / heartbeat / expire / restart sequences against the real coordinator
(league core + lease table + SQLite store, no gRPC), with a fake clock for lease deadlines.

Checked after every step: every job is counted at most once; the league's match counter and payoff totals
equal the sum of accepted results; the jobs in flight are exactly the model's, each with one owner; launch
slots never exceed their limit.
"""

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant
from league_service.coordinator_testing import FakeClock, small_league_config
from league_service.errors import FailedPreconditionError
from league_service.leases import RECONNECT_GRACE_S, JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome

TIMEOUT = 10.0
WORKERS = ("w0", "w1", "w2")
# 2 active players x 2 slots, payoff without decay. Failed attempts are offered again and given up as usual,
# but without the backoff (its timing is tested in test_job_retries.py): a free slot always has a job ready.
CFG = small_league_config({"coordinator": {"job_retry_backoff_s": 0.0}})
TOTAL_SLOTS = 4


@dataclass
class Held:
    worker: str
    players: tuple[str, ...]
    deadline: float


def episodes_for(players: tuple[str, ...], wins: list[bool]) -> tuple[EpisodeOutcome, ...]:
    return tuple(
        EpisodeOutcome(
            (PlayerOutcome(players[0], Outcome.WIN if w else Outcome.LOSS),
             PlayerOutcome(players[1], Outcome.LOSS if w else Outcome.WIN)),
            length=5,
        )
        for w in wins
    )


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="lease-sm-"))
        self.clock = FakeClock()
        self.coord = self._open()
        self.held: dict[str, Held] = {}
        self.ended: dict[str, int] = {}  # job id -> episodes counted
        self.expired: set[str] = set()
        self.accepted_episodes = 0
        self.accepted_cross_games = 0  # episodes between two different players (self-play is not in the payoff)

    def _open(self) -> Coordinator:
        coord = Coordinator(
            CFG,
            CoordinatorSettings(shared_root=self.dir, lease_timeout_s=TIMEOUT, needs_learner=False, rng_seed=0),
            clock=self.clock,
            expiry_thread=False,
        )
        coord.start()
        for worker in WORKERS:
            coord.register_worker(worker, WorkerRole.ACTOR, "host", "")
        return coord

    def teardown(self) -> None:
        try:
            self.coord.close()
        finally:
            shutil.rmtree(self.dir)

    def _expire_model(self) -> None:
        """Every coordinator call first expires the leases past their deadline; the model does the same."""
        for job_id in [j for j, h in self.held.items() if h.deadline <= self.clock.now]:
            del self.held[job_id]
            self.expired.add(job_id)

    # ---- rules -------------------------------------------------------------------------------------------

    @precondition(lambda self: sum(h.deadline > self.clock.now for h in self.held.values()) < TOTAL_SLOTS)
    @rule(worker=st.sampled_from(WORKERS))
    def get(self, worker):
        self._expire_model()
        grant = self.coord.get_job(worker, WorkerRole.ACTOR, "", wait_s=20.0)
        assert isinstance(grant, JobGrant), grant
        assert grant.job_id not in self.held and grant.job_id not in self.ended and grant.job_id not in self.expired
        assert grant.lease_deadline == self.clock.now + TIMEOUT
        self.held[grant.job_id] = Held(worker, tuple(p.player_id for p in grant.players), grant.lease_deadline)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), status=st.sampled_from(list(JobEndStatus)[:3]), wins=st.lists(st.booleans(), max_size=3))
    def finish(self, data, status, wins):
        self._expire_model()
        if not self.held:
            return
        job_id = data.draw(st.sampled_from(sorted(self.held)))
        held = self.held.pop(job_id)
        episodes = episodes_for(held.players, wins)
        ack = self.coord.finish_job(FinishReport(held.worker, job_id, status, episodes, 10, 10, ""))
        counted = 0 if status is JobEndStatus.FAILED else len(episodes)
        assert not ack.duplicate and ack.episodes_counted == counted
        self.ended[job_id] = counted
        self.accepted_episodes += counted
        if held.players[0] != held.players[1]:
            self.accepted_cross_games += counted

    @precondition(lambda self: self.ended)
    @rule(data=st.data(), wins=st.lists(st.booleans(), max_size=3))
    def finish_again(self, data, wins):
        job_id = data.draw(st.sampled_from(sorted(self.ended)))
        worker = data.draw(st.sampled_from(WORKERS))
        try:
            ack = self.coord.finish_job(FinishReport(worker, job_id, JobEndStatus.COMPLETED, (), 0, 0, ""))
        except FailedPreconditionError:
            raise AssertionError("a retried finish must be acknowledged") from None
        assert ack.duplicate and ack.episodes_counted == self.ended[job_id]

    @precondition(lambda self: self.expired)
    @rule(data=st.data())
    def finish_expired(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.expired)))
        with pytest.raises(FailedPreconditionError, match="expired"):
            self.coord.finish_job(FinishReport(WORKERS[0], job_id, JobEndStatus.COMPLETED, (), 0, 0, ""))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish_by_another_worker(self, data):
        self._expire_model()
        if not self.held:
            return
        job_id = data.draw(st.sampled_from(sorted(self.held)))
        intruder = next(w for w in WORKERS if w != self.held[job_id].worker)
        with pytest.raises(FailedPreconditionError):
            self.coord.finish_job(FinishReport(intruder, job_id, JobEndStatus.COMPLETED, (), 0, 0, ""))

    @rule(worker=st.sampled_from(WORKERS), foreign=st.booleans())
    def heartbeat(self, worker, foreign):
        self._expire_model()
        mine = sorted(j for j, h in self.held.items() if h.worker == worker)
        others = sorted(j for j, h in self.held.items() if h.worker != worker)[:1] if foreign else []
        result = self.coord.heartbeat(worker, mine + others + sorted(self.expired)[:1])
        assert set(result.revoked_job_ids) == set(others) | set(sorted(self.expired)[:1])
        for job_id in mine:
            self.held[job_id].deadline = self.clock.now + TIMEOUT

    @rule(dt=st.sampled_from([0.5, 4.0, 9.99, 10.0, 25.0]))
    def advance_clock(self, dt):
        self.clock.now += dt
        self.coord.expire_due()
        self._expire_model()

    @rule()
    def restart(self):
        """Close and reopen on the same store (close writes nothing: the same as a crash after the last commit)."""
        self.coord.close()
        self.coord = self._open()
        self._expire_model()
        for held in self.held.values():  # in-flight leases come back with a fresh deadline (and reconnect grace)
            held.deadline = self.clock.now + TIMEOUT + RECONNECT_GRACE_S

    # ---- invariants --------------------------------------------------------------------------------------

    @invariant()
    def league_agrees_with_the_model(self):
        status = self.coord.status()
        self._expire_model()
        assert status.league.counters.matches == self.accepted_episodes
        assert status.counters.episodes == self.accepted_episodes
        # Games played: the decayed counts of a player reset by a mutation start afresh; these never do.
        games = sum(r.played for r in status.league.payoff if r.home < r.away)
        assert games == self.accepted_cross_games
        assert {j.job_id: j.worker_id for j in status.jobs} == {j: h.worker for j, h in self.held.items()}
        for player in status.league.players:
            if player.active:
                in_flight = sum(1 for j in status.jobs if j.launch_player == player.player_id)
                assert in_flight <= player.slots_used <= player.slots_limit


CoordinatorMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
TestCoordinatorStateMachine = CoordinatorMachine.TestCase
