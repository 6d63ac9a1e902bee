"""`python -m learner_service.cli learner` as a real subprocess: SIGTERM releases its player, SIGKILL + restart
resumes it. The coordinator runs in process (a real one, port 0)."""

from __future__ import annotations

from common.checkpoint_store import CheckpointStore
from common.proto.league.v1 import league_pb2
from league_service.coordinator_testing import league_stub, running_coordinator, server_process
from learner_service.learner_testing import Rollout, learner_command
from tests.integration.test_learner_service import (
    PLAYER,
    acting_task,
    eventually,
    player_status,
    push,
    solo_config,
)


def _learner(coordinator: str, shared_root, log_path, worker_id: str):
    return server_process(
        learner_command("--coordinator", coordinator, "--shared-root", str(shared_root), "--worker-id", worker_id,
                        "--device", "cpu", "--log-level", "INFO"),
        log_path,
    )


def _status(address: str) -> league_pb2.LeagueStatus:
    channel, stub = league_stub(address)
    try:
        return stub.GetStatus(league_pb2.GetStatusRequest())
    finally:
        channel.close()


def test_sigterm_publishes_a_final_checkpoint_reports_and_releases_the_player(tmp_path):
    cfg = solo_config(batch_size=256, publish_every=100)  # only the final checkpoint is published after v0
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=5.0) as coordinator:
            with _learner(coordinator.address, tmp_path, tmp_path / "learner.log", "learner-p") as proc:
                bound = eventually(lambda: (s := player_status(coordinator.address)).checkpoint_path and s)
                assert bound.learner_worker_id == "learner-p" and bound.checkpoint_version == 0
                summary = push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 5, policy_version=0))
                assert summary.chunks_accepted == 5
                assert proc.terminate() == 0, proc.log_tail()
            latest = CheckpointStore(tmp_path).latest(PLAYER)
            assert latest.version == 2 and latest.metadata["agent_steps"] == 640  # 2 iterations of 256 + 128 left
            status = _status(coordinator.address)
            player = next(p for p in status.players if p.player_id == PLAYER)
            assert player.learner_worker_id == ""  # released: the next learner can take it at once
            assert (player.checkpoint_version, player.agent_steps, player.train_iteration) == (2, 640, 2)
            assert not [j for j in status.jobs if j.kind == league_pb2.JOB_KIND_LEARN]
            assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0
    finally:
        rollout.close()


def test_a_killed_learner_restarted_with_its_worker_id_resumes_without_going_back(tmp_path):
    cfg = solo_config(batch_size=128)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=5.0) as coordinator:
            with _learner(coordinator.address, tmp_path, tmp_path / "learner-1.log", "learner-k") as proc:
                eventually(lambda: player_status(coordinator.address).checkpoint_path)
                push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 3, policy_version=0))
                eventually(lambda: player_status(coordinator.address).checkpoint_version == 3)
                proc.kill()  # no cleanup at all
            before = CheckpointStore(tmp_path).latest(PLAYER)
            assert before.version == 3 and before.metadata["agent_steps"] == 384

            with _learner(coordinator.address, tmp_path, tmp_path / "learner-2.log", "learner-k") as proc:
                eventually(lambda: "taking trajectories" in proc.log_tail(100))
                assert CheckpointStore(tmp_path).latest(PLAYER) == before  # resumed from it, nothing republished
                push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 2, policy_version=3))
                eventually(lambda: player_status(coordinator.address).checkpoint_version == 5)
                assert proc.terminate() == 0, proc.log_tail()
            status = player_status(coordinator.address)
            assert (status.agent_steps, status.train_iteration, status.checkpoint_version) == (640, 5, 5)
    finally:
        rollout.close()
