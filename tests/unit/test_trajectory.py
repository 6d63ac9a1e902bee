import numpy as np
import pytest

from common.trajectory import (
    AgentStep,
    Trajectory,
    TrajectoryBuilder,
    TrajectoryError,
    check_key,
)

B, T = 3, 4


def make_tensors(batch=B, steps=T, dict_obs=False):
    tensors = {
        "/rewards": np.arange(batch * steps, dtype=np.float32).reshape(batch, steps),
        "/terminals": np.zeros((batch, steps), bool),
        "/truncations": np.zeros((batch, steps), bool),
        "/agents/agent/actions": np.zeros((batch, steps), np.int64),
        "/agents/agent/artifacts/logp": np.zeros((batch, steps), np.float32),
    }
    if dict_obs:
        tensors["/observations/observation"] = np.zeros((batch, steps, 2, 3), np.float32)
        tensors["/observations/action_mask"] = np.ones((batch, steps, 7), bool)
        tensors["/next_observations/observation"] = np.zeros((batch, 2, 3), np.float32)
        tensors["/next_observations/action_mask"] = np.ones((batch, 7), bool)
    else:
        tensors["/observations"] = np.zeros((batch, steps, 4), np.float32)
        tensors["/next_observations"] = np.zeros((batch, 4), np.float32)
    return tensors


def test_valid_trajectory_views():
    traj = Trajectory(make_tensors())
    assert (traj.batch_size, traj.steps, traj.num_steps) == (B, T, B * T)
    assert set(traj.observations()) == {"observation"}
    assert traj.next_observations()["observation"].shape == (B, 4)
    assert traj.agents() == ["agent"]
    assert set(traj.artifacts("agent")) == {"logp"}
    np.testing.assert_array_equal(traj.masks, np.ones((B, T), np.float32))
    with pytest.raises(KeyError, match="no such agent"):
        traj.actions("other")


def test_dict_observations_map_to_their_names():
    traj = Trajectory(make_tensors(dict_obs=True))
    assert set(traj.observations()) == {"observation", "action_mask"}
    assert traj.observations()["action_mask"].dtype == np.bool_


def test_trajectory_is_read_only_mapping():
    traj = Trajectory(make_tensors())
    with pytest.raises(TypeError):
        traj.tensors["/rewards"] = np.zeros((B, T), np.float32)


def test_masks_reflect_both_kinds_of_episode_end():
    tensors = make_tensors()
    tensors["/terminals"][0, 1] = True
    tensors["/truncations"][1, 2] = True
    masks = Trajectory(tensors).masks
    assert masks[0, 1] == 0 and masks[1, 2] == 0 and masks.sum() == B * T - 2


@pytest.mark.parametrize(
    "key",
    ["/observations", "/observations/board", "/rewards", "/terminals", "/truncations", "/masks", "/infos/x",
     "/agents/main_0/actions", "/agents/a/hidden_state", "/agents/a/hidden_state/h", "/agents/a/artifacts/logp",
     "/next_observations", "/next_observations/board"],
)
def test_key_grammar_accepts(key):
    assert check_key(key) == key


@pytest.mark.parametrize(
    "key",
    ["observations", "/observations/", "/observations/a/b", "/infos", "/agents/a/other", "/agents//actions",
     "/agents/a b/actions", "/rewards/x", "/agents/../actions", "", "/infos/.hidden", "/rewards\n",
     "/next_observations\n"],
)
def test_key_grammar_rejects(key):
    with pytest.raises(TrajectoryError):
        check_key(key)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda t: t.pop("/rewards"), "/rewards"),
        (lambda t: t.pop("/terminals"), "/terminals"),
        (lambda t: t.update({"/observations": np.zeros((B, T + 1, 4), np.float32)}), "/observations"),
        (lambda t: t.update({"/agents/agent/actions": np.zeros((B + 1, T), np.int64)}), "actions"),
        (lambda t: t.update({"/terminals": np.zeros((B, T), np.int8)}), "/terminals"),
        (lambda t: t.update({"/rewards": np.zeros((B, T), np.int32)}), "/rewards"),
        (lambda t: t.update({"/next_observations": np.zeros((B, 5), np.float32)}), "/next_observations"),
        (lambda t: t.update({"/next_observations": np.zeros((B, 4), np.float64)}), "dtype"),
        (lambda t: t.pop("/next_observations"), "/next_observations"),
        (lambda t: t.update({"/agents/b/artifacts/logp": np.zeros((B, T), np.float32)}), "/agents/b/actions"),
        (lambda t: t.update({"/infos/x": np.zeros((B, T), object)}), "dtype"),
        (lambda t: t.update({"/infos/x": [[0] * T] * B}), "numpy"),
        (lambda t: t.update({"/bogus": np.zeros((B, T))}), "/bogus"),
        (lambda t: t.update({"/observations/x": np.zeros((B, T), np.float32)}), "either"),
        # A step both terminated and truncated: learners dropped it as truncated, losing a real terminal.
        (lambda t: (t["/terminals"].__setitem__((0, 1), True), t["/truncations"].__setitem__((0, 1), True)),
         r"/truncations: step \[0, 1\] is also terminated"),
        # /masks, when sent, must say what /terminals and /truncations say (it was taken as is).
        (lambda t: t.update({"/masks": np.full((B, T), 7, np.int64)}), "/masks: expected float"),
        (lambda t: (t["/terminals"].__setitem__((1, 2), True), t.update({"/masks": np.ones((B, T), np.float32)})),
         "/masks: must be 1 - "),
        # ... truncations included: a mask that goes on over a truncation bootstraps from the next episode.
        (lambda t: (t["/truncations"].__setitem__((1, 2), True), t.update({"/masks": np.ones((B, T), np.float32)})),
         "/masks: must be 1 - "),
        # No steps at all (a peer's (B, 0) chunk): nothing to train on, and per-step means would divide by zero.
        (lambda t: t.update({k: v[:, :0] for k, v in t.items() if not k.startswith("/next_observations")}),
         "/rewards: empty"),
        (lambda t: t.update({"/next_observations/observation": t.pop("/next_observations")}), "plain/dict form"),
    ],
)
def test_validation_names_the_key(mutate, match):
    tensors = make_tensors()
    mutate(tensors)
    with pytest.raises(TrajectoryError, match=match):
        Trajectory(tensors)


def test_concatenate_along_batch():
    a, b = Trajectory(make_tensors(batch=2)), Trajectory(make_tensors(batch=3))
    both = Trajectory.concatenate([a, b])
    assert both.batch_size == 5 and both.steps == T
    with pytest.raises(TrajectoryError, match="steps"):
        Trajectory.concatenate([a, Trajectory(make_tensors(steps=T + 1))])
    with pytest.raises(TrajectoryError, match="keys"):
        Trajectory.concatenate([a, Trajectory(make_tensors(dict_obs=True))])


def test_builder_collects_steps_and_cuts_segments():
    builder = TrajectoryBuilder(batch_size=2, unroll_len=3)
    for t in range(3):
        builder.add(
            observations={"observation": np.full((2, 5), t, np.float32), "action_mask": np.ones((2, 4), bool)},
            agents={"agent": AgentStep(np.array([t, t + 1]), {"logp": np.full(2, -0.5, np.float32)})},
            rewards=np.array([1.0, 2.0]),
            terminals=np.array([False, t == 1]),
            truncations=np.array([False, False]),
            infos={"lives": np.array([3, 3])},
        )
    assert builder.full
    with pytest.raises(TrajectoryError, match="full"):
        builder.add(np.zeros((2, 5)), {"agent": AgentStep(np.zeros(2))}, np.zeros(2), np.zeros(2), np.zeros(2))
    traj = builder.build({"observation": np.full((2, 5), 9, np.float32), "action_mask": np.ones((2, 4), bool)})
    assert len(builder) == 0
    assert traj.rewards.dtype == np.float32 and traj.terminals[1, 1]
    np.testing.assert_array_equal(traj.observations()["observation"][0, :, 0], [0, 1, 2])
    np.testing.assert_array_equal(traj.actions("agent")[1], [1, 2, 3])
    assert traj.infos()["lives"].shape == (2, 3)
    assert traj.next_observations()["observation"][0, 0] == 9


def test_builder_rejects_wrong_batch_and_changing_keys():
    builder = TrajectoryBuilder(batch_size=2, unroll_len=4)
    with pytest.raises(TrajectoryError, match="batch_size"):
        builder.add(np.zeros((3, 4)), {"agent": AgentStep(np.zeros(3))}, np.zeros(3), np.zeros(3), np.zeros(3))
    builder.add(np.zeros((2, 4)), {"agent": AgentStep(np.zeros(2))}, np.zeros(2), np.zeros(2), np.zeros(2))
    with pytest.raises(TrajectoryError, match="keys changed"):
        builder.add(np.zeros((2, 4)), {"agent": AgentStep(np.zeros(2), {"v": np.zeros(2)})}, np.zeros(2),
                    np.zeros(2), np.zeros(2))
    with pytest.raises(TrajectoryError, match="agent"):
        builder.add(np.zeros((2, 4)), {}, np.zeros(2), np.zeros(2), np.zeros(2))


def test_builder_hidden_state_and_per_env_rows():
    rows = []
    for env in range(3):
        builder = TrajectoryBuilder(batch_size=1, unroll_len=2)
        for _ in range(2):
            builder.add(np.full((1, 2), env, np.float32), {"a": AgentStep(np.zeros(1), hidden_state={"h": np.zeros((1, 8))})},
                        np.zeros(1), np.zeros(1), np.zeros(1))
        rows.append(builder.build(np.zeros((1, 2))))
    traj = Trajectory.concatenate(rows)
    assert traj.batch_size == 3
    assert traj.hidden_state("a")["h"].shape == (3, 2, 8)


def test_the_builder_keeps_a_step_reported_terminated_and_truncated_as_terminated():
    """Gymnasium may report both; the episode terminated, so nothing bootstraps from it."""
    builder = TrajectoryBuilder(batch_size=1, unroll_len=1)
    builder.add(np.zeros((1, 4), np.float32), {"agent": AgentStep(np.zeros(1, np.int64))}, np.ones(1),
                terminals=np.array([True]), truncations=np.array([True]))
    traj = builder.build(np.zeros((1, 4), np.float32))
    assert traj.terminals[0, 0] and not traj.truncations[0, 0]


def test_the_builder_casts_a_next_observation_only_within_its_kind():
    """A final observation that came back float64 for float32 observations is cast; floats are never cut into
    integer observations (0.5 would silently become 0): the segment is refused instead."""
    for next_obs, ok in ((np.full((1, 4), 0.5, np.float64), False), (np.ones((1, 4), np.uint16), True)):
        builder = TrajectoryBuilder(batch_size=1, unroll_len=1)
        builder.add(np.zeros((1, 4), np.uint8), {"agent": AgentStep(np.zeros(1, np.int64))}, np.ones(1),
                    np.zeros(1), np.zeros(1))
        if ok:
            assert builder.build(next_obs).next_observations()["observation"].dtype == np.uint8
        else:
            with pytest.raises(TrajectoryError, match="/next_observations: dtype float64"):
                builder.build(next_obs)
