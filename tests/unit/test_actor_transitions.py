"""SeatTrajectory: turn-based transitions (decision to next decision), row cuts, and the trajectory format."""

import numpy as np
import pytest

from actor_service.transitions import Decision, SeatTrajectory
from common.algorithms.ppo import batch_from_trajectory


def view(value: float, legal=(True, True)) -> dict:
    return {"observation": np.full(3, value, np.float32), "action_mask": np.array(legal)}


def decision(value: float, action: int, version: int = 0) -> Decision:
    return Decision(view(value), np.int64(action), {"logp": np.float32(-0.5), "value": np.float32(value)}, version)


def test_transition_spans_from_decision_to_next_decision_with_rewards_in_between():
    seat = SeatTrajectory(unroll_len=8)
    assert seat.decide(decision(0.0, 1)) == []
    seat.add_reward(0.0)  # our move
    seat.add_reward(0.25)  # the opponent's reply pays us something
    assert seat.decide(decision(1.0, 0)) == []
    seat.add_reward(0.5)
    seat.add_reward(-1.0)  # the opponent made the last move and won
    assert seat.end_episode(view(2.0, (False, False)), terminated=True, truncated=False, episode_return=-0.2) == []
    rows = seat.cut()
    assert len(rows) == 1
    traj = rows[0].trajectory
    assert traj.batch_size == 1 and traj.steps == 2
    np.testing.assert_allclose(traj.rewards, [[0.25, -0.5]])
    np.testing.assert_array_equal(traj.terminals, [[False, True]])  # terminal although the opponent moved last
    np.testing.assert_array_equal(traj.truncations, [[False, False]])
    np.testing.assert_array_equal(traj.actions(), [[1, 0]])
    np.testing.assert_array_equal(traj.observations()["observation"][0, :, 0], [0.0, 1.0])
    np.testing.assert_array_equal(traj.next_observations()["observation"][0], np.full(3, 2.0))
    assert set(traj.artifacts()) == {"logp", "value"}
    np.testing.assert_allclose(traj.infos()["episode_return"], [[0.0, -0.2]])
    batch = batch_from_trajectory(traj)
    assert batch["behaviour_logp"].shape == (1, 2)


def test_a_full_row_continues_at_the_next_decision():
    seat = SeatTrajectory(unroll_len=2)
    seat.decide(decision(0.0, 0, version=3))
    seat.add_reward(1.0)
    assert seat.decide(decision(1.0, 0, version=5)) == []
    seat.add_reward(2.0)
    rows = seat.decide(decision(2.0, 1, version=5))
    assert len(rows) == 1
    row = rows[0]
    assert row.policy_version == 3  # the oldest policy that acted in the row
    np.testing.assert_allclose(row.trajectory.rewards, [[1.0, 2.0]])
    np.testing.assert_array_equal(row.trajectory.next_observations()["observation"][0], np.full(3, 2.0))
    assert seat.pending_steps == 0 and seat.waiting


def test_truncation_ends_the_row_so_the_final_observation_is_kept():
    seat = SeatTrajectory(unroll_len=10)
    seat.decide(decision(0.0, 0))
    seat.decide(decision(1.0, 1))
    seat.add_reward(0.5)
    rows = seat.end_episode(view(9.0), terminated=False, truncated=True)
    assert len(rows) == 1
    traj = rows[0].trajectory
    np.testing.assert_array_equal(traj.truncations, [[False, True]])
    np.testing.assert_array_equal(traj.next_observations()["observation"][0], np.full(3, 9.0))
    assert seat.pending_steps == 0


def test_cut_drops_the_open_decision_and_bootstraps_from_its_observation():
    seat = SeatTrajectory(unroll_len=10)
    seat.decide(decision(0.0, 0))
    seat.add_reward(0.1)
    seat.decide(decision(1.0, 1))  # waits for its outcome when the job ends
    seat.add_reward(0.7)
    rows = seat.cut()
    traj = rows[0].trajectory
    assert traj.steps == 1
    np.testing.assert_allclose(traj.rewards, [[0.1]])
    np.testing.assert_array_equal(traj.terminals | traj.truncations, [[False]])
    np.testing.assert_array_equal(traj.next_observations()["observation"][0], np.full(3, 1.0))
    assert not seat.waiting and seat.cut() == []


def test_an_episode_without_a_decision_of_the_player_adds_nothing():
    seat = SeatTrajectory(unroll_len=4)
    seat.add_reward(1.0)
    assert seat.end_episode(view(0.0), terminated=True, truncated=False) == []
    assert seat.cut() == []


def test_terminal_inside_a_row_is_followed_by_the_next_episode():
    seat = SeatTrajectory(unroll_len=3)
    seat.decide(decision(0.0, 0))
    seat.add_reward(1.0)
    seat.end_episode(view(0.5), terminated=True, truncated=False)
    seat.decide(decision(10.0, 1))  # first decision of the next episode
    seat.add_reward(-1.0)
    seat.end_episode(view(10.5), terminated=True, truncated=False)
    seat.decide(decision(20.0, 0))
    rows = seat.end_episode(view(20.5), terminated=True, truncated=False)
    traj = rows[0].trajectory
    np.testing.assert_array_equal(traj.terminals, [[True, True, True]])
    np.testing.assert_array_equal(traj.observations()["observation"][0, :, 0], [0.0, 10.0, 20.0])
    np.testing.assert_allclose(traj.rewards, [[1.0, -1.0, 0.0]])


def test_plain_observations_travel_as_plain_arrays():
    seat = SeatTrajectory(unroll_len=1)
    rows = seat.decide(Decision({"observation": np.zeros(4, np.float32)}, np.int64(0), {}, 0))
    assert rows == []
    rows = seat.end_episode({"observation": np.ones(4, np.float32)}, terminated=True, truncated=False)
    assert "/observations" in rows[0].trajectory.tensors
    assert "/next_observations" in rows[0].trajectory.tensors


@pytest.mark.parametrize("unroll_len", [0, -1])
def test_unroll_len_must_be_positive(unroll_len):
    with pytest.raises(ValueError, match="unroll_len"):
        SeatTrajectory(unroll_len)


def test_rows_feed_dqn_transitions_too():
    from common.algorithms.dqn import transitions_from_trajectory

    seat = SeatTrajectory(unroll_len=4)
    for t in range(3):
        seat.decide(Decision(view(float(t)), np.int64(t % 2), {}, 0))
        seat.add_reward(1.0)
    rows = seat.end_episode(view(3.0), terminated=True, truncated=False) + seat.cut()
    batch = transitions_from_trajectory(rows[0].trajectory, gamma=0.9, n_step=2)
    assert batch["action"].tolist() == [0, 1, 0]
    np.testing.assert_allclose(batch["return"], [1.9, 1.9, 1.0])
    np.testing.assert_allclose(batch["discount"], [0.81, 0.0, 0.0])
