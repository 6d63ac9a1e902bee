"""An actor job with a reference-bot player: the env plays the bot's seat (given at reset), the policy plays the
other seat, seats differ across envs and stay put across an env's episodes, both players' outcomes are reported,
and the next job without bots gets envs without them."""

from __future__ import annotations

import pytest

from actor_service.actor import job_seed
from actor_service.env_managers import EnvManagers
from actor_service.job import JobError, JobPlan
from actor_service.policy_pool import Policy
from actor_service.rollout import Rollout, RolloutTarget, Seating, seat_bots
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import InMemorySink
from common.algorithms.registry import make_computation_task
from common.computation.algorithm import ForwardKwargs
from common.envs.base import Outcome
from common.envs.policy_view import policy_specs
from common.proto.league.v1 import league_pb2 as pb

ENV_NUM = 4


def test_seat_bots_follow_the_seating_and_the_offset():
    assert seat_bots(("", "mcts:5"), 4, offset=0) == [{1: "mcts:5"}, {0: "mcts:5"}, {1: "mcts:5"}, {0: "mcts:5"}]
    assert seat_bots(("", "random"), 2, offset=1) == [{0: "random"}, {1: "random"}]
    seating = Seating(2, 2, frozenset({1}), offset=1)
    assert [seating.seats(0, episode) for episode in range(3)] == [[1, 0]] * 3  # fixed for the job
    with pytest.raises(JobError, match="launch player is a reference bot"):
        Seating(2, 2, frozenset({0}))
    with pytest.raises(JobError, match="cannot fill"):
        Seating(1, 2, frozenset({1}))


def test_policy_players_rotate_per_episode_from_a_seat_the_jobs_seed_picks():
    """Without the offset, a job of an odd number of episodes gave its extra one to seat 0 (the first mover's)
    in every job: a one-env job of one episode always seated the launch player first."""
    assert [Seating(2, 2).seats(0, episode) for episode in range(3)] == [[0, 1], [1, 0], [0, 1]]
    assert [Seating(2, 2, offset=1).seats(0, episode) for episode in range(3)] == [[1, 0], [0, 1], [1, 0]]
    assert [Seating(2, 2, offset=7).seats(env, 0) for env in range(2)] == [[1, 0], [0, 1]]
    first_seats = {Seating(2, 2, offset=job_seed(f"job-{j}")).seats(0, 0)[0] for j in range(16)}
    assert first_seats == {0, 1}


def test_a_battle_match_on_an_env_of_another_seat_count_names_the_keys_to_change():
    """A battle league on CartPole (1 seat) or on 3-player Kuhn poker failed its jobs with "2 players cannot
    fill an env with N seat(s)" only, naming no config key; `league run` ended with that line."""
    with pytest.raises(JobError, match=r"cannot fill an env with 1 seat\(s\): .*env.name.*league.league_type: solo"):
        Seating(2, 1)
    with pytest.raises(JobError, match=r"cannot fill an env with 3 seat\(s\): .*env.kwargs.game_params\) must give a "
                                       r"two-player game$"):
        Seating(2, 3, frozenset({1}))


@pytest.fixture
def managers():
    managers = EnvManagers("base")
    yield managers
    managers.close()


def _policy(info, player_id: str) -> Policy:
    inputs, actions = policy_specs(info)
    task = make_computation_task({"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "hidden": [16]}}, inputs, actions, "cpu", 0)
    return Policy(player_id, task, version=1, path="")


def _bot_seats(managers: EnvManagers) -> list[tuple[int, ...]]:
    return [env.bot_seats for env in managers.current._envs]


def test_a_bot_job_plays_the_bot_inside_the_env_and_reports_both_players(managers):
    bots = seat_bots(("", "random"), ENV_NUM, offset=7)
    manager = managers.acquire("connect_four", {}, ENV_NUM, seed=3, seat_bots=bots)
    assert _bot_seats(managers) == [tuple(b) for b in bots] == [(0,), (1,), (0,), (1,)]
    me = _policy(manager.env_info, "me")
    target = RolloutTarget(("me", "bot_random"), 12, 0, ForwardKwargs(), 64)
    sink = InMemorySink()
    result = Rollout(manager, manager.env_info, target, [me, None], stop=StopSignal(), sink=sink,
                     seat_offset=7).run()

    assert len(result.episodes) == 12
    for episode in result.episodes:
        assert episode.player_ids == ("me", "bot_random")
        assert {episode.outcomes} <= {(Outcome.WIN, Outcome.LOSS), (Outcome.LOSS, Outcome.WIN),
                                       (Outcome.DRAW, Outcome.DRAW)}
        assert episode.returns[0] == -episode.returns[1]
    assert result.agent_steps == result.env_steps  # every step the actor took was the policy's
    assert sum(traj.num_steps for traj, _ in sink.items) > 0
    assert _bot_seats(managers) == [(0,), (1,), (0,), (1,)]  # the envs kept their bots from episode to episode

    # The next job has no bots: the same envs, reset without them, and two policies fill both seats.
    again = managers.acquire("connect_four", {}, ENV_NUM, seed=4)
    assert again is manager and _bot_seats(managers) == [()] * ENV_NUM
    other = _policy(manager.env_info, "other")
    target = RolloutTarget(("me", "other"), 4, 0, ForwardKwargs(), 64)
    result = Rollout(manager, manager.env_info, target, [me, other], stop=StopSignal(), sink=InMemorySink()).run()
    assert len(result.episodes) == 4 and result.agent_steps < result.env_steps


def test_a_bot_seat_the_env_does_not_play_is_an_error(managers):
    manager = managers.acquire("connect_four", {}, 2, seed=3)  # no bots given to the envs
    me = _policy(manager.env_info, "me")
    target = RolloutTarget(("me", "bot_random"), 2, 0, ForwardKwargs(), 64)
    with pytest.raises(RuntimeError, match="reference bot's, yet the env asks for its action"):
        Rollout(manager, manager.env_info, target, [me, None], stop=StopSignal(), sink=InMemorySink()).run()


def test_an_env_that_cannot_seat_bots_fails_the_job_and_the_next_job_gets_fresh_envs(managers):
    name = "python:tests.unit.test_actor_rollout:TakeAwayGame"  # a two-seat game whose reset takes no bots
    first = managers.acquire(name, {}, 2, seed=1)
    with pytest.raises(Exception, match="bots"):
        managers.acquire(name, {}, 2, seed=2, seat_bots=[{1: "random"}, {0: "random"}])
    assert managers.current is None and first.closed  # its envs kept the failed reset params: dropped
    again = managers.acquire(name, {}, 2, seed=3)
    assert again is not first and not again.closed


def _job(*players: pb.PlayerRef, **fields) -> pb.Job:
    return pb.Job(job_id="j", kind=pb.JOB_KIND_COLLECT, launch_player=players[0].player_id, players=players,
                  env_name="connect_four", env_num=2, episode_num=4, **fields)


def test_a_job_names_its_bots():
    plan = JobPlan.from_proto(_job(pb.PlayerRef(player_id="p", active=True),
                                   pb.PlayerRef(player_id="bot_mcts_25", bot="mcts:25")))
    assert plan.player_bots == ("", "mcts:25")
    assert plan.players[1].bot == "mcts:25"


@pytest.mark.parametrize(
    ("players", "field"),
    [
        ((pb.PlayerRef(player_id="b", bot="random"), pb.PlayerRef(player_id="p")), "players[0].bot"),
        ((pb.PlayerRef(player_id="p", active=True), pb.PlayerRef(player_id="b", bot="mcts:x")), "players[1].bot"),
        ((pb.PlayerRef(player_id="p", active=True), pb.PlayerRef(player_id="b", bot="random", active=True)),
         "players[1].bot"),
    ],
)
def test_a_bad_bot_in_a_job_is_named(players, field):
    with pytest.raises(JobError) as info:
        JobPlan.from_proto(_job(*players))
    assert info.value.field == field


def test_env_bots_and_bot_players_do_not_mix():
    from google.protobuf import struct_pb2

    kwargs = struct_pb2.Struct()
    kwargs.update({"bots": {"1": "random"}})
    with pytest.raises(JobError) as info:
        JobPlan.from_proto(_job(pb.PlayerRef(player_id="p", active=True),
                                pb.PlayerRef(player_id="b", bot="random"), env_kwargs=kwargs))
    assert info.value.field == "env_kwargs.bots"
