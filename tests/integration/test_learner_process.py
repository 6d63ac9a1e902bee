"""`python -m learner_service.cli learner` as a real subprocess: SIGTERM releases its player, SIGKILL + restart
resumes it. The coordinator runs in process (a real one, port 0)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import grpc
import yaml

from common.checkpoint_store import CheckpointStore
from common.proto.league.v1 import league_pb2
from league_service.config import config_to_dict
from league_service.coordinator_testing import (
    coordinator_process,
    league_stub,
    running_coordinator,
    server_process,
)
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
            # 2 iterations of 256, then the 128 left as a last, smaller batch: the actor will not resend them.
            assert latest.version == 3 and latest.metadata["agent_steps"] == 640
            status = _status(coordinator.address)
            player = next(p for p in status.players if p.player_id == PLAYER)
            assert player.learner_worker_id == ""  # released: the next learner can take it at once
            assert (player.checkpoint_version, player.agent_steps, player.train_iteration) == (3, 640, 3)
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


def test_chunks_a_killed_learner_trained_and_published_are_duplicates_for_its_successor(tmp_path):
    """A learner killed with a stream open never acknowledged its chunks, so the actor sends them all again. Those
    trained into the checkpoint the next learner resumes are counted as duplicates (they were trained a second
    time before, at most a stream's worth per actor); one held short of a batch at the kill is trained."""
    cfg = solo_config(batch_size=256)  # two 128-sample chunks a batch
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    release = threading.Event()
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=5.0) as coordinator:
            with _learner(coordinator.address, tmp_path, tmp_path / "learner-1.log", "learner-k") as proc:
                eventually(lambda: player_status(coordinator.address).checkpoint_path)
                chunks = rollout.chunks(acting_task(cfg, tmp_path), 3, policy_version=0)

                def open_stream():
                    yield from chunks
                    release.wait(60)  # the stream stays open: nothing of it is acknowledged

                answer: list = []
                pusher = threading.Thread(target=lambda: answer.append(_pushed(proc.address, open_stream())))
                pusher.start()
                eventually(lambda: player_status(coordinator.address).checkpoint_version == 1)
                proc.kill()
                release.set()
                pusher.join(60)
            assert isinstance(answer[0], grpc.RpcError)  # the actor resends the whole stream
            killed = CheckpointStore(tmp_path).latest(PLAYER)
            assert killed.version == 1 and killed.metadata["agent_steps"] == 256

            with _learner(coordinator.address, tmp_path, tmp_path / "learner-2.log", "learner-k") as proc:
                eventually(lambda: "taking trajectories" in proc.log_tail(100))
                resent = push(proc.address, chunks)
                assert (resent.chunks_duplicate, resent.chunks_accepted) == (2, 1)
                push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 1, policy_version=1))
                eventually(lambda: player_status(coordinator.address).checkpoint_version == 2)
                assert proc.terminate() == 0, proc.log_tail()
            final = CheckpointStore(tmp_path).latest(PLAYER)
            # The second batch: the chunk held at the kill and the new one (before: the two published ones were
            # trained again, a batch of their own, and version 2 held 3 x 256 steps).
            assert final.version == 2 and final.metadata["train_iteration"] == 2
            assert final.metadata["agent_steps"] == 512
    finally:
        release.set()
        rollout.close()


def _pushed(address: str, chunks):
    try:
        return push(address, chunks, timeout_s=60)
    except grpc.RpcError as err:
        return err


HUNG_SHARE = """
import os, sys, threading
root = sys.argv.pop(1)
real_open = os.open
def hung_open(path, flags, *args, **kwargs):
    # Once a marker exists, a file created ("hang") or read ("hang-reads") under the shared root never opens, as
    # on an NFS mount whose server went away (hard mount): the thread waits in the kernel, where no interrupt
    # gets in.
    marker = "hang" if flags & os.O_CREAT else "hang-reads"
    if str(path).startswith(root) and os.path.exists(os.path.join(root, marker)):
        os.close(real_open(os.path.join(root, "hung"), os.O_WRONLY | os.O_CREAT))  # for the test: it hangs now
        threading.Event().wait()
    return real_open(path, flags, *args, **kwargs)
os.open = hung_open
import argparse
from learner_service.cli import add_arguments, main
parser = argparse.ArgumentParser()
add_arguments(parser)
sys.exit(main(parser.parse_args(sys.argv[1:])))
"""


@contextlib.contextmanager
def _learner_stuck_in_a_publish(tmp_path, lease_timeout_s: float, *flags: str):
    """A learner (HUNG_SHARE) bound to the solo player, whose publish of v1 hangs; yields (coordinator, learner)."""
    cfg = solo_config(batch_size=128, publish_every=1)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=lease_timeout_s) as coordinator:
            command = [sys.executable, "-c", HUNG_SHARE, str(tmp_path), "--coordinator", coordinator.address,
                       "--shared-root", str(tmp_path), "--worker-id", "learner-h", "--device", "cpu", *flags]
            with server_process(command, tmp_path / "learner.log") as proc:
                eventually(lambda: player_status(coordinator.address).checkpoint_path)  # v0 published
                (tmp_path / "hang").touch()
                push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 1, policy_version=0))  # one batch
                eventually(lambda: (tmp_path / "hung").exists(), timeout_s=30)  # its publish of v1 hangs
                yield coordinator, proc
    finally:
        rollout.close()


def test_a_publish_that_hangs_lets_the_learn_lease_expire_so_the_player_can_go_to_another_learner(tmp_path):
    """Before, the lease keeper renewed the lease of a learner stuck in a publish for as long as the share hung,
    so no other learner could take the player. After --publish-timeout the renewals stop."""
    with _learner_stuck_in_a_publish(tmp_path, 3.0, "--publish-timeout", "1") as (coordinator, proc):
        eventually(lambda: _status(coordinator.address).counters.jobs_expired == 1, timeout_s=60)
        assert player_status(coordinator.address).learner_worker_id == ""  # free for another learner
        assert proc.popen.poll() is None  # still stuck in its publish
        assert "a checkpoint publish or read has taken over 1 s" in proc.log_tail(60)


def test_a_stop_stuck_in_a_publish_hands_the_player_back_and_exits_1_after_the_stop_timeout(tmp_path):
    """Before, a learner stopped while its publish hung on the share waited for ever (or for a SIGKILL, after
    which the player stayed bound until its lease expired). With --publish-timeout off, only the stop's own
    backstop ends it."""
    flags = ("--publish-timeout", "none", "--stop-timeout", "2")
    with _learner_stuck_in_a_publish(tmp_path, 60.0, *flags) as (coordinator, proc):
        assert proc.terminate(timeout_s=30) == 1, proc.log_tail()
        log = proc.log_tail(80)
        assert "still at its stop 2.0 s after it (--stop-timeout)" in log
        assert "hung_open" in log  # where it is stuck
        status = _status(coordinator.address)
    player = next(p for p in status.players if p.player_id == PLAYER)
    assert player.learner_worker_id == ""  # handed back at once, not after the 60 s lease
    assert player.checkpoint_version == 0
    assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0


def test_a_checkpoint_read_that_hangs_at_binding_lets_the_learn_lease_expire_and_the_stop_ends(tmp_path):
    """Before, only publishes were watched: a learner whose first read of the player's checkpoints hung (the
    share hung before it bound) kept the lease renewed, and so the player, for as long as the share hung."""
    cfg = solo_config(batch_size=128, publish_every=1)
    (tmp_path / "hang-reads").touch()
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        command = [sys.executable, "-c", HUNG_SHARE, str(tmp_path), "--coordinator", coordinator.address,
                   "--shared-root", str(tmp_path), "--worker-id", "learner-r", "--device", "cpu",
                   "--publish-timeout", "1", "--stop-timeout", "2"]
        with server_process(command, tmp_path / "learner.log") as proc:
            eventually(lambda: (tmp_path / "hung").exists(), timeout_s=30)  # its first read hangs
            eventually(lambda: _status(coordinator.address).counters.jobs_expired == 1, timeout_s=60)
            assert player_status(coordinator.address).learner_worker_id == ""  # free for another learner
            assert "a checkpoint publish or read has taken over 1 s" in proc.log_tail(60)
            assert proc.terminate(timeout_s=30) == 1, proc.log_tail()
            assert "(--stop-timeout)" in proc.log_tail(80)


def test_a_second_learner_with_the_same_worker_id_takes_the_player_and_the_first_stops_naming_it(tmp_path):
    """Before, two processes given the same --worker-id (one .env copied to two hosts) both held the player's
    learn job: the coordinator took the second for a restart of the first, and both published the player."""
    cfg = solo_config(batch_size=128)
    with running_coordinator(cfg, tmp_path, lease_timeout_s=5.0) as coordinator:
        with _learner(coordinator.address, tmp_path, tmp_path / "learner-1.log", "learner-d") as first:
            eventually(lambda: player_status(coordinator.address).checkpoint_path)  # bound, v0 published
            with _learner(coordinator.address, tmp_path, tmp_path / "learner-2.log", "learner-d") as second:
                assert first.popen.wait(30) == 2, first.log_tail()
                assert "is used by another process now" in first.log_tail() and "--worker-id" in first.log_tail()
                eventually(lambda: "taking trajectories" in second.log_tail(100))
                learner = next(w for w in _status(coordinator.address).workers if w.worker_id == "learner-d")
                assert learner.data_endpoint == second.address  # the player's data goes to the second
                assert player_status(coordinator.address).learner_worker_id == "learner-d"
                assert second.terminate() == 0, second.log_tail()


def _frozen_coordinator_league(tmp_path, publish_every: int):
    """The solo league of the frozen-coordinator tests (batches of 128) and its coordinator's argv."""
    cfg = solo_config(batch_size=128, publish_every=publish_every)
    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(cfg)))
    return cfg, ["--config", str(config), "--shared-root", str(tmp_path), "--port", "0"]


def test_sigterm_while_the_coordinator_is_frozen_publishes_and_exits_0_within_seconds(tmp_path):
    """A frozen coordinator (or a partition that drops packets): the stopping learner publishes its final
    checkpoint, tries its report and its release once, briefly, and exits 0. Before, UpdatePlayer and FinishJob
    were retried for ~40 s each, past any stop grace period (and past --stop-timeout, which then exited 1)."""
    cfg, argv = _frozen_coordinator_league(tmp_path, publish_every=100)  # only the final checkpoint after v0
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with coordinator_process(argv, tmp_path / "coordinator.log") as coordinator:
            with _learner(coordinator.address, tmp_path, tmp_path / "learner.log", "learner-f") as proc:
                eventually(lambda: player_status(coordinator.address).checkpoint_path)  # bound, v0 published
                push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 2, policy_version=0))
                os.kill(coordinator.popen.pid, signal.SIGSTOP)
                try:
                    assert proc.terminate(timeout_s=15) == 0, proc.log_tail()
                finally:
                    os.kill(coordinator.popen.pid, signal.SIGCONT)
                assert "not reported (the player's next learner resumes from this checkpoint)" in proc.log_tail(60)
        latest = CheckpointStore(tmp_path).latest(PLAYER)
        assert latest.version == 2 and latest.metadata["agent_steps"] == 256  # the final checkpoint (2 iterations)
    finally:
        rollout.close()


def test_sigterm_during_a_report_the_frozen_coordinator_holds_cancels_it_and_exits_0_within_seconds(tmp_path):
    """The SIGTERM landed during the first attempt of a patient UpdatePlayer (publish_every 1: every iteration
    reports): the learner waited that 10 s attempt out before its final report, and its stop took ~17 s. The
    attempt is cancelled at the stop; the final checkpoint is still published and reported once, briefly."""
    cfg, argv = _frozen_coordinator_league(tmp_path, publish_every=1)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with coordinator_process(argv, tmp_path / "coordinator.log") as coordinator:
            with _learner(coordinator.address, tmp_path, tmp_path / "learner.log", "learner-r") as proc:
                eventually(lambda: player_status(coordinator.address).checkpoint_path)  # bound, v0 published
                os.kill(coordinator.popen.pid, signal.SIGSTOP)
                try:
                    push(proc.address, rollout.chunks(acting_task(cfg, tmp_path), 1, policy_version=0))
                    eventually(lambda: CheckpointStore(tmp_path).latest(PLAYER).version == 1)  # its report hangs
                    assert proc.terminate(timeout_s=15) == 0, proc.log_tail()
                finally:
                    os.kill(coordinator.popen.pid, signal.SIGCONT)
                log = proc.log_tail(60)
                assert "v1: cut short by the end of its session (CANCELLED)" in log
                assert "v1: coordinator unreachable (DEADLINE_EXCEEDED); not reported" in log  # the final report
        assert CheckpointStore(tmp_path).latest(PLAYER).version == 1
    finally:
        rollout.close()
