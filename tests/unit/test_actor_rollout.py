"""Rollout on a scripted two-player game: seats alternate, one forward per policy per step, the launch player's
transitions span its decisions (opponent replies included), episode results per player in job order."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import pytest

from actor_service import rollout as rollout_module
from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig
from actor_service.job import JobError
from actor_service.policy_pool import Policy
from actor_service.rollout import Rollout, RolloutEnd, RolloutTarget
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import InMemorySink
from common.algorithms.ppo import batch_from_trajectory
from common.algorithms.registry import make_computation_task
from common.computation.algorithm import ForwardKwargs
from common.envs.base import (
    NO_INFO,
    ArraySpec,
    DiscreteSpec,
    Env,
    EnvInfo,
    EpisodeStats,
    Outcome,
    StepInfo,
    TimeStep,
)
from common.envs.policy_view import policy_specs
from common.trajectory import Trajectory

OPPONENT_MOVE_BONUS = 0.01


class TakeAwayGame(Env):
    """Two players take 1 or 2 from a pile of `pile`; who takes the last wins (+1, the other -1). Each move
    also pays the player *not* moving 0.01, so a transition's reward must include the opponent's reply.

    Observation per seat: [pile left / pile, moves made so far, 1 if it is this seat's turn]."""

    def __init__(self, pile: int = 5) -> None:
        self._pile = pile
        self._left = pile
        self._moves = 0
        self._returns = np.zeros(2, np.float32)

    def info(self) -> EnvInfo:
        return EnvInfo(
            "take_away",
            {"observation": ArraySpec((2, 3), np.float32), "action_mask": ArraySpec((2, 2), np.bool_),
             "to_play": ArraySpec((), np.int32)},
            DiscreteSpec(2),
            ArraySpec((2,), np.float32),
            num_players=2,
        )

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> dict:
        self._left, self._moves = self._pile, 0
        self._returns = np.zeros(2, np.float32)
        return self._obs()

    def _to_play(self) -> int:
        return -1 if self._left == 0 else self._moves % 2

    def _obs(self) -> dict:
        to_play = self._to_play()
        obs = np.zeros((2, 3), np.float32)
        mask = np.zeros((2, 2), np.bool_)
        for seat in range(2):
            obs[seat] = [self._left / self._pile, self._moves, float(seat == to_play)]
        if to_play >= 0:
            mask[to_play] = [True, self._left >= 2]
        return {"observation": obs, "action_mask": mask, "to_play": np.array(to_play, np.int32)}

    def step(self, action: int) -> TimeStep:
        mover = self._to_play()
        take = int(action) + 1
        if take > self._left:
            raise ValueError(f"illegal: take {take} from {self._left}")
        self._left -= take
        self._moves += 1
        reward = np.zeros(2, np.float32)
        reward[1 - mover] += OPPONENT_MOVE_BONUS
        info = NO_INFO
        if self._left == 0:
            reward[mover] += 1.0
            reward[1 - mover] -= 1.0
            outcome = [Outcome.LOSS, Outcome.LOSS]
            outcome[mover] = Outcome.WIN
            self._returns += reward
            info = StepInfo(episode=EpisodeStats(self._returns.copy(), self._moves), outcome=tuple(outcome))
            return TimeStep(self._obs(), reward, True, False, info)
        self._returns += reward
        return TimeStep(self._obs(), reward, False, False, info)


class CountingTask:
    """A ComputationTask that records the batch size of every predict (one forward per policy per step)."""

    def __init__(self, task) -> None:
        self._task = task
        self.batches: list[int] = []

    def predict(self, inputs, states=None, forward_kwargs=None):
        self.batches.append(len(next(iter(inputs.values()))))
        return self._task.predict(inputs, states, forward_kwargs)

    def __getattr__(self, name):  # state_specs, initial_states, ...: the wrapped task's
        return getattr(self._task, name)


def make_policy(player_id: str, seed: int) -> Policy:
    inputs, actions = policy_specs(TakeAwayGame().info())
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [16]}}, inputs, actions, "cpu", seed)
    return Policy(player_id, CountingTask(task), version=7, path="")


@pytest.fixture
def manager():
    manager = BaseEnvManager([TakeAwayGame, TakeAwayGame], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    yield manager
    manager.close()


@pytest.fixture
def one_env():
    """One env plays every episode in turn: no surplus episodes, so every total below adds up exactly."""
    manager = BaseEnvManager([TakeAwayGame], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    yield manager
    manager.close()


def play(manager, policies, episodes=6, unroll_len=100, stop=None):
    sink = InMemorySink()
    target = RolloutTarget(tuple(p.player_id for p in policies), episodes, 0, ForwardKwargs(), unroll_len)
    rollout = Rollout(manager, manager.env_info, target, policies, stop=stop or StopSignal(), sink=sink)
    return rollout.run(), sink


def split_rows(traj: Trajectory) -> list[Trajectory]:
    return [Trajectory({k: v[b:b + 1] for k, v in traj.tensors.items()}) for b in range(traj.batch_size)]


def first_move_flags(row: Trajectory) -> list[int]:
    """For each episode in a row: 0 if the launch player moved first, 1 if the opponent did."""
    moves = row.observations()["observation"][0, :, 1]
    starts = [0] + [t + 1 for t in np.flatnonzero(row.terminals[0])[:-1]]
    return [int(moves[t]) for t in starts]


def test_battle_rollout_alternates_seats_and_builds_the_launch_players_transitions(one_env):
    home, away = make_policy("home", 1), make_policy("away", 2)
    result, sink = play(one_env, [home, away], episodes=6)

    assert result.end is RolloutEnd.COMPLETED
    assert len(result.episodes) == 6
    for episode in result.episodes:
        assert episode.player_ids == ("home", "away")
        assert sorted(o.value for o in episode.outcomes) == ["loss", "win"]
        assert math.isclose(sum(episode.returns), OPPONENT_MOVE_BONUS * episode.length, abs_tol=1e-5)
    # One forward per policy per step, batched across the envs where that policy acts.
    assert sum(home.task.batches) + sum(away.task.batches) == result.env_steps
    assert sum(home.task.batches) == result.agent_steps

    rows = [row for traj, _ in sink.items for row in split_rows(traj)]
    assert len(rows) == 1  # the job ended before unroll_len
    assert sum(traj.steps for traj in rows) == result.agent_steps  # every decision's episode finished
    assert sum(int(traj.terminals.sum()) for traj in rows) == 6
    assert all(version == 7 for _, version in sink.items)
    opponent_first = 0
    for traj in rows:
        flags = first_move_flags(traj)
        assert flags == [i % 2 for i in range(6)]  # env 0: first in episode 0, second in episode 1, ...
        opponent_first += sum(flags)
        # Terminal transitions: a win pays +1; a loss (the opponent took the last) pays -1 plus its move's bonus.
        for reward in traj.rewards[traj.terminals]:
            assert math.isclose(reward, 1.0, abs_tol=1e-5) or math.isclose(reward, -0.99, abs_tol=1e-5)
        # Every recorded action was legal where it was taken.
        mask = traj.observations()["action_mask"][0]
        actions = traj.actions()[0]
        assert mask[np.arange(len(actions)), actions].all()
        batch = batch_from_trajectory(traj)
        assert batch["observation"].shape == (1, traj.steps, 3)
    assert opponent_first == 3
    # What the launch player received, less the bonus paid before its first decision when it moved second.
    transition_rewards = sum(float(traj.rewards.sum()) for traj in rows)
    launch_returns = sum(e.returns[0] for e in result.episodes)
    sent_returns = [float(r) for traj in rows for r in traj.infos()["episode_return"][traj.terminals]]
    np.testing.assert_allclose(sent_returns, [e.returns[0] for e in result.episodes], atol=1e-5)
    assert math.isclose(transition_rewards, launch_returns - OPPONENT_MOVE_BONUS * opponent_first, abs_tol=1e-4)


def test_self_play_uses_one_policy_for_both_seats_and_records_both_seats(manager):
    me = make_policy("me", 3)
    result, sink = play(manager, [me, me], episodes=4)
    assert len(result.episodes) == 4
    assert all(e.player_ids == ("me", "me") for e in result.episodes)
    assert sum(me.task.batches) == result.env_steps  # both seats act through the same forward
    assert max(me.task.batches) == 2
    # Every decision is the player's own, on-policy: both seats are trained on. The job's end drops at most
    # the last decision of the seat that just moved in each env's surplus episode (2 envs); the seat to move
    # has its transition whole, ended at its next view.
    assert result.agent_steps == result.env_steps
    assert result.agent_steps - 2 <= sum(traj.num_steps for traj, _ in sink.items) <= result.agent_steps
    # Each counted episode ends two rows, one per seat, each with that seat's return.
    sent = sorted(float(r) for traj, _ in sink.items for r in traj.infos()["episode_return"][traj.terminals])
    for episode in result.episodes:
        for seat_return in episode.returns:
            assert any(math.isclose(seat_return, r, abs_tol=1e-5) for r in sent)


@pytest.mark.parametrize("episodes", [1, 3])
def test_the_first_episodes_started_are_reported_and_surplus_ones_only_feed_the_learner(manager, episodes):
    result, sink = play(manager, [make_policy("a", 1), make_policy("b", 2)], episodes=episodes)
    assert len(result.episodes) == episodes
    finished = sum(int(traj.terminals.sum()) for traj, _ in sink.items)
    assert finished >= episodes  # an env that was done early played on (its data still went out)
    assert result.env_steps >= sum(e.length for e in result.episodes)


def test_an_env_step_budget_ends_at_the_episodes_one_finish_job_can_report(manager, monkeypatch):
    """A job of 60,000 episodes made a FinishJob over gRPC's 4 MiB limit: never counted. An env-step job whose
    episodes are short reports at most MAX_EPISODES_PER_JOB of them, then ends."""
    monkeypatch.setattr(rollout_module, "MAX_EPISODES_PER_JOB", 5)
    target = RolloutTarget(("a", "b"), 0, 10**9, ForwardKwargs(), 8)
    rollout = Rollout(manager, manager.env_info, target, [make_policy("a", 1), make_policy("b", 2)],
                      stop=StopSignal(), sink=InMemorySink())
    result = rollout.run()
    # Ended before a step whose endings (one an env at most: 2 here) could pass the cap.
    assert result.end is RolloutEnd.COMPLETED and 5 - 2 < len(result.episodes) <= 5


class OneMoveGame(TakeAwayGame):
    """Every game ends at its first move (a pile of 1), in every env at once; `ended` counts them all."""

    ended = 0

    def __init__(self) -> None:
        super().__init__(pile=1)

    def step(self, action: int) -> TimeStep:
        ts = super().step(action)
        OneMoveGame.ended += ts.terminated
        return ts


def test_no_episode_a_step_ends_past_the_cap_is_lost():
    """Six envs each ended an episode in the step that reached the cap (9): three were recorded and three dropped,
    neither reported nor carried to the next job, their steps trained on all the same (a review). The job now
    ends before a step that could pass the cap."""
    manager = BaseEnvManager([OneMoveGame] * 6, EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        OneMoveGame.ended = 0
        target = RolloutTarget(("a", "b"), 0, 10**9, ForwardKwargs(), 8)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rollout_module, "MAX_EPISODES_PER_JOB", 9)
            rollout = Rollout(manager, manager.env_info, target, [make_policy("a", 1), make_policy("b", 2)],
                              stop=StopSignal(), sink=InMemorySink())
            result = rollout.run()
        assert result.end is RolloutEnd.COMPLETED and len(result.episodes) == OneMoveGame.ended == 6
    finally:
        manager.close()


def test_an_env_step_budget_caps_the_first_episodes_of_its_envs_too():
    """Every env's first episode counted past the cap (a review): envs finishing their first episodes in the step
    that reached it reported more than one FinishJob may hold, and the job's results were refused."""
    manager = BaseEnvManager([TakeAwayGame] * 6, EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        cap = 8
        target = RolloutTarget(("a", "b"), 0, 10**9, ForwardKwargs(), 8)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rollout_module, "MAX_EPISODES_PER_JOB", cap)
            rollout = Rollout(manager, manager.env_info, target, [make_policy("a", 1), make_policy("b", 2)],
                              stop=StopSignal(), sink=InMemorySink())
            result = rollout.run()
            assert rollout.reached_bound
        assert result.end is RolloutEnd.COMPLETED and len(result.episodes) <= cap
    finally:
        manager.close()


def test_stop_ends_after_the_current_step_with_the_episodes_so_far(manager):
    stop = StopSignal()
    home, away = make_policy("home", 1), make_policy("away", 2)
    target = RolloutTarget(("home", "away"), 1000, 0, ForwardKwargs(), 8)
    sink = InMemorySink()
    rollout = Rollout(manager, manager.env_info, target, [home, away], stop=stop, sink=sink,
                      reload=lambda: len(rollout.episodes) >= 3 and stop.set())
    result = rollout.run()
    assert result.end is RolloutEnd.STOPPED
    assert 3 <= len(result.episodes) < 1000
    assert not rollout.reached_bound  # its finished episodes are the short ones: the actor reports none
    # Open decisions were dropped: every transition that was sent belongs to a finished episode or row.
    assert sum(traj.num_steps for traj, _ in sink.items) <= result.agent_steps


def test_players_that_do_not_fit_the_seats_are_refused(manager):
    policies = [make_policy(p, i) for i, p in enumerate(("a", "b", "c"))]
    with pytest.raises(JobError, match="players"):
        play(manager, policies)


class InfiniteRewardGame(TakeAwayGame):
    """A broken env: the winning move pays +inf."""

    def step(self, action: int) -> TimeStep:
        ts = super().step(action)
        if ts.terminated:
            reward = np.where(np.asarray(ts.reward) > 0.5, np.inf, ts.reward).astype(np.float32)
            return TimeStep(ts.obs, reward, ts.terminated, ts.truncated, ts.info)
        return ts


@contextlib.contextmanager
def _two_seat_rollout(*env_fns) -> Iterator[Rollout]:
    """A rollout of take-away games between two policies on a serial manager of ``env_fns``, closed at the end."""
    manager = BaseEnvManager(list(env_fns), EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        target = RolloutTarget(("home", "away"), 4, 0, ForwardKwargs(), 8)
        yield Rollout(manager, manager.env_info, target, [make_policy("home", 1), make_policy("away", 2)],
                      stop=StopSignal(), sink=InMemorySink())
    finally:
        manager.close()


def test_a_non_finite_reward_fails_the_job_naming_the_env():
    """It went into the episode's return: FinishJob refused the job's results whole (the actor took the refusal
    for an outage, and the job's lease expired unrenewed), and the learner refused the chunk."""
    with _two_seat_rollout(InfiniteRewardGame) as rollout:
        with pytest.raises(RuntimeError, match=r"env 0 \(take_away\) gave a non-finite reward \[.*inf.*\] \(step \d+ of its episode\)"):
            rollout.run()
        assert not rollout.episodes


class NanObservationGame(TakeAwayGame):
    """A broken env: from the second move on, its observation holds a NaN."""

    def _obs(self) -> dict:
        obs = super()._obs()
        if self._moves >= 2:
            obs["observation"][:, 0] = np.nan
        return obs


def test_a_non_finite_observation_fails_the_job_naming_the_env():
    """The learner refused the chunk ("/observations: holds NaN or infinite values"), naming neither the env nor
    the step (a review)."""
    with _two_seat_rollout(TakeAwayGame, NanObservationGame) as rollout, pytest.raises(
            RuntimeError, match=r"env 1 \(take_away\) gave a non-finite observation 'observation' \(step 2 of its episode\)"):
        rollout.run()


class NanFinalObservationGame(TakeAwayGame):
    """A broken env: its observation holds a NaN once the pile is empty (the episode's last, acted on by nobody)."""

    def _obs(self) -> dict:
        obs = super()._obs()
        if self._left == 0:
            obs["observation"][:, 0] = np.nan
        return obs


def test_a_non_finite_final_observation_fails_the_job_naming_the_env():
    """Only observations about to be acted on were checked: an episode's last went into the trajectory, and the
    learner refused the chunk naming neither the env nor the step (a review)."""
    with _two_seat_rollout(TakeAwayGame, NanFinalObservationGame) as rollout, pytest.raises(
            RuntimeError, match=r"env 1 \(take_away\) gave a non-finite observation 'observation' \(step \d+ of"):
        rollout.run()


class NoLegalMoveGame(TakeAwayGame):
    """A broken env: at its third move, the mover's mask allows nothing."""

    def _obs(self) -> dict:
        obs = super()._obs()
        if self._moves == 2:
            obs["action_mask"][:] = False
        return obs


def test_a_mover_with_no_legal_action_fails_the_job_naming_the_env():
    """The policy refused the batch naming a row of it ("action_mask: row(s) [1] have no legal action")."""
    with _two_seat_rollout(TakeAwayGame, NoLegalMoveGame) as rollout, pytest.raises(
            RuntimeError, match=r"env 1 \(take_away\) asks for an action with no legal one in its 'action_mask' "
                                r"\(step 2 of its episode\)"):
        rollout.run()


class TenStepEnv(Env):
    """A solo env of 10-step episodes paying 1 a step, with no episode stats of its own (the rollout counts)."""

    def __init__(self) -> None:
        self._t = 0

    def info(self) -> EnvInfo:
        return EnvInfo("ten_steps", ArraySpec((2,), np.float32), DiscreteSpec(2))

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray:
        self._t = 0
        return np.zeros(2, np.float32)

    def step(self, action: int) -> TimeStep:
        self._t += 1
        return TimeStep(np.array([self._t, action], np.float32), 1.0, self._t >= 10, False, NO_INFO)


def test_a_step_budget_rollout_plays_on_the_episodes_its_predecessor_left_under_way():
    """`carry_out()` into the next rollout's `carry`: episodes longer than a job's steps are reported whole,
    with their length and return counted across the jobs (returns started at 0 in every job before)."""
    manager = BaseEnvManager([TenStepEnv, TenStepEnv], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        policy = solo_policy()
        target = RolloutTarget(("solo",), 0, 8, ForwardKwargs(), 4)  # 4 steps per env and job
        carry = None
        episodes = []
        for _ in range(3):
            sink = InMemorySink()
            rollout = Rollout(manager, manager.env_info, target, [policy], stop=StopSignal(), sink=sink, carry=carry)
            result = rollout.run()
            episodes.append(result.episodes)
            carry = rollout.carry_out()
            # Every step played becomes a transition: the last one of each env is not dropped at the job's end.
            rewards = sum(float(t.tensors["/rewards"].sum()) for t, _ in sink.items)
            assert sum(t.num_steps for t, _ in sink.items) == result.agent_steps == 8 and rewards == 8.0
        assert [len(e) for e in episodes] == [0, 0, 2]
        assert [(e.length, e.returns) for e in episodes[2]] == [(10, (10.0,))] * 2
        assert [c.length for c in carry] == [2, 2]  # the next episodes, two steps in
        with pytest.raises(ValueError, match="carry: 2 envs' episodes for a job of 2 envs"):
            Rollout(manager, manager.env_info, RolloutTarget(("solo",), 4, 0, ForwardKwargs(), 4), [policy],
                    stop=StopSignal(), carry=carry)  # a job of episodes reports the first started: no carry
    finally:
        manager.close()


class EndlessEnv(TenStepEnv):
    """A custom env that never ends an episode (no termination, no time limit)."""

    def step(self, action: int) -> TimeStep:
        self._t += 1
        return TimeStep(np.array([self._t, action], np.float32), 1.0, False, False, NO_INFO)


def solo_policy() -> Policy:
    inputs, actions = policy_specs(TenStepEnv().info())
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, inputs, actions, "cpu", 0)
    return Policy("solo", task, version=1, path="")


def test_a_job_of_episodes_given_env_steps_too_ends_at_whichever_bound_comes_first():
    """`env.env_steps` beside `episode_num` was ignored: a job of episodes an env never ended never finished.
    Now it caps the job, which reports the counted episodes that ended within it."""
    manager = BaseEnvManager([TenStepEnv, TenStepEnv], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        policy = solo_policy()
        capped = Rollout(manager, manager.env_info, RolloutTarget(("solo",), 6, 30, ForwardKwargs(), 4), [policy],
                         stop=StopSignal(), sink=InMemorySink())
        result = capped.run()
        assert result.end is RolloutEnd.COMPLETED and capped.reached_bound
        assert result.env_steps == 30 and len(result.episodes) == 2  # 15 steps per env: one episode each
        manager.reset()
        episodes_first = Rollout(manager, manager.env_info, RolloutTarget(("solo",), 2, 1000, ForwardKwargs(), 4),
                                 [policy], stop=StopSignal(), sink=InMemorySink()).run()
        assert len(episodes_first.episodes) == 2 and episodes_first.env_steps == 20
    finally:
        manager.close()


def test_an_episode_that_never_ends_is_warned_of_where_nothing_else_bounds_its_job(monkeypatch, caplog):
    monkeypatch.setattr(rollout_module, "LONG_EPISODE_STEPS", 50)
    manager = BaseEnvManager([EndlessEnv], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        policy = solo_policy()
        stop = StopSignal()
        steps = 0

        def reload():  # called once per loop: stands in for an actor stopped from outside after 600 steps
            nonlocal steps
            steps += 1
            if steps > 600:
                stop.set()

        with caplog.at_level("WARNING", logger="actor_service.rollout"):
            result = Rollout(manager, manager.env_info, RolloutTarget(("solo",), 4, 0, ForwardKwargs(), 4), [policy],
                             stop=stop, sink=InMemorySink(), reload=reload).run()
        assert result.end is RolloutEnd.STOPPED and result.episodes == ()
        warned = [r.getMessage() for r in caplog.records if "not ended it" in r.getMessage()]
        assert len(warned) == 2  # at 50 steps, then at 500: not every step
        assert "env 0 (ten_steps) has played 50 steps of one episode" in warned[0]
        assert "env.env_steps" in warned[0] and "500 steps" in warned[1]
        caplog.clear()
        manager.reset()
        with caplog.at_level("WARNING", logger="actor_service.rollout"):  # a step cap bounds it: no warning
            result = Rollout(manager, manager.env_info, RolloutTarget(("solo",), 4, 200, ForwardKwargs(), 4),
                             [policy], stop=StopSignal(), sink=InMemorySink()).run()
        assert result.env_steps == 200 and result.episodes == ()
        assert not [r for r in caplog.records if "not ended it" in r.getMessage()]
    finally:
        manager.close()


class ReusedBufferEnv(TenStepEnv):
    """TenStepEnv writing every observation into one array it returns each time (as some envs do to save
    allocations); the serial manager hands that array on as it is."""

    def __init__(self) -> None:
        super().__init__()
        self._buf = np.zeros(2, np.float32)

    def reset(self) -> np.ndarray:
        self._t = 0
        self._buf[:] = 0.0
        return self._buf

    def step(self, action: int) -> TimeStep:
        self._t += 1
        self._buf[:] = [self._t, action]
        return TimeStep(self._buf, 1.0, self._t >= 10, False, NO_INFO)


def test_an_env_reusing_its_observation_buffer_leaves_the_trajectory_as_it_was_played():
    """The trajectory kept the env's own array for every step: each later step rewrote the earlier ones, so
    every step of a row read the last observation (the subprocess manager, which copies, gave the real
    ones; an env-manager review)."""
    manager = BaseEnvManager([ReusedBufferEnv], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        inputs, actions = policy_specs(ReusedBufferEnv().info())
        task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, inputs, actions, "cpu", 0)
        sink = InMemorySink()
        target = RolloutTarget(("solo",), 2, 0, ForwardKwargs(), 100)
        Rollout(manager, manager.env_info, target, [Policy("solo", task, version=1, path="")],
                stop=StopSignal(), sink=sink).run()
        rows = [row for traj, _ in sink.items for row in split_rows(traj)]
        steps = [t for row in rows for t in row.observations()["observation"][0, :, 0].tolist()]
        assert steps == [float(t) for t in range(10)] * 2, steps  # two episodes: before, all zeros
    finally:
        manager.close()
