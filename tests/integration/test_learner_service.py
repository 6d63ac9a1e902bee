"""A real learner (in process) against a real coordinator, both on 127.0.0.1 port 0, with real torch and files.

Chunks are real CartPole rollouts (or connect-four shaped data) cut with TrajectoryBuilder + encode_chunk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.computation import DiscreteActionSpec, TensorSpec
from common.config import ConfigError, load_yaml
from common.envs import make_env
from common.envs.policy_view import policy_specs
from common.ports import restartable_port
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, make_channel
from league_service.config import Config, config_from_dict
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import league_stub, running_coordinator
from league_service.server import serve_coordinator
from learner_service import session as session_module
from learner_service.config import LearnerSettings
from learner_service.league_client import LeagueClient, Registration
from learner_service.learner import JobSetupError, Learner
from learner_service.learner_testing import Rollout, RunningLearner, running_learner, synthetic_chunk
from learner_service.servicer import RESERVED_SERVER_THREADS
from learner_service.session import DIVERGED_WINDOW, MIN_UNPUBLISHED_UPDATES, LeaseKeeper

REPO = Path(__file__).resolve().parents[2]
PLAYER = "solo_active_player_default_0"


def solo_config(**learner) -> Config:
    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    # No weight average unless a test asks: its final checkpoint is one version more than the updates.
    data["learner"] = {**data["learner"], "average_decay": 0.0, **learner}
    data["policy"]["ppo"]["update_epochs"] = 2  # fast tests; learning itself is the slow test's business
    return config_from_dict(data)


def acting_task(cfg: Config, shared_root: Path, player_id: str = PLAYER):
    """What an actor does: the same model from the policy section and the env's view, latest weights loaded."""
    env = make_env(cfg.env.name, **cfg.env.kwargs)
    obs, action = policy_specs(env.info())
    env.close()
    task = make_computation_task(cfg.policy, obs, action, device="cpu", seed=0)
    checkpoint = CheckpointStore(shared_root).load_latest(player_id)
    task.set_weights(checkpoint.tensors, checkpoint.ref.version)
    return task


def push(address: str, chunks, timeout_s: float = 30.0) -> league_pb2.PushSummary:
    channel = make_channel(address, max_message_bytes=64 * 2**20)
    try:
        return league_pb2_grpc.LearnerServiceStub(channel).PushTrajectories(iter(chunks), timeout=timeout_s)
    finally:
        channel.close()


def _status(address: str) -> league_pb2.LeagueStatus:
    channel, stub = league_stub(address)
    try:
        return stub.GetStatus(league_pb2.GetStatusRequest(), timeout=10)
    finally:
        channel.close()


def player_status(address: str, player_id: str = PLAYER) -> league_pb2.PlayerStatus:
    return next(p for p in _status(address).players if p.player_id == player_id)


def eventually(check, timeout_s: float = 30.0):
    """``check()`` until it returns a truthy value (the coordinator's snapshot thread works on its own); an
    UNAVAILABLE coordinator (a channel still backing off after an outage) counts as "not yet"."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            value = None
        if value or time.monotonic() > deadline:
            assert value, "condition not reached in time"
            return value
        time.sleep(0.05)


def test_binds_publishes_version_zero_and_trains_on_pushed_chunks(tmp_path):
    cfg = solo_config(batch_size=128, tensorboard_every_s=0.0)  # every iteration's scalars written
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
            v0 = learner.learner.wait_published(PLAYER, 0, 60)
            assert v0.version == 0 and v0.metadata["agent_steps"] == 0
            status = eventually(lambda: (s := player_status(coordinator.address)).checkpoint_path and s)
            assert status.learner_worker_id == "learner-a" and status.checkpoint_version == 0

            rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
            chunks = rollout.chunks(acting_task(cfg, tmp_path), 4, policy_version=0)
            rollout.close()
            summary = push(learner.address, chunks + chunks[:2])  # two resent chunks
            assert (summary.chunks_accepted, summary.chunks_duplicate, summary.samples_accepted) == (4, 2, 512)
            assert summary.learner_version >= 0

            ref = learner.learner.wait_published(PLAYER, 4, 60)
            assert ref.metadata["agent_steps"] == 512 and ref.metadata["train_iteration"] == 4
            status = eventually(lambda: (s := player_status(coordinator.address)).train_iteration >= 4 and s)
            assert status.agent_steps == 512 and status.checkpoint_version == ref.version
            scalars = learner.learner.session.telemetry.last
            assert scalars["staleness/max"] >= 1 and "train/value_loss" in scalars
        # Stopped, it released its player and said it was leaving: no longer listed as a worker.
        assert not [w.worker_id for w in _status(coordinator.address).workers]
    assert list((tmp_path / "tensorboard" / PLAYER).glob("events.out.tfevents.*"))


@contextlib.contextmanager
def _learner_with_four_chunks(tmp_path: Path) -> Iterator[tuple[RunningLearner, list]]:
    """A learner of batches of 128 that writes TensorBoard only at its first iteration (and its stop), and four
    chunks of one batch each for it."""
    cfg = solo_config(batch_size=128, tensorboard_every_s=1e6)
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
            chunks = rollout.chunks(acting_task(cfg, tmp_path), 4, policy_version=0)
            rollout.close()
            yield learner, chunks


def test_progress_lines_carry_the_figures_of_their_own_iteration(tmp_path, monkeypatch, caplog):
    """The learner's progress line says samples/s, staleness and return beside its iteration and agent steps: they
    are the figures written with that iteration. It was logged at any iteration with the last scalars written, up
    to tensorboard_every_s before: "iteration 56, 15082 agent steps, 1177 samples/s" where 1177 was the rate of
    the window that ended at iteration 24 (TensorBoard had 1919 for iteration 59)."""
    from learner_service.telemetry import Telemetry

    monkeypatch.setattr(session_module, "PROGRESS_LOG_EVERY_S", 0.0)
    windows = []  # what the lines between writes were given: the window since the last write
    window_scalars = Telemetry.window_scalars
    monkeypatch.setattr(Telemetry, "window_scalars", lambda self: windows.append(window_scalars(self)) or windows[-1])
    caplog.set_level(logging.INFO, logger="learner_service.session")
    with _learner_with_four_chunks(tmp_path) as (learner, chunks):
        push(learner.address, chunks)
        learner.learner.wait_published(PLAYER, 4, 60)
        written = learner.learner.session.telemetry.last  # the first iteration's: none written since
    assert written["learner/train_iteration"] == 1.0
    lines = [r.getMessage() for r in caplog.records if "samples/s" in r.getMessage()]
    assert ": iteration 1, version 1, 128 agent steps, " in lines[0]
    assert f"{written['throughput/samples_per_s']:.0f} samples/s" in lines[0]
    # The later lines (tensorboard_every_s is above the line's period) have the figures of the window since the
    # write, which ends at their own iteration, not the write's.
    assert [w["learner/train_iteration"] for w in windows] == [2.0, 3.0, 4.0]
    for line, window in zip(lines[1:], windows, strict=True):
        assert f": iteration {window['learner/train_iteration']:.0f}, " in line
        assert f"{window['throughput/samples_per_s']:.0f} samples/s" in line


def test_bad_and_foreign_chunks_are_refused_and_the_server_keeps_serving(tmp_path):
    cfg = solo_config(batch_size=1024)
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            good = synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=0)
            bad = synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=1)
            del bad.tensors["/agents/agent/artifacts/logp"]
            with pytest.raises(grpc.RpcError) as err:
                push(learner.address, [good, bad])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "/agents/agent/artifacts/logp" in err.value.details()

            foreign = synthetic_chunk(_cartpole_specs(), 2, player_id="someone_else", seq=0)
            with pytest.raises(grpc.RpcError) as err:
                push(learner.address, [foreign])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            # Still serving: health SERVING, the good chunk was kept (a resend is a duplicate), new data taken.
            channel = make_channel(learner.address)
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            channel.close()
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            bad_fixed = synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=1)
            summary = push(learner.address, [good, bad_fixed])
            assert (summary.chunks_accepted, summary.chunks_duplicate) == (1, 1)


def test_streams_beyond_the_limit_are_refused_and_health_and_other_pushes_still_answer(tmp_path):
    # Streams that send nothing (or wait on a full queue) each hold a server thread; past the pool's 128 threads,
    # health checks and every push hung. Now the streams past the limit are refused at once.
    limit = ServerOptions().max_workers - RESERVED_SERVER_THREADS
    cfg = solo_config(batch_size=1024)
    release = threading.Event()

    def idle():
        release.wait(60)
        return
        yield  # a generator: the stream opens and sends nothing until released

    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            channels = [make_channel(learner.address) for _ in range(2)]
            try:
                stubs = [league_pb2_grpc.LearnerServiceStub(c) for c in channels]
                held = [stubs[i % 2].PushTrajectories.future(idle(), timeout=90) for i in range(limit)]
                eventually(lambda: learner.learner.servicer.streams_in_use == limit)
                with pytest.raises(grpc.RpcError) as err:
                    push(learner.address, [synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=0)])
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"{limit} trajectory streams" in err.value.details()
                health = health_pb2_grpc.HealthStub(channels[0]).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                release.set()
                for future in held:
                    assert future.result(timeout=60).chunks_accepted == 0
                summary = push(learner.address, [synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=0)])
                assert summary.chunks_accepted == 1
            finally:
                release.set()
                for channel in channels:
                    channel.close()


def test_a_stream_whose_client_goes_quiet_is_cancelled_and_frees_its_slot(tmp_path):
    # A client that opened a stream, sent a chunk and then nothing (a frozen actor, a stray tool, no deadline)
    # held its stream slot for ever; enough of them refused every actor. Now a quiet stream is cancelled.
    cfg = solo_config(batch_size=1024)
    release = threading.Event()

    def one_then_quiet():
        yield synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=0)
        release.wait(60)

    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path, stream_idle_timeout_s=0.5) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            channel = make_channel(learner.address)
            try:
                stub = league_pb2_grpc.LearnerServiceStub(channel)
                quiet = stub.PushTrajectories.future(one_then_quiet())  # no deadline
                with pytest.raises(grpc.RpcError) as err:
                    quiet.result(timeout=30)
                assert err.value.code() == grpc.StatusCode.CANCELLED
                # The client hears the cancel at once; the handler frees its slot once its own wait for the next
                # chunk ends. Asserted at once, it was still held under CPU load (2 cores, load average ~30).
                eventually(lambda: learner.learner.servicer.streams_in_use == 0)
                assert learner.learner.servicer.idle_streams.streams_ended == 1
                # The chunk it did send was accepted: sent again, it is a duplicate, not lost or counted twice.
                again = push(learner.address, [synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=0)])
                assert (again.chunks_accepted, again.chunks_duplicate) == (0, 1)
            finally:
                release.set()
                channel.close()


def test_an_action_mask_the_env_does_not_have_is_refused_and_training_goes_on(tmp_path):
    """CartPole declares no action mask, so the model takes one only optionally; a chunk that carries one anyway
    (a misbehaving actor) is refused, naming the key. Taken, it would have been batched with chunks without one
    and failed the trainer, and with it the learner process."""
    cfg = solo_config(batch_size=32)
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            with_mask = {**_cartpole_specs(), "action_mask": TensorSpec("action_mask", (2,), "bool")}
            masked = synthetic_chunk(with_mask, 2, player_id=PLAYER, seq=0)
            with pytest.raises(grpc.RpcError) as err:
                push(learner.address, [masked])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "/observations/action_mask" in err.value.details()
            summary = push(learner.address, [synthetic_chunk(_cartpole_specs(), 2, player_id=PLAYER, seq=s)
                                             for s in (1, 2)])
            assert summary.chunks_accepted == 2
            assert learner.learner.wait_published(PLAYER, 1, 60).version == 1
            assert not learner.failure


def _cartpole_specs():
    env = make_env("CartPole-v1")
    try:
        return policy_specs(env.info())[0]
    finally:
        env.close()


def test_restart_resumes_where_it_left_off(tmp_path):
    cfg = solo_config(batch_size=128, publish_every=2)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), 5, policy_version=0))
                learner.learner.wait_published(PLAYER, 4, 60)
            # Stopped: a final checkpoint (the 5th iteration was not published yet), its job released.
            first = CheckpointStore(tmp_path).latest(PLAYER)
            assert first.version == 5 and first.metadata["agent_steps"] == 640
            status = player_status(coordinator.address)
            assert status.learner_worker_id == "" and status.checkpoint_version == 5 and status.agent_steps == 640

            with running_learner(coordinator.address, tmp_path, worker_id="learner-b") as learner:
                resumed = learner.learner.wait_published(PLAYER, 5, 60)
                assert resumed == first  # resumed from it, not republished, nothing went back
                session = eventually(lambda: learner.learner.session)
                assert session.trainer.progress.agent_steps == 640 and session.trainer.version == 5
                # Adam resumed with the moments and step counts the first learner published, not from scratch.
                saved = CheckpointStore(tmp_path).load_training_state(first.path)["optimizer"]
                adam = session.trainer.task.algorithm.optimizer.state_dict()
                assert saved["state"] and min(int(s["step"]) for s in adam["state"].values()) > 0
                torch.testing.assert_close(adam["state"], saved["state"], rtol=0, atol=0)
                # ... and its weights are the checkpoint's: a learner that started from a fresh network under the
                # same version and counters passed every resume test (a review).
                weights, published = session.trainer.task.get_weights(), CheckpointStore(tmp_path).load(first.path)
                assert weights.keys() == published.tensors.keys()
                for name, value in weights.items():
                    np.testing.assert_array_equal(value, published.tensors[name], err_msg=name)
                push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), 2, policy_version=5))
                learner.learner.wait_published(PLAYER, 6, 60)
            later = CheckpointStore(tmp_path).latest(PLAYER)
            assert later.version == 7 and later.metadata["agent_steps"] == 896
            assert later.metadata["train_iteration"] == 7 and later.metadata["worker_id"] == "learner-b"
            assert later.metadata["model.activation"] in ("tanh", "relu")  # what actors build its snapshots with
            status = player_status(coordinator.address)
            assert status.agent_steps == 896 and status.checkpoint_version == 7
    finally:
        rollout.close()


def test_a_player_resumed_with_another_obs_scale_carries_its_observation_statistics_over(tmp_path):
    """obs_norm's statistics are of observations after obs_scale, which a league may change between runs: the
    resumed learner standardised against the old units (most entries pinned at the clip) and trained on that
    (a review). It now carries them over, so its first version computes what the last one did."""
    def cfg(scale):
        config = solo_config(batch_size=128)
        model = {**config.policy["model"], "obs_norm": True, "obs_scale": scale}
        return dataclasses.replace(config, policy={**config.policy, "model": model})

    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg(1.0), tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                push(learner.address, rollout.chunks(acting_task(cfg(1.0), tmp_path), 2, policy_version=0))
                learner.learner.wait_published(PLAYER, 2, 60)
        trained = CheckpointStore(tmp_path).load_latest(PLAYER)
        (mean_name,) = [n for n in trained.tensors if n.endswith("obs_norm.mean")][:1]
        assert trained.tensors[mean_name.replace("mean", "count")] > 0
        with running_coordinator(cfg(0.5), tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-b") as learner:
                session = eventually(lambda: learner.learner.session)
                resumed = session.trainer.task.get_weights()
        np.testing.assert_allclose(resumed[mean_name], trained.tensors[mean_name] * 0.5)
        var_name = mean_name.replace("mean", "var")
        np.testing.assert_allclose(resumed[var_name], trained.tensors[var_name] * 0.25)
    finally:
        rollout.close()


def test_a_stopping_learner_trains_on_what_is_held_short_of_a_batch(tmp_path):
    """The actors were told the chunks arrived and will not send them again: a stop trains the rest as a last,
    smaller batch before the final checkpoint (it was dropped, with no log line)."""
    cfg = solo_config(batch_size=256)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                summary = push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), 3, policy_version=0))
                assert summary.samples_accepted == 384
                learner.learner.wait_published(PLAYER, 1, 60)  # one full batch; 128 samples held
            final = CheckpointStore(tmp_path).latest(PLAYER)
            assert final.version == 2 and final.metadata["train_iteration"] == 2
            assert final.metadata["agent_steps"] == 384
            assert player_status(coordinator.address).checkpoint_version == 2
    finally:
        rollout.close()


MUTATING_PLAYER = "league_exploiter_default_0"


def _mutating_league(**league) -> tuple[Config, dict[str, TensorSpec], DiscreteActionSpec]:
    """A connect-four league of one league exploiter that mutates at every snapshot (every 80 agent steps),
    with a small model; `league` adds to its league section. Also the env's observation and action specs."""
    cfg = config_from_dict({
        "league": {
            "active_players": {"league_exploiter": 1},
            "league_exploiter": {"one_phase_step": 80, "strong_win_rate": None, "mutate_prob": 1.0},
            **league,
        },
        "policy": {"model": {"hidden": [16], "conv": [[4, 3, 1]]}},
        "learner": {"batch_size": 32},
    })
    env = make_env("connect_four")
    obs, action = policy_specs(env.info())
    env.close()
    return cfg, obs, action


def test_a_mutated_player_is_reset_and_keeps_counting_up(tmp_path, caplog):
    """A league exploiter that mutates at every snapshot (every 80 agent steps) back to a fresh start. Chunks
    acted before the reset (still queued, or from actors that have not reloaded) are dropped: before, the reset
    weights trained on the thrown-away policy's games, and counted them in the player's agent steps."""
    caplog.set_level(logging.INFO, logger="learner_service.session")
    cfg, obs, action = _mutating_league()
    player = MUTATING_PLAYER
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            fresh = CheckpointStore(tmp_path).load(learner.learner.wait_published(player, 0, 60).path)
            chunks = [synthetic_chunk(obs, action.num_actions, player_id=player, batch=2, steps=16, seq=s, seed=s)
                      for s in range(6)]
            push(learner.address, chunks[:3])  # 96 agent steps: over one phase, a snapshot and a mutation
            learner.learner.wait_published(player, 3, 60)
            eventually(lambda: player_status(coordinator.address, player).mutations == 1)
            push(learner.address, chunks[3:4])  # the next report is answered "mutated"
            store = CheckpointStore(tmp_path)

            def reset_published():
                latest = store.load_latest(player)
                same = all(np.array_equal(v, fresh.tensors[k]) for k, v in latest.tensors.items())
                return same and latest.ref.version > 3 and latest

            reset = eventually(reset_published)  # the seeded fresh weights, at a new version
            status = eventually(lambda: (s := player_status(coordinator.address, player)).checkpoint_version
                                == reset.ref.version and s)
            assert status.agent_steps == 128 and status.checkpoint_path == reset.ref.path
            stale = synthetic_chunk(obs, action.num_actions, player_id=player, batch=2, steps=16, seq=6, seed=6,
                                    policy_version=reset.ref.version - 1)  # the thrown-away weights' last version
            after = [synthetic_chunk(obs, action.num_actions, player_id=player, batch=2, steps=16, seq=s, seed=s,
                                     policy_version=reset.ref.version) for s in (7, 8)]
            push(learner.address, [stale, *after])  # training goes on from the reset weights, versions keep rising
            eventually(lambda: player_status(coordinator.address, player).agent_steps >= 192)
            assert learner.learner.wait_published(player, reset.ref.version + 2, 60).metadata["agent_steps"] == 192
            assert player_status(coordinator.address, player).agent_steps == 192  # the stale chunk not among them
    dropped = [r.getMessage() for r in caplog.records if "acted before" in r.getMessage()]
    assert dropped[0] == f"{player}: dropping chunks acted before the reset (policy version below " \
                         f"{reset.ref.version}): the reset player trains on its own games"
    assert dropped[-1] == f"{player}: 1 chunk(s) acted before version {reset.ref.version} (the reset's) were dropped"


def _free_port() -> int:
    """A port for a server the test restarts on it: outside the range outgoing connections are given."""
    return restartable_port()


@contextlib.contextmanager
def _coordinator_on(port: int, cfg: Config, shared_root: Path, state: Path, lease_timeout_s: float = 3.0):
    coordinator = Coordinator(cfg, CoordinatorSettings(shared_root=shared_root, state_path=state,
                                                       lease_timeout_s=lease_timeout_s))
    server = serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=port))
    try:
        yield server
    finally:
        server.stop(grace_s=0.5)


def test_waits_for_an_absent_coordinator_and_rebinds_after_it_lost_its_state(tmp_path, caplog):
    """The learner starts first (registers with backoff); later its coordinator is replaced by one that never
    heard of it (another state file): heartbeats say so, the learner registers again, gets the player back and
    goes on with the trainer it kept (the store has nothing newer), steps and versions never going back. The
    samples it held short of a batch when the lease went are said to be kept, and trained after the rebind."""
    cfg = solo_config(batch_size=128)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    short = Rollout(player_id=PLAYER, env_num=4, unroll_len=16, job_id="job-short")
    caplog.set_level(logging.INFO, logger="learner_service.learner")
    try:
        with running_learner(address, tmp_path, worker_id="learner-w") as learner:
            with _coordinator_on(port, cfg, tmp_path, tmp_path / "a.sqlite"):
                learner.learner.wait_published(PLAYER, 0, 60)
                push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), 2, policy_version=0))
                learner.learner.wait_published(PLAYER, 2, 60)
                push(learner.address, short.chunks(acting_task(cfg, tmp_path), 1, policy_version=2))  # 64 held
                eventually(lambda: learner.learner.session.trainer.untrained_samples == 64)
                first = learner.learner.session
            with _coordinator_on(port, cfg, tmp_path, tmp_path / "b.sqlite") as fresh:
                status = eventually(lambda: (s := player_status(fresh.address)).learner_worker_id and s)
                status = eventually(lambda: (s := player_status(fresh.address)).checkpoint_version == 2 and s)
                assert status.agent_steps == 256 + 64 and status.train_iteration == 2  # steps count what arrived
                session = learner.learner.session
                assert session is not first and session.trainer is first.trainer  # kept, not reloaded
                assert "64 received samples not trained on stay with this learner's trainer" in caplog.text
                push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), 1, policy_version=2))
                assert learner.learner.wait_published(PLAYER, 3, 60).metadata["agent_steps"] == 384 + 64
    finally:
        rollout.close()
        short.close()


def test_cut_off_from_its_coordinator_it_publishes_nothing_once_the_lease_may_have_expired(tmp_path):
    """The coordinator goes away while an actor still reaches the learner and the shared filesystem is there.
    After a lease without a confirmed heartbeat the coordinator may have given the player to another learner,
    so from then on this one publishes nothing (two writers of one player's checkpoints would each number
    versions on from what they saw). It keeps its session and trains on what arrives: a coordinator that
    restarts on its state restores the lease with a fresh deadline, and the first confirmed heartbeat resumes
    publishing, with nothing lost. (One that let the lease go revokes it, and only then does the session end:
    test_waits_for_an_absent_coordinator_and_rebinds_after_it_lost_its_state.)"""
    cfg = solo_config(batch_size=128)
    lease_s = 2.0
    port = _free_port()
    address = f"127.0.0.1:{port}"
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    store = CheckpointStore(tmp_path)
    try:
        with running_learner(address, tmp_path, worker_id="learner-w") as learner:
            with _coordinator_on(port, cfg, tmp_path, tmp_path / "a.sqlite", lease_timeout_s=lease_s):
                learner.learner.wait_published(PLAYER, 0, 60)
                task = acting_task(cfg, tmp_path)
                session = learner.learner.session
                assert session is not None
            gone = time.monotonic()
            at_expiry = None
            held = 0
            while time.monotonic() < gone + 2 * lease_s:  # an actor keeps pushing all along ...
                try:
                    push(learner.address, rollout.chunks(task, 1, policy_version=0), timeout_s=0.5)
                except grpc.RpcError as err:  # ... until training waits, and the queue holds it back
                    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED, err
                    held += 1
                if at_expiry is None and time.monotonic() >= gone + lease_s:
                    at_expiry = store.latest(PLAYER).version
            held_back = store.latest(PLAYER).version
            assert held_back == at_expiry, "published after the coordinator may have let the lease expire"
            assert session.trainer.version > held_back  # trained on it, published none of it ...
            # ... and no further ahead of the actors' version than a failing publisher lets it (it trained on
            # without bound, on ever older data: a review).
            assert session.trainer.version - held_back <= max(MIN_UNPUBLISHED_UPDATES, 2 * session._publish_every)
            assert held > 0
            assert learner.learner.session is session and not session.lease.held
            with _coordinator_on(port, cfg, tmp_path, tmp_path / "a.sqlite", lease_timeout_s=lease_s):
                eventually(lambda: session.lease.held, timeout_s=30)
                push(learner.address, rollout.chunks(task, 1, policy_version=held_back))
                assert learner.learner.wait_published(PLAYER, session.trainer.version, 60).version > held_back
                assert learner.learner.session is session
            assert not learner.failure and learner.thread.is_alive()
    finally:
        rollout.close()


@contextlib.contextmanager
def _fed_learner(cfg: Config, tmp_path: Path, chunks: int, env_num: int) -> Iterator[RunningLearner]:
    """A coordinator and a learner bound to PLAYER (version 0 published), pushed `chunks` chunks of real
    CartPole rollouts acted with version 0; both stop at the end of the block."""
    rollout = Rollout(player_id=PLAYER, env_num=env_num, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path) as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                push(learner.address, rollout.chunks(acting_task(cfg, tmp_path), chunks, policy_version=0))
                yield learner
    finally:
        rollout.close()


def _dqn_config(**dqn) -> Config:
    """A solo CartPole league trained by DQN, small enough to train at once; `dqn` overrides its section."""
    return config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
        "env": {"name": "CartPole-v1", "env_num": 4, "episode_num": 0, "env_steps": 1000},
        "policy": {"algorithm": "dqn", "model": {"hidden": [32]},
                   "dqn": {"learning_starts": 64, "batch_size": 32, "replay_capacity": 1000, **dqn}},
        "learner": {"replay_ratio": 1.0, "publish_every": 2},
    })


def test_a_dqn_player_trains_from_its_replay(tmp_path):
    with _fed_learner(_dqn_config(), tmp_path, chunks=4, env_num=4) as learner:
        ref = learner.learner.wait_published(PLAYER, 2, 60)
        assert ref.metadata["algorithm"] == "dqn"
        assert "train/td_abs_mean" in learner.learner.session.telemetry.last


def test_a_job_it_cannot_train_fails_with_the_field_named(tmp_path):
    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    data["learner"]["bach_size"] = 64  # a typo: the league config refuses it at load ...
    with pytest.raises(ConfigError, match=r"learner: unknown field\(s\) \['bach_size'\]"):
        config_from_dict(data)
    # ... and a learner handed such a section anyway (a coordinator of another version, say) refuses it too.
    del data["learner"]["bach_size"]
    cfg = dataclasses.replace(config_from_dict(data), learner={**data["learner"], "bach_size": 64})
    _assert_the_job_fails_at_setup(cfg, tmp_path, r"learner: unknown field\(s\) \['bach_size'\]")


def _assert_the_job_fails_at_setup(cfg, tmp_path, match: str, **settings) -> None:
    """A learner refuses the league's learn job with JobSetupError matching `match` and hands it back."""
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        learner = Learner(LearnerSettings(coordinator=coordinator.address, shared_root=tmp_path, worker_id="l",
                                          device="cpu", get_job_wait_s=1.0, **settings))
        learner.start()
        try:
            with pytest.raises(JobSetupError, match=match):
                learner.run()
        finally:
            learner.close()
        channel, stub = league_stub(coordinator.address)
        counters = stub.GetStatus(league_pb2.GetStatusRequest()).counters
        channel.close()
        assert counters.jobs_failed == 1  # handed back at once, not left to expire


def test_a_model_the_observations_do_not_fit_fails_the_job_with_the_key_named(tmp_path):
    """A conv stack too big for the board (the Nature stack's 8x8 kernels on connect four's 6x7) passes the
    config check (which does not know the env's shapes); the learner hands the job back, naming the key."""
    cfg = config_from_dict({"policy": {"algorithm": "ppo", "model": {"conv": []}}})
    _assert_the_job_fails_at_setup(cfg, tmp_path, r"model.conv: the conv stack .*does not fit observations")


def test_an_env_whose_constructor_hangs_fails_the_job_after_the_build_timeout(tmp_path):
    """The learner builds the env to read its spaces: a constructor that hangs left it silent for good, holding
    its player (a review), while the actors gave up on it after their reset timeout."""
    from tests.env_doubles import HANGS_RELEASED

    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    data["env"] = {**data["env"], "name": "python:tests.env_doubles:hanging_constructor"}
    try:
        _assert_the_job_fails_at_setup(config_from_dict(data), tmp_path, r"building env 'python:tests.env_doubles:"
                                       r"hanging_constructor' to read its spaces took over 1 s",
                                       env_build_timeout_s=1.0)
    finally:
        HANGS_RELEASED.set()  # the build thread returns (and its env is closed)
        time.sleep(0.1)
        HANGS_RELEASED.clear()


def test_an_env_whose_close_hangs_does_not_hold_the_setup():
    """The spaces are read once `info()` answers: waiting for the close too cost a hanging close the whole build
    timeout (a review)."""
    from learner_service.learner import _env_info
    from tests.env_doubles import HANGS_RELEASED

    job = dataclasses.make_dataclass("Job", ["job_id", "player_id", "env_name", "env_kwargs"])(
        "j", "p", "python:tests.env_doubles:HangingCloseEnv", {})
    try:
        start = time.monotonic()
        assert _env_info(job, 30.0).name == "counting"
        assert time.monotonic() - start < 10
    finally:
        HANGS_RELEASED.set()
        time.sleep(0.1)
        HANGS_RELEASED.clear()


def test_diverged_updates_are_rolled_back_and_never_published(tmp_path):
    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    data["policy"]["ppo"].update(learning_rate=1e20, target_kl=None)  # every update turns the weights into NaN
    data["learner"]["batch_size"] = 128
    with _fed_learner(config_from_dict(data), tmp_path, chunks=4, env_num=8) as learner:
        session = learner.learner.session
        eventually(lambda: session.rollbacks == 4)  # one per batch of 128: all of them
        assert session.trainer.weights_finite() and session.trainer.progress.agent_steps == 512
    _assert_every_version_finite(CheckpointStore(tmp_path))


def test_a_roll_back_keeps_the_dqn_replay(tmp_path):
    """A roll-back rebuilt the whole trainer, so a DQN player lost its replay (the actors' transitions, as good
    as before) with each diverged update, and waited for `learning_starts` new ones before learning again."""
    cfg = _dqn_config(learning_rate=1e20, loss="mse")  # squared TD errors overflow: NaN weights
    with _fed_learner(cfg, tmp_path, chunks=8, env_num=4) as learner:
        session = learner.learner.session
        # Every transition pushed is in the replay once the last has come in, roll-backs or not.
        eventually(lambda: session.rollbacks >= 2 and session.trainer.buffered_samples == 8 * 4 * 16)
    _assert_every_version_finite(CheckpointStore(tmp_path))


def test_updates_that_always_diverge_fail_the_job_as_a_setup_error(tmp_path):
    """Rolled back for ever, a learner trained nothing while its player's status just stood still. Once half of
    its last DIVERGED_WINDOW updates were rolled back it hands the job back as failed, naming the learning rate
    (as a setup error: `league learner` exits 2, and `league run` says the league cannot run as configured)."""
    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    data["policy"]["ppo"].update(learning_rate=1e20, target_kl=None)  # every update turns the weights into NaN
    data["learner"]["batch_size"] = 128
    cfg = config_from_dict(data)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            learner = Learner(LearnerSettings(coordinator=coordinator.address, shared_root=tmp_path,
                                              worker_id="l", device="cpu", get_job_wait_s=1.0))
            address = learner.start()
            failed: list[BaseException] = []

            def run() -> None:
                try:
                    learner.run()
                except BaseException as err:  # noqa: BLE001 (handed to the test)
                    failed.append(err)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                learner.wait_published(PLAYER, 0, 60)
                task = acting_task(cfg, tmp_path)
                for _ in range(2 * DIVERGED_WINDOW // 8):  # one batch per chunk, 8 chunks a push
                    try:
                        push(address, rollout.chunks(task, 8, policy_version=0))
                    except grpc.RpcError as err:  # the learner gave up meanwhile and takes no more data
                        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
                        break
                thread.join(60)
                assert not thread.is_alive()
            finally:
                learner.request_stop()
                learner.close()
            assert len(failed) == 1 and isinstance(failed[0], JobSetupError), failed
            assert "policy.ppo.learning_rate" in str(failed[0])
            channel, stub = league_stub(coordinator.address)
            with channel:
                counters = stub.GetStatus(league_pb2.GetStatusRequest()).counters
            assert counters.jobs_failed == 1
        _assert_every_version_finite(CheckpointStore(tmp_path))
    finally:
        rollout.close()


def _assert_every_version_finite(store: CheckpointStore) -> None:
    for ref in store.versions(PLAYER):
        assert all(np.isfinite(v).all() for v in store.load(ref.path).tensors.values()), ref.path


def test_a_diverging_dqn_player_keeps_its_replay_priorities_and_the_learner_goes_on(tmp_path):
    """Prioritized replay takes each batch's TD errors as its new priorities; a diverging network makes them
    infinite, which the replay refuses. The learner keeps those batches' old priorities and goes on (it used to
    fail the job and exit); what it publishes stays finite."""
    cfg = _dqn_config(learning_rate=1e20, prioritized=True)
    with _fed_learner(cfg, tmp_path, chunks=8, env_num=4) as learner:
        session = learner.learner.session
        eventually(lambda: session.trainer.nonfinite_td_batches >= 2)
        learner.learner.wait_published(PLAYER, 4, 60)
        assert not learner.failure and learner.thread.is_alive()
    _assert_every_version_finite(CheckpointStore(tmp_path))


def test_a_non_loopback_host_needs_a_token_or_insecure(tmp_path):
    """Like the coordinator: no unauthenticated trajectory server on a routable address unless asked for."""
    base = LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="learner-x", host="0.0.0.0")
    with pytest.raises(ValueError, match="--insecure"):
        Learner(base).start()
    learner = Learner(dataclasses.replace(base, insecure=True))
    try:
        address = learner.start()
        assert address.rsplit(":", 1)[1].isdigit()
    finally:
        learner.close()


def test_an_active_player_starts_from_its_categorys_pretrained_checkpoint(tmp_path):
    """AlphaStar starts every agent from the supervised one: with `pretrain_checkpoint_path`, the learner's
    first version is the pretrained weights (it was a fresh initialisation, while mutations reset to them)."""
    base = solo_config()
    env = make_env(base.env.name)
    obs, action = policy_specs(env.info())
    env.close()
    pretrained = make_computation_task(base.policy, obs, action, device="cpu", seed=123).get_weights()
    ref = CheckpointStore(tmp_path).publish("sl", pretrained, 3)  # published elsewhere, with its own version
    cfg = dataclasses.replace(base, league=dataclasses.replace(base.league, pretrain_checkpoint_path={"default": ref.path}))
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        channel, stub = league_stub(coordinator.address)
        with channel:
            (player,) = [p for p in stub.GetStatus(league_pb2.GetStatusRequest()).players if p.active]
        assert (player.checkpoint_path, player.checkpoint_version) == (ref.path, 0)
        with running_learner(coordinator.address, tmp_path) as learner:
            first = learner.learner.wait_published(PLAYER, 0, 60)
    start = CheckpointStore(tmp_path).load(first.path).tensors
    assert set(start) == set(pretrained)
    for name, array in pretrained.items():
        np.testing.assert_array_equal(start[name], array)


def test_a_learn_job_is_heartbeaten_by_its_own_lease_not_only_by_registration(tmp_path):
    """A learner keeps the registration of the coordinator it first met. One restarted with a shorter lease
    grants learn jobs that an interval from that registration (here 5 s against a lease of 1.5 s) cannot keep:
    the learner stopped publishing between two heartbeats, and the coordinator let the lease go. As for the
    actors' jobs, the heartbeat now goes out at least three times per the job's own lease."""
    with running_coordinator(solo_config(), tmp_path, lease_timeout_s=1.5) as coordinator:
        client = LeagueClient(coordinator.address, "learner-slow")
        try:
            client.register("127.0.0.1:1")
            job = client.next_learn_job("127.0.0.1:1", wait_s=10)
            assert job.lease_timeout_s == 1.5
            lease = LeaseKeeper(client, job, Registration(heartbeat_interval_s=5.0, lease_timeout_s=30.0)).start()
            try:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    assert lease.held, "the lease lapsed between two heartbeats"
                    time.sleep(0.02)
            finally:
                lease.close()
            assert player_status(coordinator.address).learner_worker_id == "learner-slow"
        finally:
            client.close()


def test_a_reset_to_a_pretrained_checkpoint_that_was_lost_does_not_fail_the_learner(tmp_path, caplog):
    """The league resets a player to its pretrained checkpoint, which someone deleted after the coordinator
    started (it checks it then). The learner failed on the missing file, was restarted, got the same reset
    repeated and failed again. Now it says which checkpoint is missing and trains on; the league repeats the
    reset until a learner applies it, which it does once the file is back."""
    cfg, obs, action = _mutating_league(pretrain_checkpoint_path={"default": "pretrained/v0000000001.pt"})
    player = MUTATING_PLAYER
    pretrained = make_computation_task(cfg.policy, obs, action, "cpu", seed=7).get_weights()
    store = CheckpointStore(tmp_path)
    store.publish("pretrained", pretrained, 1)
    chunks = [synthetic_chunk(obs, action.num_actions, player_id=player, batch=2, steps=16, seq=s, seed=s)
              for s in range(8)]
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
        with running_learner(coordinator.address, tmp_path) as learner:
            learner.learner.wait_published(player, 0, 60)
            hidden = tmp_path / "pretrained.away"
            (tmp_path / "pretrained").rename(hidden)  # lost while the league runs
            push(learner.address, chunks[:3])  # over one phase: a snapshot and a mutation
            eventually(lambda: player_status(coordinator.address, player).mutations >= 1)
            version = learner.learner.wait_published(player, 3, 60).version
            push(learner.address, chunks[3:6])  # its reports are answered "mutated" and the reset cannot load
            eventually(lambda: learner.failure or store.latest(player).version >= version + 2)  # it trains on
            assert not learner.failure and learner.thread.is_alive()
            assert caplog.text.count("which cannot be loaded") == 1  # said once, not at every report
            # Not applied, so not acknowledged: the league still names the reset and takes none of the checkpoints
            # trained from the weights it threw away (they were acknowledged on sight, and taken: a review).
            assert player_status(coordinator.address, player).checkpoint_path == "pretrained/v0000000001.pt"
            hidden.rename(tmp_path / "pretrained")  # back: the next report applies the reset

            def reset_published():
                latest = store.load_latest(player)
                return all(np.array_equal(v, pretrained[k]) for k, v in latest.tensors.items()) and latest

            push(learner.address, chunks[6:7])
            reset = eventually(reset_published)

            def reset_taken():  # (the league may have reset it again meanwhile: snapshots go on with its steps)
                status = player_status(coordinator.address, player)
                return status.checkpoint_path.startswith(f"{player}/") and status.checkpoint_version >= reset.ref.version

            eventually(reset_taken)


def test_a_stopping_learner_tells_the_streams_it_refuses_that_it_is_stopping(tmp_path):
    """Reproduced across hosts: an actor streaming to a learner during the learner's SIGTERM was refused with "the
    learner is not bound to a player yet; retry" (in both logs) while the learner was bound and winding down."""
    cfg = solo_config()
    rollout = Rollout(player_id=PLAYER, env_num=4, unroll_len=16)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path) as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                chunks = rollout.chunks(acting_task(cfg, tmp_path), 1, policy_version=0)
                learner.learner.request_stop()  # what SIGTERM does; the server still answers until close()
                with pytest.raises(grpc.RpcError) as refused:
                    push(learner.address, chunks)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                assert "the learner is stopping" in refused.value.details()
                assert "not bound" not in refused.value.details()
    finally:
        rollout.close()


def test_progress_lines_keep_coming_when_tensorboard_writes_are_rare(tmp_path, monkeypatch, caplog):
    """With learner.tensorboard_every_s above the progress line's period (a DQN league cutting its events to one
    write a minute, say), the line came only at a write: none for the whole period. A line still comes every
    PROGRESS_LOG_EVERY_S, with the figures of the window since the last write (which ends at its iteration)."""
    monkeypatch.setattr(session_module, "PROGRESS_LOG_EVERY_S", 0.2)
    caplog.set_level(logging.INFO, logger="learner_service.session")
    with _learner_with_four_chunks(tmp_path) as (learner, chunks):
        for version, chunk in enumerate(chunks, start=1):
            time.sleep(0.3)  # more than PROGRESS_LOG_EVERY_S between iterations
            push(learner.address, [chunk])
            learner.learner.wait_published(PLAYER, version, 60)
        assert learner.learner.session.telemetry.writes == 1  # the first iteration's only
    lines = [r.getMessage() for r in caplog.records if "samples/s" in r.getMessage()]
    assert any(": iteration 4, version 4, 512 agent steps, " in line for line in lines), lines


def test_a_stopping_learner_refuses_a_stream_under_way_whose_chunks_the_next_learner_does_not_train_twice(tmp_path):
    """A stream under way when the learner stops was answered with the chunks it took: lost when the stop could
    not train them in time or publish them (a full disk, a lease gone; a review). It is refused as a whole; the
    actor sends it again, and the next learner counts what the final checkpoint was trained on as duplicates (its
    ledger of trained chunks), so nothing is trained twice (before the ledger, 6,352 agent steps were trained for
    a job of 6,000) and the rest is trained."""
    cfg = solo_config(batch_size=128)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)  # 128 samples a chunk
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                chunks = rollout.chunks(acting_task(cfg, tmp_path), 3, policy_version=0)
                refused = _streamed_across_the_stop(learner, chunks[:2], chunks[2:])
            assert isinstance(refused, grpc.RpcError) and refused.code() is grpc.StatusCode.UNAVAILABLE, refused
            assert CheckpointStore(tmp_path).latest(PLAYER).metadata["agent_steps"] == 256  # its stop trained two

            with running_learner(coordinator.address, tmp_path, worker_id="learner-b") as learner:
                eventually(lambda: learner.learner.session)
                resent = push(learner.address, chunks)
                assert (resent.chunks_duplicate, resent.chunks_accepted) == (2, 1)
                learner.learner.wait_published(PLAYER, learner.learner.session.trainer.version + 1, 60)
            assert CheckpointStore(tmp_path).latest(PLAYER).metadata["agent_steps"] == 384
    finally:
        rollout.close()


def test_a_stream_its_client_ends_after_the_stop_is_refused_with_the_chunks_it_took(tmp_path):
    """The stop came while the stream waited for its client's next chunk, and the client then ended the stream:
    it was answered OK with the chunks it took, which the actor counted as delivered, though the stop might not
    train or publish them (a review). Refused as a whole, as a stream that sends a chunk after the stop is."""
    cfg = solo_config(batch_size=100_000)  # nothing trained before the stop
    rollout = Rollout(player_id=PLAYER, env_num=4, unroll_len=8)
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path) as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                chunks = rollout.chunks(acting_task(cfg, tmp_path), 3, policy_version=0)
                refused = _streamed_across_the_stop(learner, chunks, [])  # the client ends it: no chunk after
        assert isinstance(refused, grpc.RpcError), refused
        assert refused.code() is grpc.StatusCode.UNAVAILABLE and "the learner is stopping" in refused.details()
    finally:
        rollout.close()


def test_chunks_of_a_stream_idle_at_the_stop_are_duplicates_for_the_next_learner(tmp_path):
    """A stream open and idle when the learner stops (an actor's 50 ms quiet window) is cancelled by the server's
    stop, unacknowledged, so the actor sends its chunks again: the stop trained them into its final checkpoint,
    whose list of trained chunks has the next learner count them as duplicates, not train them a second time."""
    cfg = solo_config(batch_size=128)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)  # 128 samples a chunk
    release = threading.Event()
    try:
        with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0) as coordinator:
            with running_learner(coordinator.address, tmp_path, worker_id="learner-a") as learner:
                learner.learner.wait_published(PLAYER, 0, 60)
                chunks = rollout.chunks(acting_task(cfg, tmp_path), 2, policy_version=0)

                def idle_stream():
                    yield from chunks
                    release.wait(60)

                answer: list = []
                pusher = threading.Thread(target=lambda: answer.append(_pushed(learner.address, idle_stream())))
                pusher.start()
                eventually(lambda: learner.learner.plane.counts().chunks_accepted == 2 or None)
            release.set()
            pusher.join(60)
            assert isinstance(answer[0], grpc.RpcError), answer  # never acknowledged
            stopped = CheckpointStore(tmp_path).latest(PLAYER)
            assert stopped.metadata["agent_steps"] == 256

            with running_learner(coordinator.address, tmp_path, worker_id="learner-b") as learner:
                eventually(lambda: learner.learner.session)
                resent = push(learner.address, chunks)
                assert (resent.chunks_duplicate, resent.chunks_accepted) == (2, 0)
            assert CheckpointStore(tmp_path).latest(PLAYER).metadata["agent_steps"] == 256
    finally:
        release.set()
        rollout.close()


def _streamed_across_the_stop(learner, before, after):
    """One stream: `before`, then the learner's stop (once it took them), then `after` (none: its client ends it
    there); its answer, a PushSummary or the RpcError it ended with."""
    stopping = threading.Event()

    def stream():
        yield from before
        stopping.wait(60)
        yield from after

    answer: list = []
    pusher = threading.Thread(target=lambda: answer.append(_pushed(learner.address, stream())))
    pusher.start()
    try:
        eventually(lambda: learner.learner.plane.counts().chunks_accepted == len(before) or None)
        learner.learner.request_stop()
    finally:
        stopping.set()
        pusher.join(60)
    (result,) = answer
    return result


def _pushed(address: str, chunks):
    try:
        return push(address, chunks, timeout_s=60)
    except grpc.RpcError as err:
        return err


@pytest.mark.parametrize("marked", [True, False], ids=["marked root", "unmarked root"])
def test_a_learner_on_another_share_than_the_coordinators_stops_with_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                                         marked):
    """A learner on another share than the coordinator's (mounted on one side only) died with a traceback, exit 1,
    which supervisors restart for ever (a review). One line naming its root, exit 2: at registration, where the
    coordinator's root holds a marker (common/root_marker.py) and the learner's another; else at its first report,
    which the coordinator refuses for a checkpoint it does not find under its own root, naming both roots, and its
    learn job handed back as failed."""
    import subprocess

    from common.root_marker import ROOT_MARKER
    from learner_service.learner_testing import learner_command

    coordinator_root, learner_root = tmp_path / "a", tmp_path / "b"
    coordinator_root.mkdir()
    learner_root.mkdir()
    if marked:
        (learner_root / ROOT_MARKER).write_text(json.dumps({"root_id": "another"}))
    else:  # a coordinator that could not write its marker (a read-only share): workers check nothing
        def unwritable(root):
            raise PermissionError(f"{root}: read-only")

        monkeypatch.setattr("league_service.coordinator.ensure_root_id", unwritable)
    with running_coordinator(solo_config(batch_size=128), coordinator_root) as server:
        proc = subprocess.run(
            learner_command("--coordinator", server.address, "--shared-root", str(learner_root), "--worker-id",
                            "learner-elsewhere", "--device", "cpu"),
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )
        channel, stub = league_stub(server.address)
        with channel:
            counters = stub.GetStatus(league_pb2.GetStatusRequest()).counters
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if marked:
        assert f"--shared-root {learner_root} is not the coordinator's shared root" in proc.stderr, proc.stderr
        assert counters.jobs_issued == 0
        return
    assert "refused this learner: INVALID_ARGUMENT" in proc.stderr and "under the shared root" in proc.stderr
    assert f"this learner published it under its --shared-root {learner_root}" in proc.stderr, proc.stderr
    assert counters.jobs_finished >= 1 or counters.jobs_failed >= 1
