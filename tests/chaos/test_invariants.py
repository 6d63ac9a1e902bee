"""The invariant checker itself: silent on a real league's books, loud on books that were tampered with."""

from __future__ import annotations

import pytest

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import (
    league_stub,
    outcomes_for,
    running_coordinator,
    small_league_config,
)
from tests.chaos.invariants import (
    InvariantViolation,
    as_status,
    assert_invariants,
    check_ledger,
    check_status,
    read_ledger,
)


def _play(address: str, jobs: int) -> dict[str, int]:
    """One actor finishing `jobs` collect jobs (the last one failed); returns what it was told was counted."""
    channel, stub = league_stub(address)
    accepted: dict[str, int] = {}
    with channel:
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="a0", role=pb.WORKER_ROLE_ACTOR))
        for i in range(jobs):
            job = stub.GetJob(pb.GetJobRequest(worker_id="a0", role=pb.WORKER_ROLE_ACTOR, wait_s=5.0)).job
            status = pb.FINISH_STATUS_FAILED if i == jobs - 1 else pb.FINISH_STATUS_COMPLETED
            episodes = [] if i == jobs - 1 else outcomes_for(job, [True, False, i % 2 == 0])
            ack = stub.FinishJob(pb.FinishJobRequest(worker_id="a0", job_id=job.job_id, status=status,
                                                     episodes=episodes, env_steps=10))
            again = stub.FinishJob(pb.FinishJobRequest(worker_id="a0", job_id=job.job_id, status=status))
            assert again.duplicate and not ack.duplicate
            accepted[job.job_id] = ack.episodes_counted
        # One more job left in flight.
        stub.GetJob(pb.GetJobRequest(worker_id="a0", role=pb.WORKER_ROLE_ACTOR, wait_s=5.0))
    return accepted


def test_a_real_league_satisfies_the_invariants_and_tampering_is_caught(tmp_path):
    cfg = small_league_config({"league": {"payoff": {"decay": 1.0}}})
    with running_coordinator(cfg, tmp_path, needs_learner=False, lease_timeout_s=30.0) as server:
        before = assert_invariants(server.address, state_path=tmp_path / "league_state.sqlite")
        accepted = _play(server.address, jobs=6)
        after = assert_invariants(server.address, state_path=tmp_path / "league_state.sqlite", earlier=before,
                                  accepted=accepted, accepted_complete=True, payoff_decay=1.0)
    assert after is not None and after.counters.matches == sum(accepted.values()) > 0
    assert len(after.jobs) == 1 and after.counters.jobs_failed == 1
    ledger = read_ledger(tmp_path / "league_state.sqlite")
    assert_invariants(status=after, state_path=tmp_path / "league_state.sqlite", coordinator_stopped=True,
                      accepted=accepted, accepted_complete=True)

    # A match counted twice, a lost snapshot, a job with two owners, a slot over its limit: each is caught.
    doubled = pb.LeagueStatus()
    doubled.CopyFrom(after)
    doubled.counters.matches += 1
    with pytest.raises(InvariantViolation, match="counters.matches"):
        check_status(doubled, accepted=accepted, accepted_complete=True)
    with pytest.raises(InvariantViolation, match="went back"):
        check_status(after, earlier=doubled)
    snapshot = pb.LeagueStatus()
    snapshot.CopyFrom(after)
    snapshot.players.add(player_id="main_player_default_0_100", active=False)
    with pytest.raises(InvariantViolation, match="disappeared"):
        check_status(after, earlier=snapshot)
    two_owners = pb.LeagueStatus()
    two_owners.CopyFrom(after)
    two_owners.jobs.append(after.jobs[0])
    with pytest.raises(InvariantViolation, match="two owners"):
        check_status(two_owners)
    over = as_status({**_as_dict(after)})
    over.players[0].slots_used = over.players[0].slots_limit + 1
    with pytest.raises(InvariantViolation, match="slots_used"):
        check_status(over)
    lost = dict(accepted)
    lost["not-a-recorded-job"] = 2
    with pytest.raises(InvariantViolation, match="lost"):
        check_ledger(ledger, accepted=lost)


def _as_dict(status: pb.LeagueStatus) -> dict:
    import json

    from league_service.status_view import status_to_json

    return json.loads(status_to_json(status))
