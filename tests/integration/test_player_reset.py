"""A mutation (reset) decided by the snapshot thread is not lost with an UpdatePlayer reply: every reply repeats
it until the learner acknowledges it (reset_applied_version), across a coordinator restart too; the learner's
LeagueClient acknowledges the resets its caller applied."""

from __future__ import annotations

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from learner_service.league_client import LeagueClient
from learner_service.trainer import Progress
from tests.polling import wait_until

PLAYER = "league_exploiter_default_0"
# One league exploiter that is snapshot every 100 agent steps and reset (to a fresh start) every time.
CFG = small_league_config({
    "league": {
        "active_players": {"league_exploiter": 1},
        "league_exploiter": {"one_phase_step": 100, "strong_win_rate": None, "mutate_prob": 1.0},
    },
})


def _update(stub, worker: str, steps: int, version: int, reset_applied: int = 0) -> pb.UpdatePlayerResponse:
    """UpdatePlayer as a learner that never saw a reply (its own stub, not the learner's client)."""
    return stub.UpdatePlayer(pb.UpdatePlayerRequest(
        worker_id=worker, player_id=PLAYER, train_iteration=steps // 10, agent_steps=steps,
        checkpoint_path=f"{PLAYER}/v{version}.pt", checkpoint_version=version, reset_applied_version=reset_applied,
    ))


def _player(stub) -> pb.PlayerStatus:
    return next(p for p in stub.GetStatus(pb.GetStatusRequest()).players if p.player_id == PLAYER)


def test_a_reset_is_repeated_until_the_learner_acknowledges_it(tmp_path):
    (tmp_path / PLAYER).mkdir()
    for version in (1, 2, 3):
        (tmp_path / PLAYER / f"v{version}.pt").write_bytes(b"weights %d" % version)
    with running_coordinator(CFG, tmp_path, lease_timeout_s=30.0) as server:
        client = LeagueClient(server.address, "learner-1")
        channel, stub = league_stub(server.address)
        try:
            client.register("127.0.0.1:1")
            assert client.next_learn_job("127.0.0.1:1", wait_s=5.0).player_id == PLAYER
            reply = client.update_player(PLAYER, Progress(agent_steps=100, train_iteration=10), f"{PLAYER}/v1.pt", 1)
            assert reply is not None and not reply.mutated
            wait_until("the snapshot and reset", lambda: _player(stub).mutations == 1, 30)
            reset_version = _player(stub).checkpoint_version
            assert reset_version == 2  # the player's version 1, reset: 2

            # The reply that carried the reset is lost, twice: the reset stays, the stale checkpoints are ignored.
            for steps in (110, 120):
                lost = _update(stub, "learner-1", steps, 2)
                assert (lost.mutated, lost.reset_checkpoint_version) == (True, reset_version)
            assert _player(stub).checkpoint_version == reset_version and _player(stub).agent_steps == 120
            # Acknowledging an older reset is not acknowledging this one.
            assert _update(stub, "learner-1", 125, 2, reset_applied=reset_version - 1).mutated

            # The learner's client sees it this time, and its next report (trained from the reset) says so.
            seen = client.update_player(PLAYER, Progress(agent_steps=130, train_iteration=13), f"{PLAYER}/v2.pt", 2)
            assert seen is not None and seen.mutated and seen.reset_checkpoint_version == reset_version
            # Not applied (its checkpoint could not be loaded, say): not acknowledged, so the reset stays. It was
            # acknowledged on sight, and the league took checkpoints trained from the weights it threw away.
            again = client.update_player(PLAYER, Progress(agent_steps=135, train_iteration=13), f"{PLAYER}/v2.pt", 2)
            assert again is not None and again.mutated
            client.ack_reset(PLAYER, seen.reset_checkpoint_version)  # what the session does once it applied it
            after = client.update_player(PLAYER, Progress(agent_steps=140, train_iteration=14), f"{PLAYER}/v3.pt", 3)
            assert after is not None and not after.mutated
            status = _player(stub)
            assert (status.checkpoint_path, status.checkpoint_version) == (f"{PLAYER}/v3.pt", 3)
            assert not _update(stub, "learner-1", 150, 3).mutated  # acknowledged once is enough
        finally:
            channel.close()
            client.close()


def test_an_unacknowledged_reset_survives_a_coordinator_restart(tmp_path):
    (tmp_path / PLAYER).mkdir()
    for version in (1, 3):
        (tmp_path / PLAYER / f"v{version}.pt").write_bytes(b"weights %d" % version)
    state = tmp_path / "league_state.sqlite"
    with running_coordinator(CFG, tmp_path, lease_timeout_s=30.0) as server:
        channel, stub = league_stub(server.address)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="learner-1", role=pb.WORKER_ROLE_LEARNER))
            stub.GetJob(pb.GetJobRequest(worker_id="learner-1", role=pb.WORKER_ROLE_LEARNER,
                                         data_endpoint="127.0.0.1:1", wait_s=5.0))
            assert not _update(stub, "learner-1", 100, 1).mutated
            wait_until("the snapshot and reset", lambda: _player(stub).mutations == 1, 30)
            assert _update(stub, "learner-1", 110, 1).mutated  # ... and the reply is lost
    assert state.is_file()
    with running_coordinator(CFG, tmp_path, lease_timeout_s=30.0) as server:
        channel, stub = league_stub(server.address)
        with channel:
            again = _update(stub, "learner-1", 120, 1)  # its learn job was restored with the league
            assert (again.mutated, again.reset_checkpoint_version) == (True, 2)
            assert not _update(stub, "learner-1", 130, 3, reset_applied=2).mutated
