"""The actor against a real coordinator (in process, port 0) and a recording LearnerService over real gRPC:
solo CartPole and connect-four battle leagues, trajectories a PPO learner can train on, backpressure from a slow
learner, and a learner that goes away mid-job and comes back."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from actor_service.actor import Actor, ActorSettings, JobReport
from actor_service.policy_pool import PolicySettings
from actor_service.testing import ChunkRecords, serve_recording_learner
from actor_service.trajectory_sender import SenderSettings
from common.algorithms.ppo import batch_from_trajectory
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.envs.policy_view import policy_specs
from common.envs.registry import make_env
from common.policy_config import player_seed
from common.ports import restartable_port
from common.proto.league.v1 import league_pb2 as pb
from common.trajectory import Trajectory
from league_service.config import Config, config_from_dict
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from tests.polling import wait_until

# Only keys every version of the model config has: the default league's `policy.model` is not used here.
CARTPOLE_POLICY = {"algorithm": "ppo"}
CONNECT_FOUR_POLICY = {"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "hidden": [32]}}


def solo_config(episode_num: int = 4, unroll_len: int = 8, env_num: int = 2, **adder_kwargs) -> Config:
    cfg = config_from_dict({
        "league": {
            "league_type": "solo",
            "active_players": {"solo_active_player": 1},
            "max_active_player_job": 1,
            "solo_active_player": {"adder_kwargs": {"unroll_len": unroll_len, **adder_kwargs}},
        },
        "env": {"name": "CartPole-v1", "env_num": env_num, "episode_num": episode_num},
    })
    return dataclasses.replace(cfg, policy=CARTPOLE_POLICY)


def bind_learners(stub, endpoint: str, count: int) -> list[str]:
    """Register `count` learner workers streaming to `endpoint` and bind each to an active player."""
    players = []
    for i in range(count):
        worker = f"learner-{i}"
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=worker, role=pb.WORKER_ROLE_LEARNER,
                                                     data_endpoint=endpoint))
        job = stub.GetJob(pb.GetJobRequest(worker_id=worker, role=pb.WORKER_ROLE_LEARNER)).job
        assert job.kind == pb.JOB_KIND_LEARN
        players.append(job.launch_player)
    return players


def actor_settings(address: str, root: Path, **overrides) -> ActorSettings:
    fields = dict(
        coordinator=address, shared_root=root, worker_id="actor-0", manager="base", get_job_wait_s=1.0,
        policies=PolicySettings(first_checkpoint_wait_s=0.0, seed=0),
    )
    fields.update(overrides)
    return ActorSettings(**fields)


def check_transitions(trajectories: list[Trajectory], report: JobReport, env_num: int = 2) -> None:
    """Every decision became a transition, except at most one per env cut by the job's end (a surplus
    episode's last decision, still waiting for its outcome)."""
    sent = sum(t.num_steps for t in trajectories)
    assert report.agent_steps - env_num <= sent <= report.agent_steps


def check_stream(records: ChunkRecords, report: JobReport, player_id: str) -> list[Trajectory]:
    """Every chunk of the job arrived once, in seq order 0..n-1, from this worker and player."""
    chunks = records.of_job(report.job_id)
    assert report.sender is not None
    assert [c.header.seq for c in chunks] == list(range(report.sender.chunks_written))
    assert report.sender.chunks_acked == report.sender.chunks_written
    assert {(c.header.worker_id, c.header.player_id) for c in chunks} == {("actor-0", player_id)}
    return [c.trajectory for c in chunks]


@pytest.fixture
def recording_learner():
    records = ChunkRecords()
    server = serve_recording_learner(records)
    try:
        yield records, server
    finally:
        server.stop(0)


def test_solo_cartpole_jobs_stream_trainable_trajectories(tmp_path, recording_learner):
    records, learner = recording_learner
    info = make_env("CartPole-v1").info()
    inputs, actions = policy_specs(info)
    # The player's learner already published version 3: the actor acts with it, and says so in every chunk.
    player = "solo_active_player_default_0"
    published = make_computation_task(CARTPOLE_POLICY, inputs, actions, "cpu", seed=123)
    CheckpointStore(tmp_path).publish(player, published.get_weights(), 3)

    with running_coordinator(solo_config(episode_num=4), tmp_path) as server:
        channel, stub = league_stub(server.address)
        try:
            assert bind_learners(stub, learner.address, 1) == [player]
            reports = Actor(actor_settings(server.address, tmp_path, max_jobs=2)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()

    assert [r.status for r in reports] == ["completed", "completed"]
    # The actor said it was leaving: the status no longer lists it (it showed it alive for a lease more).
    assert [w.worker_id for w in status.workers if w.role == pb.WORKER_ROLE_ACTOR] == []
    (player_status,) = status.players
    assert player_status.episodes == 8
    assert status.counters.env_steps == sum(r.env_steps for r in reports)
    learner_task = make_computation_task(CARTPOLE_POLICY, inputs, actions, "cpu", seed=player_seed(player))
    for report in reports:
        trajectories = check_stream(records, report, player)
        assert {c.header.policy_version for c in records.of_job(report.job_id)} == {3}
        assert report.agent_steps == report.env_steps  # solo: every step is a decision
        check_transitions(trajectories, report)
        assert sum(int((t.terminals | t.truncations).sum()) for t in trajectories) >= 4
        for trajectory in trajectories:
            assert trajectory.steps <= 8
            batch = batch_from_trajectory(trajectory)
            assert batch["observation"].shape[2:] == (4,) and batch["next_observation"].shape[1:] == (4,)
            stats = learner_task.learn(batch).stats
            assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["value_loss"])


def test_connect_four_battle_league_reports_what_it_played(tmp_path, recording_learner):
    records, learner = recording_learner
    cfg = dataclasses.replace(small_league_config(), policy=CONNECT_FOUR_POLICY)
    with running_coordinator(cfg, tmp_path) as server:
        channel, stub = league_stub(server.address)
        try:
            players = bind_learners(stub, learner.address, 2)
            settings = actor_settings(server.address, tmp_path, manager="subprocess", max_jobs=4)
            reports = Actor(settings).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()

    assert [r.status for r in reports] == ["completed"] * 4
    assert all(r.episodes == 4 for r in reports)
    assert status.counters.matches == 16
    # The payoff holds exactly the games between different players, seen from both sides.
    played = Counter()
    for report in reports:
        home, away = report.players
        if home != away:
            played[(home, away)] += report.episodes
            played[(away, home)] += report.episodes
    payoff = {(e.home, e.away): e for e in status.payoff if e.games}
    assert {k: int(e.games) for k, e in payoff.items()} == dict(played)
    assert {k: e.games_played for k, e in payoff.items()} == dict(played)  # the count, through the wire
    for (home, away), entry in payoff.items():
        assert entry.wins == payoff[(away, home)].losses and entry.draws == payoff[(away, home)].draws

    moved_first = episode_starts = 0
    for report in reports:
        assert report.players[0] in players
        trajectories = check_stream(records, report, report.players[0])
        check_transitions(trajectories, report)
        assert sum(int(t.terminals.sum()) for t in trajectories) >= report.episodes  # every counted game ended
        for t in trajectories:
            obs = t.observations()
            assert obs["observation"].shape[2:] == (5, 6, 7)
            chosen = np.take_along_axis(obs["action_mask"], t.actions()[..., None], axis=-1)
            assert chosen.all()  # every move the launch player made was legal
            assert set(np.unique(t.rewards[t.terminals])) <= {-1.0, 0.0, 1.0}
            assert not t.rewards[~t.terminals].any()  # connect four pays only at the end
            # Episode starts: the board is empty exactly when the launch player moved first.
            starts = np.zeros_like(t.terminals)
            starts[:, 1:] = t.terminals[:, :-1]
            pieces = obs["observation"][:, :, :2].sum(axis=(2, 3, 4))
            moved_first += int(((pieces == 0) & starts).sum())
            episode_starts += int(starts.sum())
            batch_from_trajectory(t)
    assert 0 < moved_first < episode_starts  # the launch player's seat alternated


def test_a_league_exploiter_plays_the_reference_bot_the_env_seats(tmp_path, recording_learner):
    """At start the bot is the league's only past player, so every league-exploiter job is against it: the job
    names it, the env (in a worker process) plays its seat, and its games count in the payoff."""
    records, learner = recording_learner
    cfg = dataclasses.replace(small_league_config({
        "league": {"active_players": {"league_exploiter": 1}, "reference_bots": ["random"]},
    }), policy=CONNECT_FOUR_POLICY)
    with running_coordinator(cfg, tmp_path) as server:
        channel, stub = league_stub(server.address)
        try:
            (player,) = bind_learners(stub, learner.address, 1)
            reports = Actor(actor_settings(server.address, tmp_path, manager="subprocess", max_jobs=2)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()

    assert [r.status for r in reports] == ["completed"] * 2
    assert {r.players for r in reports} == {(player, "bot_random")}
    payoff = {(e.home, e.away): e for e in status.payoff if e.games}
    assert int(payoff[(player, "bot_random")].games) == sum(r.episodes for r in reports) == 8
    assert payoff[("bot_random", player)].wins == payoff[(player, "bot_random")].losses
    bot = next(p for p in status.players if p.player_id == "bot_random")
    assert bot.player_type == "reference_bot" and not bot.active and not bot.checkpoint_path
    moved_first = episode_starts = 0
    for report in reports:
        # The bot's moves are made inside the env: every step is a decision (one per env may still be in flight).
        assert report.env_steps <= report.agent_steps <= report.env_steps + 2
        for t in check_stream(records, report, player):
            starts = np.zeros_like(t.terminals)
            starts[:, 1:] = t.terminals[:, :-1]
            pieces = t.observations()["observation"][:, :, :2].sum(axis=(2, 3, 4))
            moved_first += int(((pieces == 0) & starts).sum())
            episode_starts += int(starts.sum())
    assert 0 < moved_first < episode_starts  # the bot's seat differs between envs

    # Restarted on its state with one more bot: the first bot's games are still there, and the new bot joins.
    more = dataclasses.replace(cfg, league=dataclasses.replace(cfg.league, reference_bots=("random", "mcts:10")))
    with running_coordinator(more, tmp_path) as server:
        channel, stub = league_stub(server.address)
        try:
            again = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    assert {p.player_id for p in again.players} == {player, "bot_random", "bot_mcts_10"}
    assert {(e.home, e.away): e.games for e in again.payoff if e.games} == {k: e.games for k, e in payoff.items()}


def collect_against_a_slow_learner(tmp_path: Path, cfg: Config, **actor_overrides) -> tuple[JobReport, ChunkRecords]:
    """One collect job of `cfg`'s solo player streamed to a recording learner that takes 20 ms per chunk."""
    records = ChunkRecords()
    learner = serve_recording_learner(records, delay_s=0.02)
    try:
        with running_coordinator(cfg, tmp_path) as server:
            channel, stub = league_stub(server.address)
            try:
                bind_learners(stub, learner.address, 1)
                (report,) = Actor(actor_settings(server.address, tmp_path, max_jobs=1, **actor_overrides)).run()
            finally:
                channel.close()
    finally:
        learner.stop(0)
    assert report.status == "completed"
    check_transitions(check_stream(records, report, "solo_active_player_default_0"), report)
    return report, records


def test_backpressure_from_a_slow_learner_bounds_memory_and_loses_nothing(tmp_path):
    sender = SenderSettings(queue_chunks=2, stream_chunks=2)
    report, records = collect_against_a_slow_learner(tmp_path, solo_config(episode_num=6, unroll_len=2), sender=sender)
    stats = report.sender
    assert stats.chunks_written >= 10
    assert stats.max_held <= sender.queue_chunks + sender.stream_chunks  # the memory bound held
    assert stats.chunks_dropped == 0 and records.duplicates == 0


def test_the_league_config_bounds_the_chunks_an_actor_holds(tmp_path):
    """`adder_kwargs.chunks_in_flight` (fresh data for small on-policy batches) overrides the actor's own
    generous sender settings: against a slow learner it never holds more than that, and loses nothing."""
    cfg = solo_config(episode_num=6, unroll_len=2, chunks_in_flight=2)
    report, records = collect_against_a_slow_learner(tmp_path, cfg)
    stats = report.sender
    assert stats.chunks_written >= 10 and stats.max_held <= 2
    assert stats.chunks_dropped == 0 and records.duplicates == 0


@contextlib.contextmanager
def _actor_thread(actor: Actor, reports: list[JobReport]) -> Iterator[threading.Thread]:
    """`actor.run()` on a started thread, its reports into `reports`; stopped and joined at the end of the block,
    whatever happened in it."""
    # A daemon: one a stop cannot reach would hang the interpreter's exit, out of pytest-timeout's reach (a review).
    thread = threading.Thread(target=lambda: reports.extend(actor.run()), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        actor.request_stop()
        thread.join(timeout=30)
        if thread.is_alive():
            pytest.fail("the actor's thread did not stop within 30 s of its stop")


def test_learner_away_mid_job_then_back_gets_every_chunk(tmp_path):
    records = ChunkRecords()
    port = restartable_port()  # it comes back on this port: one no outgoing connection can take meanwhile
    learner = serve_recording_learner(records, port=port, delay_s=0.01)
    sender = SenderSettings(queue_chunks=2, stream_chunks=4)
    reports: list[JobReport] = []
    try:  # the learner is stopped whatever happens, the one it is replaced with too
        with running_coordinator(solo_config(episode_num=10, unroll_len=2), tmp_path) as server:
            channel, stub = league_stub(server.address)
            with channel:
                bind_learners(stub, learner.address, 1)
                actor = Actor(actor_settings(server.address, tmp_path, max_jobs=1, sender=sender))
                with _actor_thread(actor, reports) as thread:
                    assert records.wait_for(3, timeout_s=60)
                    learner.stop(0)  # the learner goes away mid-job ...
                    threading.Event().wait(0.5)  # ... for a while (the actor retries meanwhile) ...
                    learner = serve_recording_learner(records, port=port)  # ... and comes back on its address
                    thread.join(timeout=120)
                    assert not thread.is_alive()
    finally:
        learner.stop(0)
    (report,) = reports
    assert report.status == "completed"
    assert report.sender.failed_streams >= 1  # it did reconnect
    check_transitions(check_stream(records, report, "solo_active_player_default_0"), report)


def test_a_job_whose_chunks_are_not_delivered_before_a_stop_is_released_not_completed(tmp_path, caplog):
    """The rollout ended, but its learner never took the chunks before the actor stopped: the job did not
    complete (COMPLETED would also end its player's failure streak). It is released, its episodes counted."""
    caplog.set_level(logging.DEBUG, logger="actor_service.actor")
    dead = f"127.0.0.1:{restartable_port()}"  # nothing listens there
    reports: list[JobReport] = []
    with running_coordinator(solo_config(episode_num=2), tmp_path) as server:
        channel, stub = league_stub(server.address)
        with channel:
            bind_learners(stub, dead, 1)
            # Room for every chunk of the job: with the sender's default queue a long pair of episodes (138
            # steps, 10 chunks) blocked the rollout until the learner counted as unreachable (120 s).
            actor = Actor(actor_settings(server.address, tmp_path, max_jobs=1, shutdown_flush_s=0.5,
                                         sender=SenderSettings(queue_chunks=256)))
            with _actor_thread(actor, reports):  # stopped at the end of the block
                wait_until("the rollout to end, its chunks waiting for the learner",
                           lambda: "rollout ended" in caplog.text, 120)
            status = stub.GetStatus(pb.GetStatusRequest())
    (report,) = reports
    assert report.episodes == 2, report  # the rollout ended by itself, before the stop
    assert report.status == "released" and report.sender.chunks_acked == 0, report
    assert status.counters.jobs_finished == 1 and status.players[0].episodes == 2


def test_coordinator_without_learners_plays_and_reports_without_streaming(tmp_path):
    with running_coordinator(solo_config(episode_num=3), tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            (report,) = Actor(actor_settings(server.address, tmp_path, max_jobs=1)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    assert report.status == "completed" and report.sender is None
    assert status.players[0].episodes == 3


def test_a_job_whose_env_keeps_failing_is_failed_naming_the_env(tmp_path):
    """The env manager knows its envs by index ("env 1 failed ..."): the actor's error names the env too."""
    name = "python:tests.env_doubles:FlakyEnv"
    cfg = solo_config()
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=name, kwargs={"crash_every": 1}))
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            (report,) = Actor(actor_settings(server.address, tmp_path, max_jobs=1, env_max_retry=0)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    assert report.status == "failed"
    assert report.error.startswith(f"EnvError ({name}): env ") and "InjectedEnvFault" in report.error
    assert status.counters.jobs_failed == 1


def test_a_job_the_actor_cannot_run_is_finished_as_failed(tmp_path):
    cfg = dataclasses.replace(solo_config(), policy={"algorithm": "ppo", "model": {"no_such_field": 1}})
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            (report,) = Actor(actor_settings(server.address, tmp_path, max_jobs=1)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    assert report.status == "failed"
    assert "no_such_field" in report.error
    assert status.counters.jobs_failed == 1 and status.players[0].episodes == 0



def test_a_failed_job_whose_finish_the_coordinator_refuses_is_reported_as_refused(tmp_path, monkeypatch):
    """A job that broke was reported "failed" (log line, per-minute summary) whatever FinishJob came to; the
    coordinator refusing it (a lease gone meanwhile: here a finish naming a job it never issued) is "refused",
    as for a job that played to its end (a review)."""
    from actor_service.coordinator_client import CoordinatorClient

    original = CoordinatorClient.finish_job

    def finish_of_a_job_not_held(self, request, **kwargs):
        request.job_id = "job-the-coordinator-does-not-hold"
        return original(self, request, **kwargs)

    monkeypatch.setattr(CoordinatorClient, "finish_job", finish_of_a_job_not_held)
    cfg = dataclasses.replace(solo_config(), policy={"algorithm": "ppo", "model": {"no_such_field": 1}})
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        (report,) = Actor(actor_settings(server.address, tmp_path, max_jobs=1)).run()
    assert report.status == "refused" and "no_such_field" in report.error

def test_a_newer_checkpoint_is_picked_up_mid_job(tmp_path):
    records = ChunkRecords()
    learner = serve_recording_learner(records, delay_s=0.01)
    player = "solo_active_player_default_0"
    inputs, actions = policy_specs(make_env("CartPole-v1").info())
    store = CheckpointStore(tmp_path)
    store.publish(player, make_computation_task(CARTPOLE_POLICY, inputs, actions, "cpu", seed=1).get_weights(), 1)
    settings = dict(max_jobs=1, sender=SenderSettings(queue_chunks=2, stream_chunks=2),
                    policies=PolicySettings(first_checkpoint_wait_s=0.0, reload_interval_s=0.05))
    reports: list[JobReport] = []
    try:  # the learner is stopped whatever happens
        with running_coordinator(solo_config(episode_num=20, unroll_len=2), tmp_path) as server:
            channel, stub = league_stub(server.address)
            with channel:
                bind_learners(stub, learner.address, 1)
                actor = Actor(actor_settings(server.address, tmp_path, **settings))
                with _actor_thread(actor, reports) as thread:
                    assert records.wait_for(2, timeout_s=60)
                    # The learner publishes version 2 while the job runs: the actor switches to it within a check
                    # or two.
                    weights = make_computation_task(CARTPOLE_POLICY, inputs, actions, "cpu", seed=2).get_weights()
                    store.publish(player, weights, 2)
                    thread.join(timeout=120)
                    assert not thread.is_alive()
    finally:
        learner.stop(0)
    (report,) = reports
    check_stream(records, report, player)
    versions = [c.header.policy_version for c in records.of_job(report.job_id)]
    assert versions[0] == 1 and versions[-1] == 2
    assert versions == sorted(versions)


def test_the_actor_waits_for_a_coordinator_that_is_away(tmp_path):
    from common.rpc import ServerOptions
    from league_service.coordinator import Coordinator, CoordinatorSettings
    from league_service.server import serve_coordinator

    port = restartable_port()  # free, and no outgoing connection can take it before the coordinator binds it
    reports: list[JobReport] = []
    actor = Actor(actor_settings(f"127.0.0.1:{port}", tmp_path, max_jobs=1))
    with _actor_thread(actor, reports) as thread:
        threading.Event().wait(1.0)  # the coordinator is away: the actor retries with backoff meanwhile
        coordinator = Coordinator(solo_config(episode_num=2), CoordinatorSettings(shared_root=tmp_path,
                                                                                   needs_learner=False))
        server = serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=port))
        try:
            thread.join(timeout=60)
            assert not thread.is_alive()
        finally:
            server.stop(grace_s=1.0)
    assert [r.status for r in reports] == ["completed"]


def test_a_report_the_coordinator_refuses_fails_the_job_at_once(tmp_path, caplog):
    """FinishJob refusing the report itself (INVALID_ARGUMENT: here a non-finite return) was taken for an
    outage: the job's lease, renewed by nobody once the job ended, expired a lease later. It is failed now,
    with the refusal as its error, and its slot is free at once."""
    from actor_service.rollout import EpisodeRecord

    caplog.set_level(logging.INFO, logger="actor_service.actor")
    with running_coordinator(solo_config(), tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            actor = Actor(actor_settings(server.address, tmp_path))
            try:
                assert actor._client.register() is not None
                job = actor._client.next_job(10)
                assert job is not None
                bad = EpisodeRecord(12, (job.players[0].player_id,), (None,), (float("inf"),))
                assert actor._finish(job.job_id, pb.FINISH_STATUS_COMPLETED, (bad,), 12, 12) == "refused"
            finally:
                actor._client.close()
            status = stub.GetStatus(pb.GetStatusRequest())
    assert status.counters.jobs_failed == 1 and status.counters.jobs_expired == 0
    assert job.job_id not in [j.job_id for j in status.jobs] and status.players[0].episodes == 0
    assert "refused its report" in caplog.text and "must be a finite number" in caplog.text


def test_step_budget_jobs_play_on_the_episodes_under_way_and_report_them_whole(tmp_path):
    """A step-budget job cut its envs' episodes at its end and reported those that had ended within its steps:
    short episodes were favoured (a solo CartPole player's mean return read 207 where its episodes averaged 275),
    and an episode longer than a job's steps per env was never reported at all. The next job of the same shape
    plays on from where the last one stopped. Here episodes of 10 steps, jobs of 4 steps per env."""
    cfg = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "python:tests.env_doubles:CountingEnv", "kwargs": {"length": 10}, "env_num": 2,
                "episode_num": 0, "env_steps": 8},
    })
    cfg = dataclasses.replace(cfg, policy=CARTPOLE_POLICY)
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            reports = Actor(actor_settings(server.address, tmp_path, max_jobs=6)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
    assert [r.status for r in reports] == ["completed"] * 6
    # Each env ends an episode at its steps 10 and 20: in the third job (steps 9-12) and the fifth (17-20).
    assert [r.episodes for r in reports] == [0, 0, 2, 0, 2, 0]
    assert status.players[0].episodes == 4


def test_jobs_that_play_on_start_a_fresh_env_retry_budget_each(tmp_path):
    """env_max_retry counts an env's failures per job: played on without a reset, the failures of every job added
    up (a reset zeroed them), and the (max_retry + 1)-th of the actor's life failed a job."""
    cfg = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "python:tests.env_doubles:FlakyEnv", "kwargs": {"crash_every": 20}, "env_num": 2,
                "episode_num": 0, "env_steps": 16},  # about one failure a job
    })
    cfg = dataclasses.replace(cfg, policy=CARTPOLE_POLICY)
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            reports = Actor(actor_settings(server.address, tmp_path, max_jobs=6, env_max_retry=1)).run()
    assert [r.status for r in reports] == ["completed"] * 6, [(r.status, r.error) for r in reports]
    assert sum(r.env_failures for r in reports) >= 4


def test_a_subprocess_env_worker_that_died_between_jobs_is_not_played_on(tmp_path):
    """Its envs are rebuilt (their episodes under way gone): the next job resets, which replaces the worker
    without counting a failure, rather than playing on and failing at once with max_retry 0."""
    from actor_service.env_managers import EnvManagers

    managers = EnvManagers("subprocess", max_retry=0, cpus=2)
    try:
        manager = managers.acquire("CartPole-v1", {}, 4, seed=0)
        assert managers.resume("CartPole-v1", {}, 4) is manager  # all alive: played on
        victim = next(w for w in manager._workers if w is not None).process
        victim.kill()
        victim.join(10)
        assert managers.resume("CartPole-v1", {}, 4) is None
        assert managers.acquire("CartPole-v1", {}, 4, seed=1) is manager  # reset, the worker replaced uncounted
        assert all(n == 0 for n in manager.failure_counts.values())
    finally:
        managers.close()


def test_an_env_error_naming_a_file_that_is_no_utf8_fails_the_job_and_the_actor_goes_on(tmp_path):
    """FinishJob's error is a protobuf string: the surrogate of an undecodable byte raised UnicodeEncodeError out
    of the finish, the actor died (exit 1) and, restarted, played the job again; the league saw no failure, only
    a worker leaving (a review). The error is sent with the byte escaped, the job counts as failed."""
    name = "python:tests.env_doubles:UndecodableErrorEnv"
    cfg = solo_config()
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=name))
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            reports = Actor(actor_settings(server.address, tmp_path, max_jobs=2, env_max_retry=0)).run()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    assert [r.status for r in reports] == ["failed", "failed"]
    assert "no such file: /data/caf\\udce9.bin" in reports[0].error
    assert status.counters.jobs_failed == 2


def test_an_env_whose_close_fails_ends_the_actor_cleanly(tmp_path, caplog):
    """The base manager raised the env's close error out of the actor's run (exit 1 at the end of every `league
    run` with such an env, its in-process envs the default): a WARNING now."""
    name = "python:tests.env_doubles:FailingCloseEnv"
    cfg = solo_config(episode_num=1)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=name, kwargs={"length": 3}))
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        with caplog.at_level(logging.WARNING, logger="actor_service.actor"):
            reports = Actor(actor_settings(server.address, tmp_path, max_jobs=1)).run()
    assert [r.status for r in reports] == ["completed"]
    assert "closing the envs: " in caplog.text and "the simulator's handle is gone" in caplog.text
